"""A turn's timeline in the web console, in a real headless browser (docs/operations.md, "Web
console", "Timeline"), against the real broker, a journal worker, an LLM caller and a capability
host, with the scripted model answering with code so that the turn has a script run.

The request page draws the waterfall as server-side SVG from the journal's own timestamps: no
tracing backend runs here. The screenshot lands in `.local/test-output/console/timeline.png`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from schemas.capabilities import SCRIPT_RUN_SETTLED
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_REQUESTED, LLM_REQUEST_SETTLED
from tests.gateway_server import Tokens
from tests.kafka_stack import wait_until
from tests.support.browser import Env, browser, screenshot, sign_in, texts, wait_for
from tests.support.scripted_llm import Reply
from tests.support.scripted_stack import SMALL_HOST, served_stack
from tests.support.tagged_model import SMALL_USAGE, TaggedReplies, script

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

__all__ = ["browser"]  # the shared headless-browser fixture, used here

ROUTER = TaggedReplies()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("timeline")
    tokens = Tokens(root / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-timeline", name="timeline-test")
    with served_stack(root, tokens, ROUTER, partitions=2, capabilities=SMALL_HOST) as served:
        yield Env(served.stack, served.gateway, user, user)


def test_a_requests_timeline_shows_its_hops_and_the_script_run(env: Env, browser: WebDriver) -> None:
    tag = uuid.uuid4().hex[:8]
    ROUTER.on(tag, script("6 * 7"), Reply("It is 42.", usage=SMALL_USAGE))
    agent = env.stack.client.agents.create()
    agent.append({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": f"{tag} compute"}}).wait(timeout=60)

    def done() -> int | None:
        events = env.stack.client.streams.get(agent.path).events()
        runs = [e for e in events if e.type == SCRIPT_RUN_SETTLED]
        answers = [e for e in events if e.type == LLM_REQUEST_SETTLED]
        first = next((e.offset for e in events if e.type == LLM_REQUEST_REQUESTED), None)
        return first if runs and len(answers) >= 2 else None

    request = wait_until(done, 120, "the answer, its script run and the next turn")

    sign_in(browser, env, env.user)
    row = f'tr.agent[data-path="{agent.path}"]'
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the agent's row")
    wait_for(browser, lambda d: not texts(d, "#notice p"), "the console to catch up with the journal")
    browser.get(env.url("/console/agent/request", path=agent.path, offset=request))
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline svg"), "the timeline")
    labels = texts(browser, "#timeline svg g.hop text.label")
    durations = texts(browser, "#timeline svg g.hop text.duration")
    expected = [
        "appended → journaled",
        "journaled → scheduled",
        "scheduled → call started",
        "provider call",
        "answered → journaled",
        "journaled → script started",
        "script run (",
    ]
    assert len(labels) == len(expected) == len(durations), labels
    assert all(d.endswith(" ms") or d.endswith(" s") for d in durations), durations
    for label, prefix in zip(labels, expected, strict=True):
        assert label.startswith(prefix), (label, prefix)
    points = texts(browser, "#timeline table.timeline-points td:first-child")
    assert points[0] == "appended" and points[-1] == "script settled (succeeded)", points
    assert "settled (succeeded)" in points and "call started" in points
    assert browser.find_elements(By.ID, "trace-link") == []  # no Jaeger UI configured
    assert browser.find_elements(By.CSS_SELECTOR, "main script") == []  # drawn by the server
    screenshot(browser, "timeline")
