"""A real S3-compatible server for the blob store's tests: s3proxy 2.6.0 (Maven Central
`org.gaul:s3proxy`, fetched by scripts/s3proxy/fetch.sh) on Java, with its filesystem backend in a
temporary directory, on a free loopback port. Started and stopped by the test that needs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from pipeline.settings import REPO_ROOT

VERSION = "2.6.0"
LIBS = REPO_ROOT / ".local" / "s3proxy" / "libs" / VERSION
IDENTITY = "agentstream-test"
CREDENTIAL = "agentstream-test-secret"
BUCKET = "agentstream-blobs"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class S3Proxy:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> S3Proxy:
        subprocess.run([str(REPO_ROOT / "scripts" / "s3proxy" / "fetch.sh")], check=True)  # idempotent
        data = self.root / "data"
        (data / BUCKET).mkdir(parents=True)  # the filesystem backend: a bucket is a directory
        config = self.root / "s3proxy.conf"
        config.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={IDENTITY}\n"
            f"s3proxy.credential={CREDENTIAL}\n"
            "jclouds.provider=filesystem\n"
            f"jclouds.filesystem.basedir={data}\n"
        )
        log = (self.root / "s3proxy.log").open("wb")
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", f"{LIBS}/*", "org.gaul.s3proxy.Main", "--properties", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"s3proxy exited with {self.process.returncode}; see {self.root / 's3proxy.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(
                        f"s3proxy did not listen within 120 s; see {self.root / 's3proxy.log'}"
                    ) from None
                time.sleep(0.2)
        return self

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
