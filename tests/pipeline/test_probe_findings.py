"""The pure helpers behind the security probe's findings 7 and 9b, without a broker.

tests/e2e/test_probe_findings_kafka.py checks the same findings end to end on the real stack.
"""

from __future__ import annotations

import io
import json
import logging

import orjson
import pytest

from pipeline.cli import agent_verb, fold_verb
from pipeline.logs import RepeatedKafkaFailureFilter, limit_repeated_kafka_failures
from pipeline.terminal import escape_controls, escape_json_controls
from schemas.events import CONTEXT_ADDED, decode_event

# Everything a terminal may obey, one of each kind: OSC (retitle), BEL, CSI (clear), CR, DEL, C1 CSI,
# a bidi override and isolates, NUL, tab and newline.
HOSTILE = "a\x1b]0;pwned\x07b\x1b[2Jc\rd\x7fe\x9b31mf\u202eg\u2066h\u2069i\x00j\tk\nl"
OBEYED = {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def test_escape_controls_writes_every_control_character_visibly() -> None:
    shown = escape_controls(HOSTILE)
    assert shown == "a\\x1b]0;pwned\\x07b\\x1b[2Jc\\rd\\x7fe\\x9b31mf\\u202eg\\u2066h\\u2069i\\x00j\\tk\\nl"
    assert not OBEYED & set(shown)
    every = "".join(sorted(OBEYED))
    assert not OBEYED & set(escape_controls(every))
    assert escape_controls(every).count("\\") == len(every)  # one visible escape each


def test_escape_controls_keeps_layout_where_output_spans_lines_and_printable_text_as_it_is() -> None:
    assert escape_controls(HOSTILE, keep_newlines=True).endswith("i\\x00j\tk\nl")
    assert not (OBEYED - {"\n", "\t"}) & set(escape_controls(HOSTILE, keep_newlines=True))
    for text in ("plain", "naïve café ✓ 日本語 עברית", "back\\slash", ""):
        assert escape_controls(text) == text
        assert escape_controls(text, keep_newlines=True) == text


@pytest.mark.parametrize("dump", [lambda v: json.dumps(v, ensure_ascii=False), lambda v: orjson.dumps(v).decode()])
def test_escape_json_controls_stays_json_that_decodes_to_the_same_text(dump: object) -> None:
    value = {"content": HOSTILE, "nested": [HOSTILE, {"k\u202e": "\\u202e"}]}
    text = escape_json_controls(dump(value))  # type: ignore[operator]
    assert json.loads(text) == value == orjson.loads(text)
    assert not OBEYED & set(text)
    assert "\\u202e" in text and "\\u009b" in text and "\\u007f" in text


def _event(payload_type: str, payload: dict[str, object], offset: int = 3) -> object:
    envelope = {
        "streamPath": "/agents/a1",
        "offset": offset,
        "createdAt": "2026-01-01T00:00:00.000Z",
        "type": payload_type,
        "payload": payload,
    }
    return decode_event(orjson.dumps(envelope))


def test_tail_lines_escape_content_payloads_and_invalid_payload_reasons_with_and_without_colour() -> None:
    context = _event(CONTEXT_ADDED, {"role": "user", "content": HOSTILE})
    other = _event("example.com/custom/noted", {"note": HOSTILE})
    for colour in (False, True):
        for event in (context, other):
            line = agent_verb.event_line(event, colour)
            body = line.removeprefix("\x1b[32m").removeprefix("\x1b[90m").removesuffix("\x1b[0m")
            assert not OBEYED & set(body), repr(line)
            assert "\\u202e" in body
    assert agent_verb.event_line(context).endswith("user: " + escape_controls(HOSTILE))


def test_fold_prints_json_without_raw_controls_and_warns_visibly() -> None:
    line = orjson.dumps(
        {
            "streamPath": "/agents/a1",
            "offset": 1,
            "createdAt": "2026-01-01T00:00:00.000Z",
            "type": CONTEXT_ADDED,
            "payload": {"role": "user", "content": 7, "note": HOSTILE},
        }
    )
    warnings = io.StringIO()
    fold_verb.fold_lines(io.BytesIO(line + b"\n"), None, warnings)
    assert warnings.getvalue() and not (OBEYED - {"\n"}) & set(warnings.getvalue())


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(name: str, message: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args or None, None)


def test_filter_lets_one_failure_of_a_kind_through_per_interval_then_the_count_it_dropped() -> None:
    clock = _Clock()
    limit = RepeatedKafkaFailureFilter(30.0, clock)
    first = _record("aiokafka", "Unable connect to node with id %s: %s", 1, "refused")
    assert limit.filter(first)
    passed = []
    for attempt in range(412):
        clock.now += 0.07
        record = _record("aiokafka", "Unable connect to node with id %s: %s", 1 + attempt % 3, "refused")
        passed.append(limit.filter(record))
    assert not any(passed)  # 28.8 s: still within the interval
    clock.now += 1.5
    summary = _record("aiokafka", "Unable connect to node with id %s: %s", 2, "refused")
    assert limit.filter(summary)
    assert summary.getMessage() == "Unable connect to node with id 2: refused (412 similar in the last 30 s)"
    clock.now += 1
    assert not limit.filter(_record("aiokafka", "Unable connect to node with id %s: %s", 2, "refused"))
    clock.now += 600  # a later outage: its first line at once, with the count of the last one
    again = _record("aiokafka", "Unable connect to node with id %s: %s", 1, "refused")
    assert limit.filter(again) and again.getMessage().endswith("(1 similar in the last 601 s)")


def test_filter_keeps_kinds_and_loggers_apart_and_leaves_everything_else_alone() -> None:
    clock = _Clock()
    limit = RepeatedKafkaFailureFilter(30.0, clock)
    fail = "%s [%s] %s"
    librdkafka = ("FAIL", "rdkafka#consumer-1", "127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed")
    for _ in range(2):
        assert limit.filter(_record("agentstream.kafka", fail, *librdkafka)) is (_ == 0)
        assert limit.filter(_record("aiokafka", "Unable to update metadata from [1]")) is (_ == 0)
        assert limit.filter(_record("aiokafka.consumer.fetcher", "Failed fetch messages")) is (_ == 0)
        # Faust or agentstream's own loggers: limited when the line reads as a failed connection
        assert limit.filter(_record("faust.transport", "x: KafkaConnectionError: closed")) is (_ == 0)
        # ... and never otherwise: these repeat and every one stays
        assert limit.filter(_record("agentstream.journal", "partition %s fenced", 3))
        assert limit.filter(_record("agentstream.journal", "store failed: %s", "disk full"))
        assert limit.filter(_record("aiokafka", "Unable connect to node", level=logging.INFO))
        assert limit.filter(_record("agentstream.caller", "Connection refused", level=logging.DEBUG))
    assert RepeatedKafkaFailureFilter(0, clock).filter(_record("aiokafka", "Unable to update metadata from [1]"))


def test_limit_is_installed_once_on_every_root_handler() -> None:
    root = logging.getLogger()
    handlers = [logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())]
    saved = root.handlers[:]
    root.handlers[:] = handlers
    try:
        limit_repeated_kafka_failures(30.0)
        limit_repeated_kafka_failures(30.0)
        for handler in handlers:
            assert [type(f) for f in handler.filters] == [RepeatedKafkaFailureFilter]
    finally:
        root.handlers[:] = saved
