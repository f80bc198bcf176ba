"""Stream path globs, the one pattern language of token scopes and agent grants.

`**` matches across segments, `*` within one segment, `?` one character of a segment; every other
character matches itself (stream paths contain no glob characters, so a path is also a glob that
matches exactly itself).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable


def in_scope(path: str, globs: Iterable[str]) -> bool:
    return _any_of(globs if type(globs) is tuple else tuple(globs)).fullmatch(path) is not None


@functools.lru_cache(maxsize=1024)
def _any_of(globs: tuple[str, ...]) -> re.Pattern[str]:
    # One pattern per scope or grant list: a token's scope is matched once per appended line.
    if not globs:
        return re.compile("(?!)")  # matches nothing
    return re.compile("|".join(f"(?:{_glob(glob).pattern})" for glob in globs))


@functools.lru_cache(maxsize=4096)
def _glob(glob: str) -> re.Pattern[str]:
    parts: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            parts.append(".*")
            i += 2
        elif glob[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            parts.append("[^/]")
            i += 1
        else:
            parts.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(parts))
