"""Waits until the local broker answers a metadata request (used by start.sh).

Usage: wait_ready.py BOOTSTRAP PID TIMEOUT_S
Exit 0 when ready, 1 on timeout, 2 when the broker process died.
Uses confluent-kafka when importable (the project venv), else a plain TCP connect.
"""

import os
import socket
import sys
import time


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child is not alive either.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def tcp_ok(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def main() -> int:
    bootstrap, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        AdminClient = None

    admin = None
    while time.monotonic() < deadline:
        if not alive(pid):
            return 2
        if tcp_ok(host, int(port)):
            if AdminClient is None:
                return 0
            if admin is None:
                # log_level 0: librdkafka would otherwise log every refused connection.
                admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers:
                    return 0
            except Exception:  # KafkaException while the broker is still starting
                pass
        time.sleep(0.25)
    return 1


if __name__ == "__main__":
    sys.exit(main())
