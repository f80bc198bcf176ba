"""Loopback ports for the tests' own servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port free right now; closed again at once, so nothing listens there until a server
    binds it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
