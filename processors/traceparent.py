"""The W3C `traceparent` that Kafka record headers carry (docs/behaviour.md §8): parsing,
formatting and moving it between header lists. Pure: no OpenTelemetry import, no I/O, so the path
taken with tracing off stays a dictionary lookup.

A traceparent is `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`, lower case; an
all-zero trace or span id is invalid. A header that does not parse is ignored, never an error: a
producer's bad header must not stop a command.

Parsed as W3C Trace Context says: version 00 is exactly 55 characters; a later version (any but
`ff`) is read by its first 55 when the header ends there or a `-` follows them, and what comes after
is never looked at. What a process carries on is `carried(value)`: the parsed fields written as
version 00, never the bytes it was given, so the header's size is bounded whoever wrote it (one
60 KB header used to be copied onto every record its batch caused). `tracestate` is not carried.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
LENGTH = 55  # `00-` + 32 + `-` + 16 + `-` + 2: all of version 00, the part of a later one that is read
_HEX = frozenset("0123456789abcdef")
_DASH = (ord("-"), "-")  # value[LENGTH] is an int for bytes, a str for str

Headers = Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None] | None


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def encode(self) -> bytes:
        return encode(self.trace_id, self.span_id, self.flags)


def parse(value: bytes | str | None) -> TraceParent | None:
    """The traceparent `value` names, or None when it is missing or malformed (a new trace starts)."""
    if not value:
        return None
    size = len(value)
    if size < LENGTH or (size > LENGTH and value[LENGTH] not in _DASH):
        return None  # a later version's further fields must follow a dash
    head = value[:LENGTH]  # only these are ever decoded, however long the header
    if isinstance(head, bytes):
        try:
            head = head.decode("ascii")
        except UnicodeDecodeError:
            return None
    version, trace, span, flags = head[:2], head[3:35], head[36:52], head[53:]
    if head[2] != "-" or head[35] != "-" or head[52] != "-":
        return None
    if not set(version + trace + span + flags) <= _HEX or version == "ff" or (version == "00" and size != LENGTH):
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, int(flags, 16))


def encode(trace_id: int, span_id: int, flags: int) -> bytes:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}".encode()


def carried(value: bytes | str | None) -> bytes | None:
    """What a record carries for the traceparent `value`: its fields as version 00 (55 bytes), None
    when it does not parse. Never the given bytes: W3C has a process that knows version 00 write
    version 00, and a later version's further fields are dropped."""
    parsed = parse(value)
    return None if parsed is None else parsed.encode()


def trace_id_hex(value: bytes | str | None) -> str | None:
    """The 32 hex digits of the trace a traceparent belongs to (how trace backends name it)."""
    parsed = parse(value)
    return None if parsed is None else f"{parsed.trace_id:032x}"


def from_headers(headers: Headers) -> bytes | None:
    """The traceparent of a record's headers (a list of pairs, as Kafka clients give them, or a
    dict) as `carried` gives it; None when absent or malformed."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        value = headers.get(TRACEPARENT)
        return carried(value) if isinstance(value, bytes) else None
    for name, value in headers:
        if name == TRACEPARENT and isinstance(value, bytes):
            return carried(value)
    return None


def with_traceparent(headers: list[tuple[str, bytes]] | None, value: bytes | None) -> list[tuple[str, bytes]]:
    """`headers` with its traceparent set to `value` (replaced, never doubled); unchanged if None."""
    kept = [(name, v) for name, v in headers or () if name != TRACEPARENT]
    if value is not None:
        kept.append((TRACEPARENT, value))
    return kept
