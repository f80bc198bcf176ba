"""Small real files for the tests of files the model sees (docs/behaviour.md §3.3), made here."""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib


def png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (200, 30, 30), *, noise: bool = False) -> bytes:
    """A valid RGB PNG of one colour (`noise`: random pixels, which do not compress)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + (os.urandom(3 * width) if noise else bytes(rgb) * width) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def pdf(text: str = "hello") -> bytes:
    """A minimal one-page PDF."""
    return (
        b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
        b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
        b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\n"
        + f"% {text}\n".encode()
        + b"trailer<</Root 1 0 R>>\n%%EOF\n"
    )


def zip_bomb(megabytes: int = 20) -> bytes:
    """A ZIP archive of `megabytes` MiB of zeros: a few KiB compressed."""
    out = io.BytesIO()
    archive = zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9)
    with archive, archive.open("zeros.bin", "w", force_zip64=True) as member:
        block = bytes(1024 * 1024)
        for _ in range(megabytes):
            member.write(block)
    return out.getvalue()


def multipart(
    filename: str, data: bytes, content_type: str = "application/octet-stream", **fields: str
) -> tuple[bytes, str]:
    """A multipart/form-data body with the file in the field `file`, and its Content-Type header."""
    boundary = "agentstream-test-boundary-7f3a"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n".encode()
        + data
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"
