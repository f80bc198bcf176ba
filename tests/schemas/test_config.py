"""Agent configuration (docs/behaviour.md §4.7): the table's defaults and allowed values, each at its
edge, as `agent/configured` carries them; a patch deep-merges (objects recurse, scalars replace).
"""

from __future__ import annotations

from typing import Any

import pytest

from schemas.config import AgentConfig, ConfigPatch, merge_config
from schemas.events import AGENT_CONFIGURED, parse_consumed_input

# field (a path into the config), the smallest or largest allowed value, the nearest refused value
EDGES: list[tuple[tuple[str, ...], Any, Any]] = [
    (("llmRequestDebounceMs",), 0, -1),
    (("llmRequestExpiryMs",), 1, 0),
    (("llmRequestRetryPolicy", "maxAttempts"), 1, 0),
    (("llmRequestRetryPolicy", "backoffBaseMs"), 0, -1),
    (("llmRequestRetryPolicy", "backoffMaxMs"), 0, -1),
    (("maxAutonomousTurns",), 0, -1),
    (("compactionTriggerFraction",), 1, 0),
    (("compactionTriggerFraction",), 1.0, 1.0001),
    (("scriptResultHistoryLimit",), 0, -1),
    (("scriptTimeoutMs",), 1, 0),
]


def patch_of(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    patch: Any = value
    for name in reversed(path):
        patch = {name: patch}
    return patch


def configured(patch: dict[str, Any]) -> Any:
    return parse_consumed_input({"type": AGENT_CONFIGURED, "payload": {"config": patch}})


def test_4_7_every_default_of_the_table() -> None:
    assert AgentConfig().model_dump() == {
        "llm": {"model": None},
        "llmRequestDebounceMs": 250,
        "llmRequestExpiryMs": 600_000,
        "llmRequestRetryPolicy": {"maxAttempts": 3, "backoffBaseMs": 10_000, "backoffMaxMs": 60_000},
        "maxAutonomousTurns": 100,
        "compactionTriggerFraction": 0.5,
        "scriptResultHistoryLimit": 30_000,
        "scriptTimeoutMs": 30_000,
        "grants": {"read": None, "send": None, "subscribe": None},
    }


@pytest.mark.parametrize(("path", "allowed", "refused"), EDGES)
def test_4_7_each_allowed_range_holds_at_its_edge(path: tuple[str, ...], allowed: Any, refused: Any) -> None:
    """§4.7 "allowed": integers ≥ 0 or ≥ 1, `compactionTriggerFraction` in (0, 1]."""
    config = merge_config(AgentConfig(), configured(patch_of(path, allowed)).payload.config).model_dump()
    for name in path:
        config = config[name]
    assert config == allowed
    with pytest.raises(ValueError, match=path[-1]):
        configured(patch_of(path, refused))


def test_4_7_a_patch_deep_merges_objects_and_replaces_scalars_and_arrays() -> None:
    """§4.7: "objects recurse, scalars and arrays replace"."""
    first = merge_config(
        AgentConfig(),
        ConfigPatch.model_validate(
            {"llmRequestRetryPolicy": {"backoffBaseMs": 5}, "grants": {"send": ["/agents/x/*", "/agents/y/*"]}}
        ),
    )
    second = merge_config(
        first, ConfigPatch.model_validate({"llmRequestRetryPolicy": {"maxAttempts": 7}, "grants": {"send": ["/a"]}})
    )
    assert second.llmRequestRetryPolicy.model_dump() == {"maxAttempts": 7, "backoffBaseMs": 5, "backoffMaxMs": 60_000}
    assert second.grants.model_dump() == {"read": None, "send": ["/a"], "subscribe": None}


@pytest.mark.parametrize("patch", [{"llmRequestDebounceMs": None}, {"llmRequestRetryPolicy": {"maxAttempts": None}}])
def test_4_7_null_is_not_a_value(patch: dict[str, Any]) -> None:
    """§4.7: "Unknown keys make the event invalid, and so does `null`"."""
    with pytest.raises(ValueError, match="must not be null"):
        configured(patch)
