"""An NDJSON batch's produce and Kafka's answers, without a broker (docs/behaviour.md §7.2): a line
is answered as accepted only once Kafka acknowledged its command. A stand-in producer takes each
topic's records at once or refuses some (its queue full), then reports each delivery from another
thread, as librdkafka's poll thread does; each line's answer must name what became of it, whether
the batch went in one call per topic or (with a traceparent header to send) one call per record."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import orjson
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import tracing
from pipeline.gateway.app import _batch
from pipeline.gateway.commands import Limits
from pipeline.gateway.kafka import Acknowledgements, CommandProducer, Saturated
from pipeline.gateway.service import Gateway
from pipeline.settings import Settings
from processors.gate import Claims
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from topics.names import topic_names

TOPICS = topic_names("t-")
PLATFORM = Claims("platform", ("/**",))


class Delivered:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def fate(value: bytes) -> str:
    """What the stand-in does with a record: its content says (`ok`, `refuse` or `fail`)."""
    for kind in ("refuse", "fail"):
        if f'"{kind}-'.encode() in value:
            return kind
    return "ok"


class StandInProducer:
    """`CommandProducer`'s batch side: records refused at once carry `_error` (or raise Saturated,
    one at a time); taken records are reported on a thread of their own, failed or acknowledged."""

    reachable = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.produced: list[tuple[str, bytes, bytes, bytes | None]] = []
        self.reporters: list[threading.Thread] = []

    def acknowledgements(self) -> Acknowledgements:
        return Acknowledgements(self.loop)

    def submit_batch(self, acks: Acknowledgements, topic: str, records: list[dict[str, Any]]) -> int:
        taken = []
        for record in records:
            if fate(record["value"]) == "refuse":
                record["_error"] = KafkaError(KafkaError._QUEUE_FULL, "Local: Queue full")
            else:
                taken.append(record["value"])
                self.produced.append((topic, record["key"], record["value"], None))
        acks.expected += len(taken)
        self._report(acks, taken)
        return len(taken)

    def submit_into(
        self, acks: Acknowledgements, topic: str, key: bytes, value: bytes, traceparent: bytes | None = None
    ) -> None:
        if fate(value) == "refuse":
            raise Saturated("the gateway's producer queue is full")
        self.produced.append((topic, key, value, traceparent))
        acks.expected += 1
        self._report(acks, [value])

    def _report(self, acks: Acknowledgements, values: list[bytes]) -> None:
        def poll_thread() -> None:
            for value in values:
                error = KafkaError(KafkaError._MSG_TIMED_OUT, "timed out") if fate(value) == "fail" else None
                acks.report(error, Delivered(value))

        thread = threading.Thread(target=poll_thread)
        thread.start()
        self.reporters.append(thread)


class NoResults:
    def expect(self, append_id: str) -> Any:
        raise AssertionError("not waiting")

    def forget(self, append_id: str) -> None:
        pass


def gateway(producer: StandInProducer) -> Gateway:
    return Gateway(
        settings=Settings(),
        tokens=None,  # type: ignore[arg-type]
        topics=TOPICS,
        producer=producer,  # type: ignore[arg-type]
        results=NoResults(),  # type: ignore[arg-type]
        limits=Limits(max_event_bytes=2_000, max_user_file_bytes=1 << 20),
    )


def line(kind: str, n: int) -> bytes:
    """A plain item, a settled request (to the internal topic), or a line the gate refuses."""
    if kind == "internal":
        payload = {"requestOffset": n, "result": {"status": "failed", "errorMessage": "x"}}
        return orjson.dumps({"streamPath": f"/agents/a{n % 3}", "type": LLM_REQUEST_SETTLED, "payload": payload})
    if kind == "bad":
        return b'{"streamPath": "no-slash", "type": "x", "payload": {}}'
    return orjson.dumps(
        {
            "streamPath": f"/agents/a{n % 3}",
            "type": CONTEXT_ADDED,
            "payload": {"role": "user", "content": f"{kind}-{n}"},
        }
    )


KINDS = st.sampled_from(["ok", "ok", "refuse", "fail", "internal", "bad"])


@settings(max_examples=150, deadline=None)
@given(st.lists(KINDS, max_size=12), st.booleans())
def test_7_2_each_line_answers_what_kafka_did_with_its_command(kinds: list[str], traced: bool) -> None:
    lines = [(number, line(kind, number)) for number, kind in enumerate(kinds, 1)]

    async def scenario() -> tuple[dict[str, Any], StandInProducer]:
        producer = StandInProducer(asyncio.get_running_loop())
        token = tracing.PARENT.set(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" if traced else None)
        try:
            answer = await asyncio.wait_for(_batch(gateway(producer), PLATFORM, lines, wait=False), 5)
        finally:
            tracing.PARENT.reset(token)
        for thread in producer.reporters:
            thread.join()
        return orjson.loads(answer), producer

    answer, producer = asyncio.run(scenario())
    results = answer["results"]
    assert [result["line"] for result in results] == [number for number, _ in lines]
    for kind, result in zip(kinds, results, strict=True):
        expected = {"ok": None, "internal": None, "refuse": 429, "fail": 503, "bad": 400}[kind]
        assert result.get("status") == expected, (kind, result)
        if kind == "fail":
            assert result["detail"].startswith("Kafka did not acknowledge the command"), result
    assert answer["failed"] == sum(kind in ("refuse", "fail", "bad") for kind in kinds)
    # Every line taken went to its topic, in line order there, with the header only when traced:
    # an accepted line's append id is its record's.
    by_line = {result["line"]: result.get("appendId") for result in results}
    taken = [
        (number, kind) for (number, _), kind in zip(lines, kinds, strict=True) if kind in ("ok", "fail", "internal")
    ]
    for topic, kinds_there in ((TOPICS.appends, ("ok", "fail")), (TOPICS.internal_appends, ("internal",))):
        sent = [value for sent_topic, _, value, _ in producer.produced if sent_topic == topic]
        expected_lines = [(number, kind) for number, kind in taken if kind in kinds_there]
        assert len(sent) == len(expected_lines)
        for value, (number, kind) in zip(sent, expected_lines, strict=True):
            assert fate(value) == ("fail" if kind == "fail" else "ok")
            if kind != "fail":
                assert orjson.loads(value)["appendId"] == by_line[number]
    assert all((header is not None) == traced for *_, header in producer.produced)


def test_7_2_through_librdkafka_every_record_kafka_never_acknowledges_is_named_by_its_value() -> None:
    """The real client with nothing listening: each record produced in one call times out, and its
    delivery report, on the producer's poll thread, names it to the tally."""
    with socket.socket() as probe:  # a free port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    settings = Settings.from_env({}, bootstrap_servers=f"127.0.0.1:{dead}", gateway_delivery_timeout_s=0.3)
    producer = CommandProducer(settings, TOPICS)
    values = [b'{"appendId":"%d"}' % n for n in range(5)]

    async def scenario() -> dict[bytes, Any]:
        producer._loop = asyncio.get_running_loop()
        producer._reachable = True  # as the probe would find a live broker; its thread is not started
        acks = producer.acknowledgements()
        records = [{"key": b"/agents/a", "value": value} for value in values]
        assert producer.submit_batch(acks, TOPICS.appends, records) == len(values)
        producer._threads[0].start()  # the poll thread, after the produce: it learns the broker is down
        acks.seal()
        await asyncio.wait_for(acks.done, 30)
        return acks.failures()

    try:
        failures = asyncio.run(scenario())
    finally:
        producer._stop.set()
        producer._threads[0].join(5)
        producer._producer.purge()
    assert sorted(failures) == values
    assert all(str(error).startswith("Kafka did not acknowledge the command") for error in failures.values())
