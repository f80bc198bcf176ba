"""The fault harness's network: one namespace per host on a bridge, with addresses it assigns.

Every host (a broker, a journal worker, the caller, the gateway) runs in its own network namespace
`agentstream-fault-<harness pid>-<host>`, joined to the bridge `afb<pid>` by a veth pair whose root
end is `af<pid>-<n>`. The harness itself stays in the root namespace on the bridge's address, so it
reaches every host, and every host reaches the others. A partition takes a host's root end down
(nothing in or out); healing brings it up again. A host may also get a second, private link to the
root namespace (the gateway's public side), which a partition of its cluster link leaves up.

Names carry the harness's pid: a later run deletes the namespaces and links of runs whose harness
is gone (killed before its cleanup), never those of a run still going.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field

PREFIX = "agentstream-fault-"


class NetworkUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, no veth or bridge support)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def namespaces() -> list[str]:
    result = ip("netns", "list", check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_namespace(name: str) -> None:
    """SIGKILL every process left in namespace `name`, then delete it."""
    pids = ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGCONT)  # a stopped process would not die before it runs again
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "delete", name, check=False)


def clean_stale() -> list[str]:
    """Delete the namespaces and bridges of earlier runs whose harness process is gone."""
    removed: list[str] = []
    for name in namespaces():
        match = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if match and not _alive(int(match.group(1))):
            kill_namespace(name)
            removed.append(name)
    links = ip("-o", "link", "show", check=False).stdout
    for match in re.finditer(r"^\d+: (afb?(\d+)[^:@]*)[:@]", links, re.MULTILINE):
        if not _alive(int(match.group(2))):
            ip("link", "delete", match.group(1), check=False)
            removed.append(match.group(1))
    return removed


def check_available() -> None:
    """Raise NetworkUnavailable with the reason when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("the fault harness needs root (it creates network namespaces)")
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        ip("netns", "add", probe)
        ip("link", "add", f"afp{os.getpid()}", "type", "veth", "peer", "name", f"afq{os.getpid()}")
        ip("link", "delete", f"afp{os.getpid()}")
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as error:
        raise NetworkUnavailable(f"cannot create network namespaces or veth pairs: {error}") from None
    finally:
        ip("netns", "delete", probe, check=False)


@dataclass
class Host:
    name: str  # short: b1, j1, c1, g1
    namespace: str
    address: str  # on the bridge
    link: str  # the root end of its bridge veth: down = partitioned
    public_address: str | None = None  # the host's end of its private link to the root namespace
    cut: bool = False

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class Network:
    """The bridge and the hosts of one harness run."""

    tag: str = field(default_factory=lambda: str(os.getpid()))
    subnet: str = ""
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    gateway_address: str = ""  # the root namespace's address on the bridge

    def __post_init__(self) -> None:
        octet = int(self.tag) % 200 + 20
        self.subnet = f"10.213.{octet}"
        self.public_subnet = f"10.214.{octet}"
        self.bridge = f"afb{self.tag}"
        self.gateway_address = f"{self.subnet}.1"

    def create(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, public: bool = False) -> Host:
        index = len(self.hosts) + 1
        namespace = f"{PREFIX}{self.tag}-{name}"
        link = f"af{self.tag}-{index}"
        inner = f"af{self.tag}i{index}"
        address = f"{self.subnet}.{10 + index}"
        ip("netns", "add", namespace)
        ip("link", "add", link, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", namespace)
        ip("link", "set", link, "master", self.bridge)
        ip("link", "set", link, "up")
        ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
        ip("-n", namespace, "link", "set", inner, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        host = Host(name, namespace, address, link)
        if public:
            # A point-to-point link of its own: the harness reaches the host while its cluster link is down.
            outer, peer = f"af{self.tag}p{index}", f"af{self.tag}q{index}"
            base = 4 * index
            ip("link", "add", outer, "type", "veth", "peer", "name", peer)
            ip("link", "set", peer, "netns", namespace)
            ip("addr", "add", f"{self.public_subnet}.{base + 1}/30", "dev", outer)
            ip("link", "set", outer, "up")
            ip("-n", namespace, "addr", "add", f"{self.public_subnet}.{base + 2}/30", "dev", peer)
            ip("-n", namespace, "link", "set", peer, "up")
            host.public_address = f"{self.public_subnet}.{base + 2}"
        self.hosts[name] = host
        return host

    def partition(self, host: Host) -> None:
        ip("link", "set", host.link, "down")
        host.cut = True

    def heal(self, host: Host) -> None:
        ip("link", "set", host.link, "up")
        host.cut = False

    def destroy(self) -> None:
        for host in self.hosts.values():
            kill_namespace(host.namespace)
        ip("link", "delete", self.bridge, check=False)
        for line in ip("-o", "link", "show", check=False).stdout.splitlines():
            match = re.match(rf"\d+: (af{self.tag}[pq-]\w*)[:@]", line)
            if match:
                ip("link", "delete", match.group(1), check=False)
        self.hosts.clear()
