"""The gateway's tokens file: who may call, with which tier and scope; and the webhook secrets.

    tokens:
      - sha256: 5e88…   # sha256 of the bearer token's text; the token itself is never stored
        tier: user
        scope: ["/agents/**"]
        userId: u-42
    webhooks:
      github: {"12345": "<the installation's webhook secret>"}
      slack: {"T0123": "<the workspace's signing secret>"}

YAML or JSON (JSON is YAML). A Kubernetes Secret mounted as this file is re-read when it changes
(checked at most once a second); a file that no longer parses keeps the previous tokens and is
logged, never the tokens.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from processors.gate import Claims
from schemas.gateway import TokenEntry, TokensFile

log = logging.getLogger("agentstream.gateway")

TOKEN_PREFIX = "ast_"
RELOAD_CHECK_S = 1.0


class TokensFileError(ValueError):
    pass


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def parse_tokens_file(text: str, source: str = "tokens file") -> TokensFile:
    try:
        raw: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise TokensFileError(f"{source} is not YAML or JSON: {error}") from None
    try:
        return TokensFile.model_validate(raw)
    except ValidationError as error:
        # Field and problem only, never the value: a misplaced token or secret must not reach a log.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or '(file)'}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors(include_url=False)
        )
        raise TokensFileError(f"{source}: {problems}") from None


def claims_of(entry: TokenEntry) -> Claims:
    return Claims(
        tier=entry.tier, scope=tuple(entry.scope), agent_path=entry.agentPath, user_id=entry.userId, name=entry.name
    )


class TokenBook:
    """Token hash -> claims, and webhook secrets; follows its file."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._file = TokensFile()
        self._claims: dict[str, Claims] = {}
        if path is not None:
            self._load(path)  # at start-up a bad file is fatal (TokensFileError)

    @classmethod
    def of(cls, file: TokensFile) -> TokenBook:
        book = cls(None)
        book._use(file)
        return book

    def claims(self, token: str) -> Claims | None:
        self._maybe_reload()
        return self._claims.get(hash_token(token))

    def github_secret(self, install: str) -> str | None:
        self._maybe_reload()
        return self._file.webhooks.github.get(install)

    def slack_secret(self, workspace: str) -> str | None:
        self._maybe_reload()
        return self._file.webhooks.slack.get(workspace)

    def _use(self, file: TokensFile) -> None:
        self._file = file
        self._claims = {entry.sha256: claims_of(entry) for entry in file.tokens}

    def _load(self, path: Path) -> None:
        try:
            stat = path.stat()
            text = path.read_text()
        except OSError as error:
            raise TokensFileError(f"cannot read the gateway tokens file {path}: {error.strerror}") from None
        self._use(parse_tokens_file(text, str(path)))
        self._stamp = (stat.st_mtime_ns, stat.st_size)

    def _maybe_reload(self) -> None:
        if self._path is None or time.monotonic() - self._checked < RELOAD_CHECK_S:
            return
        with self._lock:
            self._checked = time.monotonic()
            try:
                stat = os.stat(self._path)
            except OSError:
                return  # mid-swap (Kubernetes replaces the file through a symlink): keep the tokens
            if (stat.st_mtime_ns, stat.st_size) == self._stamp:
                return
            try:
                self._load(self._path)
                log.info("reloaded the gateway tokens file %s (%d tokens)", self._path, len(self._claims))
            except TokensFileError as error:
                log.error("kept the previous tokens: %s", error)


def token_entry_yaml(entry: TokenEntry) -> str:
    """The lines to add under `tokens:` in the tokens file."""
    data = entry.model_dump(exclude_none=True)
    text = yaml.safe_dump([data], sort_keys=False, default_flow_style=None).rstrip()
    return "\n".join("  " + line for line in text.splitlines())
