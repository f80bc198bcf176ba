"""Reading a multipart upload (docs/behaviour.md §3.3): the `file` field streamed to a spool file,
hashed and counted as it arrives, refused as soon as it passes the size limit. Never buffered whole,
never decompressed. Small text fields beside it (the console's form) are kept in memory, bounded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import Request
from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header

from pipeline.gateway.commands import Problem
from processors.files import SNIFF_BYTES

FILE_FIELD = "file"
MAX_FIELDS = 16
MAX_PART_HEADERS = 8


class UploadRefused(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.detail)
        self.problem = problem


@dataclass
class SpooledFile:
    """The `file` field as received: where it is spooled, its sha256, size, first bytes and name."""

    path: Path
    sha256: str
    size: int
    head: bytes
    filename: str | None

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    file: SpooledFile | None = None

    def discard(self) -> None:
        if self.file is not None:
            self.file.discard()


def too_large(size: int, limit: int) -> Problem:
    return Problem(
        413, "too_large", f"the file is {size} bytes or more; this token may upload files of at most {limit} bytes"
    )


def _boundary(request: Request) -> bytes:
    kind, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise UploadRefused(
            Problem(400, "invalid_request", "send multipart/form-data with the file in a field named 'file'")
        )
    return boundary


def _filename(disposition: dict[bytes, bytes]) -> str | None:
    extended = disposition.get(b"filename*")  # RFC 5987: UTF-8''name%20with%20spaces
    if extended is not None:
        from urllib.parse import unquote

        _, _, encoded = extended.decode("latin-1").partition("''")
        return unquote(encoded, errors="replace")
    plain = disposition.get(b"filename")
    return None if plain is None else plain.decode("utf-8", errors="replace")


class _Receiver:
    """python-multipart callbacks: one part at a time, the file to disk, other fields to memory."""

    def __init__(self, spool: Path, file_limit: int, field_limit: int) -> None:
        self.spool = spool
        self.file_limit = file_limit
        self.field_limit = field_limit
        self.upload = Upload()
        self._header_name = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._filename: str | None = None
        self._buffer = bytearray()
        self._out: BinaryIO | None = None
        self._out_path: Path | None = None
        self._hash: Any = None
        self._size = 0
        self._head = bytearray()
        self._parts = 0

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._field,
            "on_header_value": self._value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
            "on_part_data": self._data,
            "on_part_end": self._part_end,
        }

    def _begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_FIELDS:
            raise UploadRefused(Problem(400, "invalid_request", f"more than {MAX_FIELDS} form fields"))
        self._headers, self._header_name, self._header_value = {}, b"", b""
        self._name, self._filename, self._buffer = None, None, bytearray()

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_name.lower()] = self._header_value
        self._header_name, self._header_value = b"", b""

    def _headers_done(self) -> None:
        _, disposition = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._name = disposition.get(b"name", b"").decode("utf-8", errors="replace")
        if self._name == FILE_FIELD:
            if self.upload.file is not None or self._out is not None:
                raise UploadRefused(Problem(400, "invalid_request", "send one file per upload"))
            self._filename = _filename(disposition)
            fd, name = tempfile.mkstemp(dir=self.spool, prefix="upload-")
            self._out, self._out_path = os.fdopen(fd, "wb"), Path(name)
            self._hash, self._size, self._head = hashlib.sha256(), 0, bytearray()

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._out is not None:
            self._size += len(chunk)
            if self._size > self.file_limit:
                raise UploadRefused(too_large(self._size, self.file_limit))
            self._hash.update(chunk)
            if len(self._head) < SNIFF_BYTES:
                self._head += chunk[: SNIFF_BYTES - len(self._head)]
            self._out.write(chunk)
            return
        self._buffer += chunk
        if len(self._buffer) > self.field_limit:
            detail = f"form field {self._name!r} is over {self.field_limit} bytes"
            raise UploadRefused(Problem(413, "too_large", detail))

    def _part_end(self) -> None:
        if self._out is not None:
            assert self._out_path is not None
            self._out.close()
            self.upload.file = SpooledFile(
                self._out_path, self._hash.hexdigest(), self._size, bytes(self._head), self._filename
            )
            self._out = self._out_path = None
        elif self._name:
            self.upload.fields[self._name] = self._buffer.decode("utf-8", errors="replace")

    def abort(self) -> None:
        if self._out is not None:
            self._out.close()
        if self._out_path is not None:
            self._out_path.unlink(missing_ok=True)
        self.upload.discard()


async def receive_upload(request: Request, spool: Path, file_limit: int, field_limit: int) -> Upload:
    """Read a multipart body: the `file` field spooled under `spool` (at most `file_limit` bytes),
    other fields in memory (each at most `field_limit` bytes). Raises `UploadRefused`; the caller
    discards the upload's spool file when done."""
    boundary = _boundary(request)
    declared = request.headers.get("content-length")
    # The multipart framing adds a little; a body declared far over the limit is refused unread.
    if declared is not None and declared.isdigit() and int(declared) > file_limit + MAX_FIELDS * field_limit + 65536:
        raise UploadRefused(too_large(int(declared), file_limit))
    receiver = _Receiver(spool, file_limit, field_limit)
    parser = MultipartParser(boundary, receiver.callbacks(), max_header_count=MAX_PART_HEADERS)
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except UploadRefused:
        receiver.abort()
        raise
    except Exception as error:  # a malformed body
        receiver.abort()
        raise UploadRefused(Problem(400, "invalid_request", f"the multipart body is malformed: {error}")) from None
    if receiver._out is not None:  # the body ended inside the file part
        receiver.abort()
        raise UploadRefused(Problem(400, "invalid_request", "the multipart body ended inside the file"))
    return receiver.upload
