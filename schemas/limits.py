"""What the journal accepts at all, whatever the event type: path grammar, numbers and size.

These rules protect every stream from every other one and keep one bad record from stopping a
partition (docs/behaviour.md, "What the journal accepts"):

- a stream path is `/` followed by segments joined by `/`; a segment is 1-128 characters of
  `A-Z a-z 0-9 . _ ~ : @ + -` and is neither `.` nor `..`; the whole path is at most 512
  characters. No NUL, control, bidi or whitespace character can appear, so a path can never
  forge a storage-key separator or a fake header line;
- a payload nests at most 128 levels deep;
- numbers are interoperable: integers within -2^63 ... 2^64-1 (kept exactly: webhook ids beyond
  2^53 are real data) and finite floats only;
- a command is at most `maxEventBytes` of UTF-8 JSON (checked where the bytes are known: the
  client before producing, the journal worker on receipt).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, Field

MAX_PATH_CHARS = 512
MAX_SEGMENT_CHARS = 128
DEFAULT_MAX_EVENT_BYTES = 900 * 1024
MAX_APPEND_ID_CHARS = 128
MAX_JSON_DEPTH = 128  # below the JSON parsers' own recursion limits, so the error is ours and clear
INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1

_PATH = re.compile(r"(?:/[A-Za-z0-9._~:@+\-]{1,128})+")
PATH_RULE = (
    "a stream path is '/' followed by segments joined by '/', each 1-128 characters of "
    "A-Z a-z 0-9 . _ ~ : @ + - and not '.' or '..', at most 512 characters (e.g. /agents/support-7)"
)


def path_problem(path: str) -> str | None:
    """Why `path` is not a valid stream path (None: it is)."""
    if len(path) > MAX_PATH_CHARS:
        return f"stream path is {len(path)} characters, over {MAX_PATH_CHARS}"
    if _PATH.fullmatch(path) is None:
        return f"invalid stream path {_shown(path)}: {PATH_RULE}"
    if any(segment in (".", "..") for segment in path.split("/")):
        return f"invalid stream path {_shown(path)}: '.' and '..' segments are not allowed"
    return None


_VALID_PATHS: set[str] = set()  # paths seen valid: a stream's commands repeat its path


def _check_path(path: str) -> str:
    if path in _VALID_PATHS:
        return path
    problem = path_problem(path)
    if problem is not None:
        raise ValueError(problem)
    if len(_VALID_PATHS) >= 100_000:
        _VALID_PATHS.clear()
    _VALID_PATHS.add(path)
    return path


def _shown(text: str, limit: int = 80) -> str:
    shown = repr(text)  # escapes NUL, newlines and bidi controls, so the message stays one line
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


StreamPath = Annotated[str, Field(strict=True), AfterValidator(_check_path)]


def number_problem(value: Any) -> str | None:
    """Where `value` (a decoded JSON value) holds a number outside the interoperable range.

    Iterative, so a deeply nested value cannot exhaust the interpreter's stack; the location is
    worked out only for the (rare) bad value.
    """
    if _numbers_fine(value):  # every payload of every command is checked: the common answer first
        return None
    return _first_problem(value)


def _first_problem(value: Any) -> str | None:
    """The problem `number_problem` reports: the first one found depth first, children last to first."""
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if depth >= MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels; flatten the payload"
            children = node.values() if kind is dict else node
            stack.extend((child, depth + 1) for child in children if type(child) in _CHECKED)
        elif kind is int:
            if not INT_MIN <= node <= INT_MAX:
                return _describe(value, node)
        elif kind is float and not math.isfinite(node):
            return _describe(value, node)
    return None


_CHECKED = frozenset({dict, list, int, float})


def _numbers_fine(value: Any) -> bool:
    """True when `_first_problem` finds nothing, decided level by level without its stack of
    (node, depth) pairs; False sends the caller to that walk, which names the problem it finds
    first. Visits exactly the nodes that walk visits (tests/schemas/test_fast_paths.py holds the
    two to the same answers)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        if depth >= MAX_JSON_DEPTH:
            return False
        below: list[Any] = []
        for node in level:
            for child in node.values() if type(node) is dict else node:
                kind = type(child)
                if kind is str:
                    continue
                if kind is dict or kind is list:
                    below.append(child)
                elif kind is int:
                    if not INT_MIN <= child <= INT_MAX:
                        return False
                elif kind is float and not math.isfinite(child):
                    return False
        level = below
        depth += 1
    if type(value) is int:
        return INT_MIN <= value <= INT_MAX
    return not (type(value) is float and not math.isfinite(value))


_CONTAINERS = frozenset({dict, list})


def _describe(value: Any, bad: Any) -> str:
    where = _locate(value, bad, "") or "(value)"
    if isinstance(bad, int):
        digits = len(str(abs(bad)))
        return (
            f"{where}: integer of {digits} digits is outside the interoperable range -2^63..2^64-1; send it as a string"
        )
    return f"{where}: {bad!r} is not a finite number; JSON numbers must be finite"


def _locate(node: Any, bad: Any, where: str) -> str | None:
    stack: list[tuple[Any, str]] = [(node, where)]
    while stack:
        current, at = stack.pop()
        if current is bad:
            return at
        if type(current) is dict:
            stack.extend((child, f"{at}.{key}" if at else str(key)) for key, child in current.items())
        elif type(current) is list:
            stack.extend((child, f"{at}[{index}]") for index, child in enumerate(current))
    return None


def _check_numbers(value: dict[str, Any]) -> dict[str, Any]:
    problem = number_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


# Any JSON object whose numbers are interoperable: the payload of every event type.
JsonObject = Annotated[dict[str, Any], AfterValidator(_check_numbers)]

# A client's id for one logical append (commands and their outcomes).
AppendId = Annotated[str, Field(min_length=1, max_length=MAX_APPEND_ID_CHARS)]
