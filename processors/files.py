"""Files the model sees (docs/behaviour.md §3.3): pure decisions, no I/O.

- `sniff_content_type`: what a file is, from its bytes alone (a client's claim is never asked);
- `sanitise_filename`: a display name with no path, no control characters, a bounded length;
- `render_files`: a request's messages as sent to the provider, each item's files turned into
  content parts (images, PDFs), fenced text or hint lines, within the request's byte budget;
- `wanted_blobs`: which blobs `render_files` could use, so the caller fetches only those.

The bytes themselves come from the blob store by content address (`blobs/sha256/<hex>`), fetched by
the caller before it calls `render_files`: the same request renders to the same bytes every time.
"""

from __future__ import annotations

import base64
import codecs
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import orjson
import yaml

from processors.scripts import fence
from schemas.requests import Message

BLOB_PREFIX = "blobs/sha256/"
FILE_URL_PREFIX = "/v1/files/sha256/"
_HEX = re.compile(r"[0-9a-f]{64}")

# What a model may declare it takes (settings: `llm_file_inputs`, defaults per transport).
FileInput = Literal["image", "pdf", "text"]
FILE_INPUTS: tuple[FileInput, ...] = get_args(FileInput)
TRANSPORT_INPUTS: dict[str, frozenset[FileInput]] = {
    "openai": frozenset({"image", "pdf", "text"}),
    "openai-compatible": frozenset({"text"}),
}

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
PDF_TYPE = "application/pdf"
TEXT_TYPES = frozenset({"text/plain", "text/csv", "application/json", "application/yaml"})
OCTET_STREAM = "application/octet-stream"
TEXT_INLINE_MAX_BYTES = 64 * 1024  # a text file up to this size is inlined as a fenced block
SNIFF_BYTES = TEXT_INLINE_MAX_BYTES  # how much of a file the sniffer reads
FILENAME_MAX_CHARS = 128


def blob_path(hex_digest: str) -> str:
    return BLOB_PREFIX + hex_digest


def file_url(hex_digest: str) -> str:
    return FILE_URL_PREFIX + hex_digest


def is_sha256_hex(text: str) -> bool:
    return _HEX.fullmatch(text) is not None


def blob_hex(path: str) -> str | None:
    """The content address of an attachment's `path` (`blobs/sha256/<hex>`), else None."""
    if path.startswith(BLOB_PREFIX) and is_sha256_hex(path[len(BLOB_PREFIX) :]):
        return path[len(BLOB_PREFIX) :]
    return None


# --- what a file is ------------------------------------------------------------------------------

# Magic numbers of the types the model can take, and of the archives we recognise (and never open).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", PDF_TYPE),
    (b"PK\x03\x04", "application/zip"),
    (b"PK\x05\x06", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
)
# C0 controls other than tab, newline, form feed, carriage return and escape (ANSI colours in logs).
_BINARY_CONTROLS = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}
_YAML_LINE = re.compile(r"(?:[A-Za-z_][\w .-]*:(?:\s|$)|- |#|\s)")


def sniff_content_type(head: bytes, complete: bool) -> str:
    """The content type of a file whose first bytes are `head` (`complete`: `head` is the whole file).

    Images (PNG, JPEG, GIF, WebP) and PDF by magic number; UTF-8 text without binary control
    characters as JSON, YAML, CSV or plain text; anything else `application/octet-stream` (ZIP and
    gzip are named, never opened)."""
    for magic, content_type in _MAGIC:
        if head.startswith(magic):
            return content_type
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    text = _utf8_text(head, complete)
    if text is None:
        return OCTET_STREAM
    return _text_type(text, complete)


def _utf8_text(head: bytes, complete: bool) -> str | None:
    """`head` decoded as UTF-8 text, or None when it is not text. A multi-byte character cut at the
    end of an incomplete head is not held against it."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    try:
        text = decoder.decode(head, final=complete)
    except UnicodeDecodeError:
        return None
    if any(ord(char) in _BINARY_CONTROLS for char in text if ord(char) < 0x20):
        return None
    return text


def _text_type(text: str, complete: bool) -> str:
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        if not complete:
            return "application/json"
        try:
            orjson.loads(stripped)
            return "application/json"
        except orjson.JSONDecodeError:
            pass
    if stripped.startswith(("---\n", "---\r\n", "%YAML")) or _looks_like_yaml(text, complete):
        return "application/yaml"
    if _looks_like_csv(text):
        return "text/csv"
    return "text/plain"


def _looks_like_yaml(text: str, complete: bool) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    if not complete or len(lines) < 2 or not all(_YAML_LINE.match(line) for line in lines):
        return False
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    return isinstance(loaded, dict) and len(loaded) >= 2


def _looks_like_csv(text: str) -> bool:
    lines = [line for line in text.splitlines()[:20] if line.strip()]
    if len(lines) < 2:
        return False
    commas = lines[0].count(",")
    return commas > 0 and all(line.count(",") == commas for line in lines[1:-1] or lines[1:])


def file_kind(content_type: str) -> FileInput | None:
    """The input a content type needs from the model, None for one no model takes."""
    if content_type in IMAGE_TYPES:
        return "image"
    if content_type == PDF_TYPE:
        return "pdf"
    if content_type in TEXT_TYPES or content_type.startswith("text/"):
        return "text"
    return None


# --- names ---------------------------------------------------------------------------------------


def sanitise_filename(raw: str | None) -> str:
    """A display name from a client's filename: the last path segment (either slash), Unicode NFC,
    no control or format characters (bidirectional overrides included), no leading dots, at most
    `FILENAME_MAX_CHARS` characters keeping the extension; `file` when nothing is left."""
    name = unicodedata.normalize("NFC", raw or "")
    name = re.split(r"[/\\]", name)[-1]
    name = "".join(char for char in name if unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp"))
    name = name.strip().lstrip(".").strip()
    if len(name) > FILENAME_MAX_CHARS:
        stem, dot, extension = name.rpartition(".")
        if dot and stem and len(extension) <= 16:
            name = stem[: FILENAME_MAX_CHARS - len(extension) - 1].rstrip() + "." + extension
        else:
            name = name[:FILENAME_MAX_CHARS].rstrip()
    return name or "file"


# --- rendering -----------------------------------------------------------------------------------


def hint_line(file: Mapping[str, Any], unavailable: bool = False) -> str:
    """`[attached file: <filename> (<contentType>, <size> bytes) <url>]`, `(unavailable)` before the
    bracket when its bytes could not be had."""
    name = file.get("filename") or file.get("path") or "file"
    kind = file.get("contentType") or "unknown type"
    size = file.get("size")
    url = file.get("url") or file.get("path") or ""
    size_text = f", {size} bytes" if isinstance(size, int) and not isinstance(size, bool) else ""
    missing = " (unavailable)" if unavailable else ""
    return f"[attached file: {name} ({kind}{size_text}) {url}".rstrip() + missing + "]"


def text_block(file: Mapping[str, Any], text: str) -> str:
    """An inlined text file: a label line naming it, then its text in a fence."""
    return f"[file: {file.get('filename') or 'file'}]\n{fence(text)}"


@dataclass(frozen=True, slots=True)
class _Slot:
    """One attachment of one message: where it is and how it renders now."""

    message: int
    file: Mapping[str, Any]
    form: Literal["part", "text", "hint", "unavailable"]
    value: Any = None  # the part (dict) or the text


def _takes_parts(role: str) -> bool:
    # Chat APIs take image and file parts in user messages only: elsewhere a file is a hint line.
    return role == "user"


def _budget_fits(size: int, budget: int | None) -> bool:
    """Whether a file of `size` bytes could fit at all (base64 takes 4 bytes for 3)."""
    return budget is None or (size + 2) // 3 * 4 <= budget


def wanted_blobs(messages: Sequence[Message], inputs: frozenset[FileInput], budget: int | None) -> list[str]:
    """Content addresses `render_files` could use: attachments whose declared type the model takes
    (in a message that can carry it), small enough for the budget. In order, each once."""
    wanted: dict[str, None] = {}
    for message in messages:
        for file in message.files or ():
            hex_digest = blob_hex(str(file.get("path", "")))
            if hex_digest is None or hex_digest in wanted:
                continue
            kind = file_kind(str(file.get("contentType", "")))
            size = file.get("size")
            if kind is None or kind not in inputs or not isinstance(size, int):
                continue
            if kind == "text":
                if size <= TEXT_INLINE_MAX_BYTES and _budget_fits(size, budget):
                    wanted[hex_digest] = None
            elif _takes_parts(message.role) and _budget_fits(size, budget):
                wanted[hex_digest] = None
    return list(wanted)


def _data_url(content_type: str, data: bytes) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode('ascii')}"


def _slot(
    index: int, role: str, file: Mapping[str, Any], blobs: Mapping[str, bytes | None], inputs: frozenset[FileInput]
) -> _Slot:
    hex_digest = blob_hex(str(file.get("path", "")))
    if hex_digest is None or hex_digest not in blobs:
        return _Slot(index, file, "hint")
    data = blobs[hex_digest]
    if data is None:
        return _Slot(index, file, "unavailable")
    content_type = sniff_content_type(data[:SNIFF_BYTES], len(data) <= SNIFF_BYTES)  # the bytes, not the claim
    kind = file_kind(content_type)
    if kind is None or kind not in inputs:
        return _Slot(index, file, "hint")
    if kind == "text":
        if len(data) > TEXT_INLINE_MAX_BYTES:
            return _Slot(index, file, "hint")
        return _Slot(index, file, "text", text_block(file, data.decode("utf-8-sig")))
    if not _takes_parts(role):
        return _Slot(index, file, "hint")
    if kind == "image":
        return _Slot(index, file, "part", {"type": "image_url", "image_url": {"url": _data_url(content_type, data)}})
    filename = str(file.get("filename") or "file.pdf")
    return _Slot(
        index, file, "part", {"type": "file", "file": {"filename": filename, "file_data": _data_url(PDF_TYPE, data)}}
    )


def _content(message: Message, slots: list[_Slot]) -> str | list[dict[str, Any]]:
    """A message's content: its text with the text blocks and hint lines of its files, followed by
    its parts. Without parts, the text alone (a plain string: text-only servers read strings only)."""
    lines = [message.content]
    parts: list[dict[str, Any]] = []
    for slot in slots:
        if slot.form == "part":
            parts.append(slot.value)
        elif slot.form == "text":
            lines.append(slot.value)
        else:
            lines.append(hint_line(slot.file, unavailable=slot.form == "unavailable"))
    text = "\n".join(lines)
    if not parts:
        return text
    return [{"type": "text", "text": text}, *parts]


def _sent(message: Message, slots: list[_Slot]) -> dict[str, Any]:
    return {"role": message.role, "content": _content(message, slots)}


def render_files(
    messages: Sequence[Message],
    blobs: Mapping[str, bytes | None],
    inputs: frozenset[FileInput],
    budget: int | None,
) -> list[dict[str, Any]]:
    """The messages as sent to the provider (docs/behaviour.md §3.3).

    `blobs`: bytes by content address for the blobs fetched (None: the store has no such blob, or
    not the bytes the address names); an attachment whose blob was not fetched renders as a hint.
    A message without files is `{role, content}` exactly as recorded. `budget`: bytes of the whole
    messages array as JSON (None: unlimited); over it, the newest files fall back to hint lines
    first. The same arguments always give the same bytes."""
    slots: list[list[_Slot]] = []
    for index, message in enumerate(messages):
        slots.append([_slot(index, message.role, file, blobs, inputs) for file in message.files or ()])
    sent = [_sent(message, message_slots) for message, message_slots in zip(messages, slots, strict=True)]
    if budget is None:
        return sent
    sizes = [len(orjson.dumps(message)) + 1 for message in sent]
    total = sum(sizes) + 1
    for index, position in _newest_first(slots):
        if total <= budget:
            break
        slots[index][position] = _Slot(index, slots[index][position].file, "hint")
        sent[index] = _sent(messages[index], slots[index])
        size = len(orjson.dumps(sent[index])) + 1
        total += size - sizes[index]
        sizes[index] = size
    return sent


def _newest_first(slots: list[list[_Slot]]) -> Iterator[tuple[int, int]]:
    """Positions of the files that carry bytes (parts, text blocks), newest first."""
    for index in range(len(slots) - 1, -1, -1):
        for position in range(len(slots[index]) - 1, -1, -1):
            if slots[index][position].form in ("part", "text"):
                yield index, position
