"""The web console in a real headless browser (Debian's chromium driven through its chromedriver),
against the real broker, a real journal worker and LLM caller, and the scripted model.

The browser signs in with a bearer token, opens the agents page and an agent, sends a message and
sees the scripted model's answer arrive without a reload, opens the request view with its cached
prefix shaded, and shows a message made of markup as text. A token outside the scope sees nothing.
The talk box attaches an image, which the journal and the projection show as a thumbnail.
Screenshots of the main pages land in `.local/test-output/console/` (AGENTSTREAM_TEST_OUTPUT
overrides the folder) for review.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from pipeline.client import Agent
from pipeline.gateway.console.mirror import JournalMirror
from pipeline.gateway.console.views import journal_page
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.gateway_server import Tokens
from tests.kafka_stack import wait_until
from tests.support.browser import Env, browser, screenshot, sign_in, texts, wait_for
from tests.support.files import png
from tests.support.scripted_stack import served_stack

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

__all__ = ["browser"]  # the shared headless-browser fixture, used here

MARKUP = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("console")
    tokens = Tokens(root / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-console", name="console-test")
    outsider = tokens.add("user", "/agents/team-a/*", name="outsider")
    with served_stack(root, tokens, partitions=2, gateway={"gateway_wait_timeout_s": 90.0}) as served:
        yield Env(served.stack, served.gateway, user, outsider)


def journal_texts(driver: WebDriver) -> list[str]:
    return texts(driver, "tbody#journal tr.event td.summary summary")


def settled(agent: Agent, env: Env, count: int) -> bool:
    events = env.stack.client.streams.get(agent.path).events()
    return sum(e.type == LLM_REQUEST_SETTLED for e in events) >= count


def test_console_in_a_browser_watch_talk_requests_and_scope(env: Env, browser: WebDriver) -> None:
    agent = env.stack.client.agents.create()
    first = {"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "hello from the CLI"}}
    agent.append(first).wait(timeout=60)
    wait_until(lambda: settled(agent, env, 1), 120, "the first turn")

    # The agents page: the agent is listed with its status, live.
    sign_in(browser, env, env.user)
    row = f'tr.agent[data-path="{agent.path}"]'
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the agent's row")
    assert "idle" in browser.find_element(By.CSS_SELECTOR, row).text
    wait_for(browser, lambda d: not texts(d, "#notice p"), "the console to catch up with the journal")
    screenshot(browser, "agents")

    # An agent: send a message; the scripted model's answer arrives without a reload.
    browser.execute_script("document.querySelector(arguments[0]).click();", f"{row} a")  # rows refresh live
    wait_for(browser, lambda d: d.find_elements(By.ID, "say"), "the agent page")
    assert any("hello from the CLI" in text for text in journal_texts(browser))
    browser.execute_script("window.consoleTestMarker = 'same page';")
    browser.find_element(By.CSS_SELECTOR, "#say textarea").send_keys("hello console")
    Select(browser.find_element(By.CSS_SELECTOR, "#say select[name=policy]")).select_by_value("after-current-request")
    browser.find_element(By.ID, "send").click()
    wait_for(
        browser,
        lambda d: any(t.startswith("assistant: ok:") and "hello console" in t for t in journal_texts(d)),
        "the scripted answer in the journal",
    )
    assert browser.execute_script("return window.consoleTestMarker") == "same page", "the page reloaded"
    wait_for(browser, lambda d: d.find_element(By.ID, "agent-status").text == "idle", "the turn to settle")
    screenshot(browser, "agent")

    # Markup in a message is text: no script element, no alert, the characters shown as typed.
    browser.find_element(By.CSS_SELECTOR, "#say textarea").send_keys(MARKUP)
    browser.find_element(By.ID, "send").click()
    wait_for(browser, lambda d: any(MARKUP in t for t in journal_texts(d)), "the markup message as text")
    wait_for(
        browser, lambda d: any(t.startswith("assistant: ok:") and MARKUP in t for t in journal_texts(d)), "its answer"
    )
    assert browser.find_elements(By.CSS_SELECTOR, "main script") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert MARKUP not in browser.page_source  # escaped in the HTML itself, never raw
    wait_until(lambda: settled(agent, env, 3), 60, "the third turn")

    # The projection as the model will see it.
    browser.get(env.url("/console/agent/projection", path=agent.path))
    items = texts(browser, "article.item")
    assert items and "agent/system-prompt" in items[0] and "system → system" in items[0]
    assert any(MARKUP in item and "user → user" in item for item in items)
    screenshot(browser, "projection")

    # The latest request as the model saw it, the prefix shared with the request before it shaded.
    browser.get(env.url("/console/agent/requests", path=agent.path))
    links = browser.execute_script(
        "return [...document.querySelectorAll('tbody#requests a')].map((link) => link.href);"
    )
    assert len(links) == 3  # one request per message, newest first
    browser.get(links[0])
    wait_for(browser, lambda d: d.find_elements(By.ID, "cache-summary"), "the request view")
    assert "byte-identical prefix of request" in browser.find_element(By.ID, "cache-summary").text
    messages = texts(browser, "article.message pre")
    shaded = texts(browser, "article.message pre span.cached")
    # Protocol, system prompt, both earlier messages and the first answer are reused; the newest
    # answer stands where the previous request's timestamp stood, so the prefix ends there.
    assert len(shaded) == 5 and len(messages) == 8
    assert "hello from the CLI" in shaded[2] and "hello console" in shaded[4]
    assert MARKUP in messages[6] and not any("Current date and time" in text for text in shaded)
    screenshot(browser, "request")

    # A token outside the scope sees nothing, not even that the agent exists.
    sign_in(browser, env, env.outsider)
    assert browser.find_elements(By.CSS_SELECTOR, "tr.agent") == []
    assert "No streams in your token's scope" in browser.find_element(By.ID, "agents").text
    browser.get(env.url("/console/agent", path=agent.path))
    assert "no stream with this path in your token's scope" in browser.find_element(By.ID, "error-detail").text
    assert agent.path not in browser.find_element(By.TAG_NAME, "main").text
    screenshot(browser, "outside-scope")


def test_3_3_console_attaches_an_image_and_shows_its_thumbnail(env: Env, browser: WebDriver, tmp_path: Path) -> None:
    """§3.3 in the console: the talk box attaches a file; the journal and the projection show the
    image as a thumbnail (served by the console under its strict policy) and link it."""
    agent = env.stack.client.agents.create()
    image = tmp_path / "red square.png"
    image.write_bytes(png(48, 48, (220, 40, 40)))
    sign_in(browser, env, env.user)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr.agent[data-path="{agent.path}"]'), "the agent")
    browser.get(env.url("/console/agent", path=agent.path))
    wait_for(browser, lambda d: d.find_elements(By.ID, "attach"), "the talk box's file input")
    browser.execute_script("window.consoleTestMarker = 'same page';")
    browser.find_element(By.ID, "attach").send_keys(str(image))
    browser.find_element(By.CSS_SELECTOR, "#say textarea").send_keys("what colour is this?")
    browser.find_element(By.ID, "send").click()
    thumbnail = "tbody#journal tr.kind-user td.summary img.thumb"
    wait_for(
        browser,
        lambda d: (
            d.execute_script(
                "const img = document.querySelector(arguments[0]); return img && img.complete && img.naturalWidth;",
                thumbnail,
            )
            == 48
        ),
        "the image's thumbnail in the journal",
    )
    assert browser.execute_script("return window.consoleTestMarker") == "same page", "the page reloaded"
    link = browser.find_element(By.CSS_SELECTOR, "tbody#journal tr.kind-user td.summary a.file")
    assert link.text == "red square.png"
    assert link.get_attribute("href").startswith(env.base + "/console/files/sha256/")
    assert browser.find_element(By.ID, "attach").get_attribute("value") == ""  # cleared after sending
    wait_for(
        browser,
        lambda d: any(t.startswith("assistant: ok:") and "what colour" in t for t in journal_texts(d)),
        "the answer (the text-only model gets the hint line)",
    )
    screenshot(browser, "attach")
    events = env.stack.client.streams.get(agent.path).events()
    (item,) = [e for e in events if e.type == CONTEXT_ADDED and e.payload.files]
    assert item.payload.files[0].contentType == "image/png" and item.payload.files[0].filename == "red square.png"

    browser.get(env.url("/console/agent/projection", path=agent.path))
    wait_for(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "article.item img.thumb"), "the projection's thumbnail"
    )
    screenshot(browser, "attach-projection")

    # Another token's session cannot read the file, even knowing its address.
    href = link_href = item.payload.files[0].url.replace("/v1/files/", "/console/files/")
    sign_in(browser, env, env.outsider)
    browser.get(env.base + href)
    assert "not uploaded to a stream in its scope" in browser.find_element(By.TAG_NAME, "main").text
    assert link_href.endswith(item.payload.files[0].path.rsplit("/", 1)[-1])


def test_console_reads_old_journal_pages_back_from_kafka_by_offset(env: Env) -> None:
    """Long journals stay fast: a page is read by Kafka offset, not by scanning the partition.
    With no record cache at all every event comes back from Kafka, interleaved with another stream."""
    paths = [f"/agents/paging-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    receipts = [
        env.stack.client.streams.get(path).append({"type": "test.console/ping", "payload": {"n": n}})
        for n in range(1, 131)
        for path in paths
    ]
    for receipt in receipts:
        receipt.wait(timeout=60)

    async def read() -> list[Any]:
        mirror = JournalMirror(env.stack.settings, env.stack.client.topics.journal, cache_bytes=0)
        mirror.ensure_started(asyncio.get_running_loop())
        try:
            deadline = time.monotonic() + 60
            while mirror.read(paths[0], lambda entry: entry.state.cursor) != 130:
                assert time.monotonic() < deadline, "the mirror did not fold the stream"
                await asyncio.sleep(0.1)
            page = journal_page(130, 60, 50)
            return await mirror.events(paths[0], list(page.offsets))
        finally:
            await asyncio.to_thread(mirror.close)

    events = asyncio.run(read())
    assert [e.offset for e in events] == list(range(59, 9, -1))
    assert all(e.streamPath == paths[0] and e.payload == {"n": e.offset} for e in events)
