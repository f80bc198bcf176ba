"""The web console in a real headless browser (Debian's chromium driven through its chromedriver):
the browser fixture, signing in, waiting with a screenshot of what the page showed on a timeout,
and the console of a stack's gateway. Screenshots land in `.local/test-output/console/`
(AGENTSTREAM_TEST_OUTPUT overrides the folder)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.gateway_server import GatewayServer
from tests.kafka_stack import REPO, Stack

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
OUTPUT = Path(os.environ.get("AGENTSTREAM_TEST_OUTPUT") or REPO / ".local" / "test-output") / "console"


class Env:
    """The console of `gateway` in front of `stack`, with a token in scope and one outside it."""

    def __init__(self, stack: Stack, gateway: GatewayServer, user: str, outsider: str) -> None:
        self.stack = stack
        self.gateway = gateway
        self.user = user
        self.outsider = outsider
        self.base = f"http://127.0.0.1:{gateway.port}"

    def url(self, route: str, **query: object) -> str:
        return self.base + route + ("?" + urlencode(query) if query else "")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromedriver are missing: run scripts/install.sh", pytrace=False)
    for stale in OUTPUT.glob("failed.*"):
        stale.unlink()  # from an earlier failed run: only this run's pictures stay
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="console-chromium-")
    for flag in (
        "--headless=new",
        "--no-sandbox",  # as root, as in CI
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",  # this machine's network is closed: no calls home
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: WebDriver, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(OUTPUT / f"{name}.png"))


def wait_for(driver: WebDriver, condition: object, what: str, timeout: float = 90) -> object:
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(
            lambda d: condition(d),  # type: ignore[operator]
            message=f"waiting for {what}",
        )
    except TimeoutException:
        screenshot(driver, "failed")  # what the browser showed, for the failure report
        (OUTPUT / "failed.html").write_text(driver.page_source)
        raise


def sign_in(driver: WebDriver, env: Env, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(env.url("/console/agents"))
    wait_for(driver, lambda d: d.current_url.endswith("/console/login"), "the sign-in form")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    wait_for(driver, lambda d: d.current_url.endswith("/console/agents"), "the agents page")


def texts(driver: WebDriver, css: str) -> list[str]:
    """Text of every element matching `css`, read in one step (live refreshes replace elements)."""
    script = "return [...document.querySelectorAll(arguments[0])].map((element) => element.textContent);"
    return list(driver.execute_script(script, css))
