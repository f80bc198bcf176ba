"""The append gate and the path globs at their edges (docs/behaviour.md §7.2): a user file exactly at
the size limit, and what each glob metacharacter may match.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.settings import Settings
from processors.gate import Admitted, Claims, Refused, admit
from processors.globs import in_scope
from schemas.events import CONTEXT_ADDED, AppendCommand

USER = Claims(tier="user", scope=("/agents/**",), user_id="u-7")


def user_item_with_file(size: int) -> AppendCommand:
    file: dict[str, Any] = {"contentType": "text/plain", "filename": "a.txt", "path": "/f/a", "size": size, "url": "u"}
    payload = {"role": "user", "content": "see the file", "files": [file]}
    return AppendCommand.model_validate({"streamPath": "/agents/a", "type": CONTEXT_ADDED, "payload": payload})


def test_7_2_a_user_file_of_exactly_the_limit_is_admitted_and_one_byte_more_is_refused() -> None:
    """§7.2: a user token's "file over the limit" is refused; the default limit is 25 MiB."""
    assert Settings.from_env({}).gateway_max_user_file_bytes == 26_214_400
    assert isinstance(admit(USER, user_item_with_file(26_214_400)), Admitted)
    refused = admit(USER, user_item_with_file(26_214_401))
    assert isinstance(refused, Refused) and refused.rule == "user-file-size"
    assert isinstance(admit(USER, user_item_with_file(1000), max_user_file_bytes=1000), Admitted)
    assert isinstance(admit(USER, user_item_with_file(1001), max_user_file_bytes=1000), Refused)


@pytest.mark.parametrize(
    ("glob", "path", "inside"),
    [
        ("/agents/a?c", "/agents/abc", True),
        ("/agents/a?c", "/agents/a/c", False),  # `?` is one character of a segment, never a slash
        ("/agents/a?c", "/agents/ac", False),
        ("/agents/*/inbox", "/agents/x/inbox", True),
        ("/agents/*/inbox", "/agents/x/y/inbox", False),  # `*` within one segment
        ("/agents/**/inbox", "/agents/x/y/inbox", True),  # `**` across segments
        ("/agents/a", "/agents/a/b", False),  # a glob matches whole paths, never a prefix
        ("/agents/a", "/agents/ab", False),
        ("/agents/a+b", "/agents/aab", False),  # every other character matches itself
        ("/agents/a+b", "/agents/a+b", True),
    ],
)
def test_7_2_globs_star_is_one_segment_double_star_any_depth_question_mark_one_character(
    glob: str, path: str, inside: bool
) -> None:
    assert in_scope(path, [glob]) is inside
