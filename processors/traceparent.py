"""The W3C `traceparent` that Kafka record headers carry (docs/behaviour.md §8): parsing,
formatting and moving it between header lists. Pure: no OpenTelemetry import, no I/O, so the path
taken with tracing off stays a dictionary lookup.

A traceparent is `00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`, lower case; an
all-zero trace or span id is invalid. A header that does not parse is ignored, never an error: a
producer's bad header must not stop a command.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TRACEPARENT = "traceparent"
_HEX = frozenset("0123456789abcdef")

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
    """The traceparent `value` names, or None when it is missing or malformed."""
    if not value:
        return None
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    parts = text.strip().split("-")
    if len(parts) < 4 or [len(p) for p in parts[:4]] != [2, 32, 16, 2]:
        return None
    if not all(set(p) <= _HEX for p in parts[:4]) or parts[0] == "ff" or (parts[0] == "00" and len(parts) != 4):
        return None
    trace_id, span_id = int(parts[1], 16), int(parts[2], 16)
    if not trace_id or not span_id:
        return None
    return TraceParent(trace_id, span_id, int(parts[3], 16))


def encode(trace_id: int, span_id: int, flags: int) -> bytes:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}".encode()


def trace_id_hex(value: bytes | str | None) -> str | None:
    """The 32 hex digits of the trace a traceparent belongs to (how trace backends name it)."""
    parsed = parse(value)
    return None if parsed is None else f"{parsed.trace_id:032x}"


def from_headers(headers: Headers) -> bytes | None:
    """The raw traceparent of a record's headers (a list of pairs, as Kafka clients give them, or a
    dict); None when absent. The value is not checked here: `parse` does that where it is used."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        value = headers.get(TRACEPARENT)
        return value if isinstance(value, bytes) else None
    for name, value in headers:
        if name == TRACEPARENT and isinstance(value, bytes):
            return value
    return None


def with_traceparent(headers: list[tuple[str, bytes]] | None, value: bytes | None) -> list[tuple[str, bytes]]:
    """`headers` with its traceparent set to `value` (replaced, never doubled); unchanged if None."""
    kept = [(name, v) for name, v in headers or () if name != TRACEPARENT]
    if value is not None:
        kept.append((TRACEPARENT, value))
    return kept
