"""Stream path globs (processors/globs.py), the pattern language of token scopes and grants
(docs/behaviour.md §6.6, §7.2), without a broker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.globs import _glob, in_scope

SEGMENT = st.text(alphabet="ab*?.", min_size=0, max_size=3)
GLOB = st.builds(
    lambda parts, tail: "/" + "/".join(parts) + tail, st.lists(SEGMENT, max_size=3), st.sampled_from(["", "/**", "**"])
)
PATH = st.builds(
    lambda parts: "/" + "/".join(parts), st.lists(st.text(alphabet="ab.", min_size=1, max_size=3), max_size=4)
)


@settings(max_examples=400, deadline=None)
@given(st.lists(GLOB, max_size=4), PATH)
def test_a_path_is_in_a_scope_exactly_when_one_of_its_globs_matches_it_alone(globs: list[str], path: str) -> None:
    alone = [_glob(glob).fullmatch(path) is not None for glob in globs]  # each glob's own pattern
    assert in_scope(path, tuple(globs)) is any(alone)
    assert in_scope(path, globs) is any(alone)  # a list (a grant) as a tuple (a token's scope)


def test_an_empty_scope_holds_no_stream() -> None:
    assert in_scope("/agents/a", ()) is False and in_scope("", []) is False


def test_one_glob_of_several_is_enough_and_each_is_matched_whole() -> None:
    scope = ("/agents/alice/**", "/integrations/*")
    assert in_scope("/agents/alice/a1", scope) and in_scope("/integrations/slack", scope)
    assert not in_scope("/integrations/slack/extra", scope)  # `*` stays within one segment
    assert not in_scope("/agents/alicex/a1", scope) and not in_scope("x/agents/alice/a1", scope)
