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
(checked once a second); a file that no longer parses keeps the previous tokens and is logged. A
file that stays missing or unreadable for longer than the grace period revokes every token: deleting
it is how an operator shuts the door, while a rewrite that replaces it briefly is not.

Problems are reported by line and column, never by the text there: the file holds webhook secrets,
and a misplaced bearer token is a secret too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
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
MISSING_GRACE_S = 5.0  # the default of AGENTSTREAM_GATEWAY_TOKENS_FILE_GRACE_S


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
        raise TokensFileError(f"{source}{_yaml_problem(error)}") from None
    try:
        return TokensFile.model_validate(raw)
    except ValidationError as error:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        problems = "; ".join(_field_problem(root, e) for e in error.errors(include_url=False))
        raise TokensFileError(f"{source}, {problems}") from None


# Field names of the file's shapes: safe to name. Any other key (an installation id, a workspace id,
# an unknown key, or a secret typed where a key belongs) is shown by its position only.
_FIELD_NAMES = frozenset(TokensFile.model_fields) | frozenset(TokenEntry.model_fields) | {"github", "slack"}
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_YAML_TOKEN_NAME = re.compile(r"'<[a-z ]+>'")  # '<block mapping start>': the parser's own words


def _withhold_quoted(text: str) -> str:
    """PyYAML quotes what it found (an alias or a tag name, a character): possibly part of a secret."""

    def shown(found: re.Match[str]) -> str:
        quoted = found.group()
        if quoted == "'\\t'":
            return "a tab"
        punctuation = len(quoted) == 3 and not quoted[1].isalnum()  # "expected ',' or ']'"
        return quoted if punctuation or _YAML_TOKEN_NAME.fullmatch(quoted) else "(withheld)"

    return _QUOTED.sub(shown, text)


def _position(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(error: yaml.YAMLError) -> str:
    """`, line L, column C: what is wrong`; PyYAML's own text would quote the line."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        what = _withhold_quoted(error.problem or error.context or "invalid")
        if error.context and error.problem:
            what += f" ({_withhold_quoted(error.context)}"
            if error.context_mark is not None and error.context_mark is not mark:
                what += f" that starts at {_position(error.context_mark)}"
            what += ")"
        where = f", {_position(mark)}" if mark is not None else ""
        return f"{where}: not valid YAML or JSON: {what}"
    if isinstance(error, yaml.reader.ReaderError):
        return f", character {error.position + 1}: not valid YAML or JSON: a character YAML does not allow"
    return f": not valid YAML or JSON ({type(error).__name__})"


def _field_problem(root: yaml.Node | None, error: Any) -> str:
    """`line L, column C: field.path: message`, without the value or any key that is not a field name."""
    loc = error["loc"]
    path = ".".join(str(p) if isinstance(p, int) or p in _FIELD_NAMES else "<key>" for p in loc) or "the file"
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, str) and len(value) >= 4 and value in message:
        message = message.replace(value, "(withheld)")  # no built-in message should echo it; make sure
    node = _node_at(root, loc)
    where = _position(node.start_mark) if node is not None else "line 1, column 1"
    return f"{where}: {path}: {message}"


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The YAML node a validation error's location points at (the deepest one that exists)."""
    node = root
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = [value for key, value in node.value if isinstance(key, yaml.ScalarNode) and key.value == str(part)]
            if not found:
                break
            node = found[0]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
    return node


def claims_of(entry: TokenEntry) -> Claims:
    return Claims(
        tier=entry.tier, scope=tuple(entry.scope), agent_path=entry.agentPath, user_id=entry.userId, name=entry.name
    )


class TokenBook:
    """Token hash -> claims, and webhook secrets; follows its file."""

    def __init__(self, path: Path | None, missing_grace_s: float = MISSING_GRACE_S) -> None:
        self._path = path
        self._missing_grace_s = missing_grace_s
        self._lock = threading.Lock()
        self._stamp: FileStamp | None = None
        self._failed_stamp: FileStamp | None = None  # a malformed version, reported once
        self._missing_since: float | None = None
        self._revoked = False
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

    def refresh(self) -> None:
        """Check the file now (at most once a second). The gateway calls this every second, so a
        deleted file revokes on time even when no request comes."""
        self._maybe_reload()

    def _use(self, file: TokensFile) -> None:
        self._file = file
        self._claims = {entry.sha256: claims_of(entry) for entry in file.tokens}

    def _load(self, path: Path) -> None:
        try:
            stamp = _stamp(os.stat(path))
            text = path.read_text()
        except OSError as error:
            raise TokensFileError(f"cannot read the gateway tokens file {path}: {error.strerror}") from None
        self._use(parse_tokens_file(text, str(path)))
        self._stamp = stamp

    def _maybe_reload(self) -> None:
        if self._path is None or time.monotonic() - self._checked < RELOAD_CHECK_S:
            return
        with self._lock:
            now = self._checked = time.monotonic()
            try:
                stamp = _stamp(os.stat(self._path))
                if stamp == self._stamp or stamp == self._failed_stamp:
                    self._missing_since = None
                    return
                text = self._path.read_text()
            except OSError as error:
                self._gone(now, error.strerror or type(error).__name__)
                return
            self._missing_since = None
            try:
                file = parse_tokens_file(text, str(self._path))
            except TokensFileError as error:
                self._failed_stamp = stamp
                state = "every token stays revoked" if self._revoked else "kept the previous tokens"
                log.error("%s: %s", state, error)
                return
            self._use(file)
            self._stamp, self._failed_stamp, self._revoked = stamp, None, False
            log.info("reloaded the gateway tokens file %s (%d tokens)", self._path, len(self._claims))

    def _gone(self, now: float, why: str) -> None:
        """The file is missing or unreadable: a rewrite in progress, or a revocation once it lasts."""
        if self._missing_since is None:
            self._missing_since = now
        if self._revoked or now - self._missing_since < self._missing_grace_s:
            return
        self._use(TokensFile())
        self._stamp, self._failed_stamp, self._revoked = None, None, True
        log.error(
            "the gateway tokens file %s is missing or unreadable (%s) for %.0f s: every token and webhook "
            "secret is revoked until it is back",
            self._path,
            why,
            now - self._missing_since,
        )


FileStamp = tuple[int, int, int, int]


def _stamp(stat: os.stat_result) -> FileStamp:
    """What changes when the file is replaced, rewritten or has its permissions changed."""
    return (stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino)


def token_entry_yaml(entry: TokenEntry) -> str:
    """The lines to add under `tokens:` in the tokens file."""
    data = entry.model_dump(exclude_none=True)
    text = yaml.safe_dump([data], sort_keys=False, default_flow_style=None).rstrip()
    return "\n".join("  " + line for line in text.splitlines())
