"""The NDJSON batch's bookkeeping without a broker (docs/behaviour.md §7.2): its answer is the
`BatchResults` model's JSON byte for byte, and one tally of Kafka's acknowledgements answers for
every line produced, naming each line Kafka failed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.gateway.commands import (
    Problem,
    Ready,
    accepted_line,
    batch_answer,
    journaled_line,
    line_error,
)
from pipeline.gateway.kafka import Acknowledgements, _settle_all
from schemas.gateway import BatchLineAccepted, BatchLineError, BatchLineJournaled, BatchResults, Journaled

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ACCEPTED = st.builds(lambda n, path, append_id: ("accepted", n, path, append_id), st.integers(1, 10_000), TEXT, TEXT)
JOURNALED = st.builds(
    lambda n, path, offset, duplicate: ("journaled", n, path, offset, duplicate),
    st.integers(1, 10_000),
    TEXT,
    st.integers(0, 2**63),
    st.booleans(),
)
FAILED = st.builds(
    lambda n, status, error, detail, rule: ("error", n, status, error, detail, rule),
    st.integers(1, 10_000),
    st.sampled_from([400, 403, 413, 429, 503, 504]),
    TEXT,
    TEXT,
    st.one_of(st.none(), TEXT),
)


def as_result(spec: tuple[Any, ...]) -> tuple[dict[str, Any], Any]:
    """The line's result as `_batch` builds it, and the model the answer's schema names."""
    kind, number, *rest = spec
    if kind == "accepted":
        path, append_id = rest
        ready = Ready("t", path.encode(), b"{}", path, append_id)
        return accepted_line(number, ready), BatchLineAccepted(line=number, streamPath=path, appendId=append_id)
    if kind == "journaled":
        path, offset, duplicate = rest
        answer = Journaled(streamPath=path, offset=offset, duplicate=duplicate)
        return journaled_line(number, answer), BatchLineJournaled(line=number, **answer.model_dump())
    status, error, detail, rule = rest
    problem = Problem(status, error, detail, rule)
    model = BatchLineError(line=number, status=status, error=error, detail=detail, rule=rule)
    return line_error(number, problem), model


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ACCEPTED, JOURNALED, FAILED), max_size=12))
def test_7_2_the_batch_answer_is_the_batch_results_model_byte_for_byte(specs: list[tuple[Any, ...]]) -> None:
    results, models = zip(*(as_result(spec) for spec in specs), strict=True) if specs else ((), ())
    failed = sum(isinstance(model, BatchLineError) for model in models)
    expected = BatchResults(accepted=len(models) - failed, failed=failed, results=list(models))
    assert batch_answer(list(results)) == expected.model_dump_json(exclude_none=True).encode()


def test_7_2_an_accepted_line_is_counted_as_accepted_and_an_error_as_failed() -> None:
    ready = Ready("t", b"/agents/a", b"{}", "/agents/a", "id-1")
    answer = orjson.loads(batch_answer([accepted_line(1, ready), line_error(2, Problem(400, "invalid_json", "x"))]))
    assert (answer["accepted"], answer["failed"]) == (1, 1)
    assert answer["results"][0] == {"streamPath": "/agents/a", "appendId": "id-1", "line": 1}
    assert answer["results"][1] == {"error": "invalid_json", "detail": "x", "line": 2, "status": 400}


def kafka_failure() -> KafkaError:
    return KafkaError(KafkaError._MSG_TIMED_OUT, "timed out")


class Record:
    """What a delivery report hands `Acknowledgements.report`: the record, its value readable."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def test_7_2_the_tally_resolves_once_sealed_and_every_record_is_answered() -> None:
    async def scenario() -> None:
        acks = Acknowledgements(asyncio.get_running_loop())
        acks.expected = 3
        acks.report(None, Record(b"a"))
        acks.report(kafka_failure(), Record(b"c"))
        acks.seal()
        assert not acks.done.done()  # the record b"b" is still unanswered
        acks.report(None, Record(b"b"))
        await asyncio.wait_for(acks.done, 1)
        failures = acks.failures()
        assert list(failures) == [b"c"]
        assert str(failures[b"c"]) == "Kafka did not acknowledge the command: timed out"

    asyncio.run(scenario())


def test_7_2_answers_before_the_seal_do_not_resolve_the_tally() -> None:
    async def scenario() -> None:
        acks = Acknowledgements(asyncio.get_running_loop())
        acks.expected = 1
        acks.report(None, Record(b"a"))
        await asyncio.sleep(0)
        assert not acks.done.done()  # more records may still be produced into it
        acks.seal()
        assert acks.done.done() and not acks.failures()

    asyncio.run(scenario())


def test_7_2_a_tally_with_nothing_produced_resolves_at_its_seal() -> None:
    async def scenario() -> None:
        acks = Acknowledgements(asyncio.get_running_loop())
        acks.seal()
        assert acks.done.done()

    asyncio.run(scenario())


def test_7_2_reports_on_the_poll_thread_racing_the_produce_and_the_seal_resolve_the_tally_exactly_at_the_end() -> None:
    """librdkafka reports on the poll thread while the event loop is still producing into the tally
    and sealing it: whichever sees the last answer after the seal resolves it, never before."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        for round_ in range(200):
            acks = Acknowledgements(loop)
            count = 1 + round_ % 7
            reported = threading.Semaphore(0)
            answered: list[int] = []

            def poll_thread(
                acks: Acknowledgements = acks,
                count: int = count,
                reported: threading.Semaphore = reported,
                answered: list[int] = answered,
            ) -> None:
                for n in range(count):
                    reported.acquire()
                    acks.report(kafka_failure() if n == 1 else None, Record(b"%d" % n))
                    answered.append(n)

            thread = threading.Thread(target=poll_thread)
            thread.start()
            for _ in range(count):
                acks.expected += 1
                reported.release()
            acks.seal()
            await asyncio.wait_for(acks.done, 5)
            thread.join()
            assert len(answered) == count and acks._settled == count
            assert list(acks.failures()) == ([b"1"] if count > 1 else [])

    asyncio.run(scenario())


def test_single_record_futures_settle_in_one_hand_over() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        ok, failed, cancelled = loop.create_future(), loop.create_future(), loop.create_future()
        cancelled.cancel()
        _settle_all([(ok, None), (failed, kafka_failure()), (cancelled, None)])
        assert ok.result() is None
        assert str(failed.exception()) == "Kafka did not acknowledge the command: timed out"

    asyncio.run(scenario())
