"""Files on the gateway (docs/behaviour.md §3.3): upload to a stream, read back by content address.

    POST /v1/streams/{path}/files   multipart, field `file` → 201 FileAttachment
    GET  /v1/files/sha256/{hex}     the bytes, to a token whose scope covers a stream it was uploaded to

An upload passes the gate a command to that stream would (scope, the tier's streams: 403 naming
the rule), then the tier's size limit (413, checked while the bytes arrive), then its type, sniffed
from the bytes (415 for a user token and a type no model takes). The bytes go to the blob store once
per content; every upload records its stream as a reader of the blob. The console uses the same
steps (`store_upload`, `readable`).
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import Response

from pipeline.blobs import BlobStore, BlobStoreError
from pipeline.gateway import metrics
from pipeline.gateway.commands import Problem
from pipeline.gateway.service import ApiError, Gateway, json_response
from pipeline.gateway.uploads import SpooledFile, Upload, UploadRefused, receive_upload
from processors.files import (
    IMAGE_TYPES,
    PDF_TYPE,
    SNIFF_BYTES,
    blob_path,
    file_kind,
    file_url,
    is_sha256_hex,
    sanitise_filename,
    sniff_content_type,
)
from processors.gate import Claims, admit_upload
from processors.globs import in_scope
from schemas.context import FileAttachment
from schemas.gateway import ErrorBody
from schemas.limits import path_problem

FIELD_LIMIT_BYTES = 64 * 1024
USER_TYPES_TEXT = "images (PNG, JPEG, GIF, WebP), PDF, or UTF-8 text (plain, JSON, YAML, CSV)"


def file_problem(error: Exception) -> Problem:
    return Problem(503, "blob_store_unavailable", f"{error}; retry shortly")


def upload_gate(claims: Claims, stream_path: str) -> Problem | None:
    problem = path_problem(stream_path)
    if problem is not None:
        return Problem(400, "invalid_stream_path", problem)
    refused = admit_upload(claims, stream_path)
    if refused is not None:
        metrics.REFUSALS.labels(refused.rule).inc()
        return Problem(403, "forbidden", refused.detail, refused.rule)
    return None


async def receive(request: Request, claims: Claims, gateway: Gateway, store: BlobStore) -> Upload:
    """The multipart body within the tier's limit, or ApiError (400, 413)."""
    spool = await asyncio.to_thread(store.temp_dir)
    try:
        return await receive_upload(request, spool, gateway.settings.max_file_bytes(claims.tier), FIELD_LIMIT_BYTES)
    except UploadRefused as refused:
        if refused.problem.status == 413:
            metrics.REFUSALS.labels("size").inc()
        raise ApiError(refused.problem) from None


async def store_upload(store: BlobStore, claims: Claims, stream_path: str, spooled: SpooledFile) -> FileAttachment:
    """Check the received file's type, store its bytes once, record the stream as a reader, and
    answer its attachment. Raises ApiError (400 empty, 415 a type the tier may not upload, 503)."""
    if spooled.size == 0:
        raise ApiError(Problem(400, "empty_file", "the file is empty"))
    content_type = sniff_content_type(spooled.head, spooled.size <= SNIFF_BYTES)
    if claims.tier == "user" and file_kind(content_type) is None:
        metrics.REFUSALS.labels("file-type").inc()
        raise ApiError(
            Problem(
                415,
                "unsupported_media_type",
                f"the bytes are {content_type}, which no model reads; a user token may upload {USER_TYPES_TEXT}",
            )
        )
    try:
        await asyncio.to_thread(store.put_file, spooled.sha256, spooled.path)
        await asyncio.to_thread(store.add_ref, spooled.sha256, stream_path)
    except (BlobStoreError, OSError) as error:
        raise ApiError(file_problem(error)) from None
    return FileAttachment(
        contentType=content_type,
        filename=sanitise_filename(spooled.filename),
        path=blob_path(spooled.sha256),
        size=spooled.size,
        url=file_url(spooled.sha256),
    )


async def readable(store: BlobStore, scope: tuple[str, ...], hex_digest: str) -> bytes | None:
    """The blob's bytes when a stream it was uploaded to is within `scope`, else None (whether the
    blob exists is not told to a token that may not read it)."""
    if not is_sha256_hex(hex_digest):
        return None
    try:
        streams = await asyncio.to_thread(store.refs, hex_digest)
        if not any(in_scope(stream, scope) for stream in streams):
            return None
        return await asyncio.to_thread(store.get, hex_digest)
    except (BlobStoreError, OSError) as error:
        raise ApiError(file_problem(error)) from None


async def blob_readers(store: BlobStore, digests: list[str]) -> dict[str, list[str]]:
    """The streams each blob was uploaded to: what the append gate checks an item's attachments
    against (docs/behaviour.md §3.3), so that an item attaches only what its token could GET.
    Raises ApiError (503) while the store cannot answer."""
    if not digests:
        return {}
    try:
        return await asyncio.to_thread(lambda: {digest: store.refs(digest) for digest in digests})
    except (BlobStoreError, OSError) as error:
        raise ApiError(file_problem(error)) from None


def file_response(data: bytes, hex_digest: str) -> Response:
    """The bytes with their sniffed type; never rendered as a page of this origin."""
    content_type = sniff_content_type(data[:SNIFF_BYTES], len(data) <= SNIFF_BYTES)
    inline = content_type in IMAGE_TYPES or content_type == PDF_TYPE
    media_type = f"{content_type}; charset=utf-8" if file_kind(content_type) == "text" else content_type
    return Response(
        data,
        media_type=media_type,
        headers={
            "content-disposition": f'{"inline" if inline else "attachment"}; filename="{hex_digest[:16]}"',
            "x-content-type-options": "nosniff",
            "content-security-policy": "default-src 'none'; sandbox",
            "cache-control": "private, max-age=3600",
            "etag": f'"{hex_digest}"',
        },
    )


def not_readable(hex_digest: str) -> ApiError:
    return ApiError(
        Problem(
            404,
            "not_found",
            f"no file sha256/{hex_digest[:64]} readable with this token: it was not uploaded to a stream in its scope",
        )
    )


def add_file_routes(app: FastAPI, gateway: Gateway, store: BlobStore) -> None:
    errors: dict[int | str, dict[str, object]] = {
        status: {"model": ErrorBody} for status in (400, 401, 403, 404, 413, 415, 503)
    }

    @app.post(
        "/v1/streams/{path:path}/files",
        status_code=201,
        response_model=FileAttachment,
        responses=errors,
        tags=["files"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {"file": {"type": "string", "format": "binary"}},
                            "required": ["file"],
                        }
                    }
                },
            }
        },
    )
    async def upload_file(path: str, request: Request) -> Response:
        """Upload one file (multipart, field `file`) for items of the stream `/{path}`.

        201 with the `FileAttachment` to put in an item's `files`: the type sniffed from the bytes,
        the filename sanitised, `path` `blobs/sha256/<hex>`, `url` `/v1/files/sha256/<hex>`.
        The same bytes are stored once, however often they are uploaded."""
        claims = gateway.authenticate(request)
        stream_path = "/" + path
        problem = upload_gate(claims, stream_path)
        if problem is not None:
            raise ApiError(problem)
        upload = await receive(request, claims, gateway, store)
        try:
            if upload.file is None:
                raise ApiError(Problem(400, "invalid_request", "the form has no field named 'file'"))
            attachment = await store_upload(store, claims, stream_path, upload.file)
        finally:
            await asyncio.to_thread(upload.discard)
        return json_response(attachment, 201)

    @app.get(
        "/v1/files/sha256/{hex_digest}",
        response_class=Response,
        responses={**errors, 200: {"content": {"application/octet-stream": {}}}},
        tags=["files"],
    )
    async def read_file(hex_digest: str, request: Request) -> Response:
        """The bytes of a file uploaded to a stream within this token's scope (else 404)."""
        claims = gateway.authenticate(request)
        data = await readable(store, claims.scope, hex_digest)
        if data is None:
            raise not_readable(hex_digest)
        return file_response(data, hex_digest)
