"""The journal worker's Faust web server against the real broker: status only, loopback by default.

Hardening review finding: the server listened on 0.0.0.0:6066 and served every table row
(`/table/rows/<key>/`, every agent's context) without authentication.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from schemas.events import CONTEXT_ADDED
from tests.kafka_stack import Stack, wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def non_loopback_address() -> str | None:
    """An address of this machine other than 127.0.0.0/8 (None if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent by a UDP connect
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack(
        tmp_path_factory.mktemp("web") / "data", partitions=2, worker_port=free_port(), metrics_port=free_port()
    )
    stack.start_worker()
    try:
        yield stack
    finally:
        stack.close()


def test_worker_web_serves_status_but_no_table_rows_on_loopback_only(stack: Stack) -> None:
    web = f"http://127.0.0.1:{stack.settings.worker_port}"

    def up() -> bool:
        try:
            return get(f"{web}/")[0] == 200
        except OSError:
            assert stack.worker is not None and stack.worker.poll() is None, stack.worker_log()[-3000:]
            return False

    wait_until(up, 90, "the journal worker's web server", interval=0.5)
    agent = stack.client.agents.create()
    agent.append({"type": CONTEXT_ADDED, "payload": {"role": "user", "content": "x"}}).wait()

    assert get(f"{web}/") == (200, orjson.dumps({"status": "OK"}))
    for path in ("/table/", "/table/rows/", f"/table/rows/m%00{agent.path}/", "/router/", "/graph/", "/stats/"):
        status, _ = get(web + path)
        assert status == 404, path
    # The chart's probes: /metrics on the metrics port.
    status, body = get(f"http://127.0.0.1:{stack.settings.metrics_port}/metrics")
    assert status == 200 and b"agentstream_fold_seconds" in body

    address = non_loopback_address()
    if address is not None:  # bound to 127.0.0.1: another address of this host gets no answer
        with pytest.raises(ConnectionRefusedError), socket.create_connection((address, stack.settings.worker_port), 2):
            pass
