"""The caller sends files to the model (docs/behaviour.md §3.3), at the HTTP edge: a call record's
messages with attachments, the blobs in a real directory store, the real provider client and the
scripted OpenAI-compatible server, which checks the content parts as the chat API would. No broker."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.blobs import DirectoryBlobStore
from pipeline.caller.calls import Calls, Result
from pipeline.caller.files import FileLoader
from pipeline.caller.provider import Provider
from pipeline.settings import Settings
from processors.files import blob_path, file_url, hint_line
from schemas.context import FileAttachment
from schemas.requests import CallRequest, Message, Transport
from tests.support.files import pdf, png
from tests.support.scripted_llm import ScriptedLLM, content_part_problem

API_KEY = "sk-proj-Files0123456789abcdefXYZ"


@pytest.fixture(scope="module")
def llm() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path) -> DirectoryBlobStore:
    return DirectoryBlobStore(tmp_path / "blobs")


def put(store: DirectoryBlobStore, data: bytes, filename: str, content_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    source = store.temp_dir() / f"src-{digest[:8]}"
    source.write_bytes(data)
    store.put_file(digest, source)
    return attachment(data, filename, content_type)


def attachment(data: bytes, filename: str, content_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    return FileAttachment(
        contentType=content_type, filename=filename, path=blob_path(digest), size=len(data), url=file_url(digest)
    ).model_dump()


def record(transport: Transport, *files: dict[str, Any], model: str = "vision") -> CallRequest:
    return CallRequest(
        kind="call",
        streamPath="/agents/files",
        requestOffset=9,
        model=model,
        transport=transport,
        expiresAt=2**62,
        attempt=1,
        maxAttempts=3,
        messages=[
            Message(role="system", content="protocol"),
            Message(role="user", content="@5 actor=user:web\nwhat is in these?", files=list(files)),
            Message(role="developer", content="Current date and time (UTC): 2026-12-03T10:00:00.000Z"),
        ],
    )


def call(llm: ScriptedLLM, store: DirectoryBlobStore, request: CallRequest, **overrides: Any) -> tuple[Result, Any]:
    settings = Settings.from_env(
        {}, openai_base_url=llm.base_url, openai_api_key=API_KEY, llm_stream=False, **overrides
    )

    async def main() -> Result:
        provider = Provider(settings)
        try:
            calls = Calls(provider, max_in_flight=1, streaming=False, files=FileLoader(store, settings))
            return await calls.call(request, [])
        finally:
            await provider.close()

    before = len(llm.records)
    result = asyncio.run(main())
    (sent,) = llm.records[before:]
    return result, sent.body


def data_url(content_type: str, data: bytes) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode()}"


def test_3_3_an_image_is_an_image_url_part_on_openai(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    """§3.3: on the `openai` transport an image item reaches the model as an image_url part."""
    image = png(8, 8)
    file = put(store, image, "shot.png", "image/png")
    result, body = call(llm, store, record("openai", file))
    assert result.status == "succeeded"
    assert body["messages"][1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "@5 actor=user:web\nwhat is in these?"},
            {"type": "image_url", "image_url": {"url": data_url("image/png", image)}},
        ],
    }
    assert body["messages"][0] == {"role": "system", "content": "protocol"}  # no files: a plain string


def test_3_3_an_image_is_the_hint_line_on_openai_compatible(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    """§3.3: `openai-compatible` takes text only by default: the image is the hint line, a plain string."""
    file = put(store, png(8, 8), "shot.png", "image/png")
    result, body = call(llm, store, record("openai-compatible", file))
    assert result.status == "succeeded"
    assert body["messages"][1] == {
        "role": "user",
        "content": f"@5 actor=user:web\nwhat is in these?\n{hint_line(file)}",
    }


def test_3_3_a_pdf_is_a_file_part_and_a_text_file_a_fenced_block(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    document = pdf("quarterly")
    text = b"total,42\n"
    files = [put(store, document, "q3.pdf", "application/pdf"), put(store, text, "sum.csv", "text/csv")]
    result, body = call(llm, store, record("openai", *files))
    assert result.status == "succeeded"
    assert content_part_problem(body["messages"]) is None
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "@5 actor=user:web\nwhat is in these?\n[file: sum.csv]\n```\ntotal,42\n\n```"},
        {"type": "file", "file": {"filename": "q3.pdf", "file_data": data_url("application/pdf", document)}},
    ]


def test_3_3_retries_of_one_request_send_identical_bytes(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    """§3.3 stability: bytes come by content address, so every send of the request is the same."""
    files = [put(store, png(16, 16), "a.png", "image/png"), put(store, pdf(), "b.pdf", "application/pdf")]
    request = record("openai", *files)
    bodies = [orjson.dumps(call(llm, store, request)[1]) for _ in range(3)]
    assert bodies[0] == bodies[1] == bodies[2]
    assert b'"image_url"' in bodies[0] and b'"file_data"' in bodies[0]


def test_3_3_a_missing_blob_renders_unavailable_and_the_turn_goes_on(
    llm: ScriptedLLM, store: DirectoryBlobStore
) -> None:
    """§3.3: "a missing blob renders the hint line with (unavailable) and the turn goes on"."""
    never_stored = attachment(png(3, 3), "lost.png", "image/png")
    result, body = call(llm, store, record("openai", never_stored))
    assert result.status == "succeeded"
    assert body["messages"][1]["content"] == "@5 actor=user:web\nwhat is in these?\n" + hint_line(
        never_stored, unavailable=True
    )


def test_3_3_a_blob_whose_bytes_do_not_match_its_address_is_unavailable(
    llm: ScriptedLLM, store: DirectoryBlobStore
) -> None:
    image = png(5, 5)
    file = put(store, image, "x.png", "image/png")
    (store.root / file["path"]).write_bytes(png(6, 6))  # the store's copy went bad
    result, body = call(llm, store, record("openai", file))
    assert result.status == "succeeded"
    assert body["messages"][1]["content"].endswith(hint_line(file, unavailable=True))


def test_3_3_file_bytes_count_against_the_models_request_budget(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    """§3.3: over the budget the newest file falls back to its hint line first."""
    old, new = (
        put(store, png(40, 40, noise=True), "old.png", "image/png"),
        put(store, png(40, 40, noise=True), "new.png", "image/png"),
    )
    request = record("openai", old, new)
    _, whole = call(llm, store, request)
    size = len(orjson.dumps(whole["messages"]))
    assert size > 8192
    _, fitted = call(llm, store, request, llm_request_max_bytes=8192)
    content = fitted["messages"][1]["content"]
    if isinstance(content, list):  # the older image may still fit; the newer one never does
        assert [part["type"] for part in content] == ["text", "image_url"]
        assert content[0]["text"].endswith(hint_line(new))
    else:
        assert content.endswith(hint_line(new))
    assert len(orjson.dumps(fitted["messages"])) <= 8192


def test_3_3_the_embedded_model_takes_text_only_even_on_openai(llm: ScriptedLLM, store: DirectoryBlobStore) -> None:
    """The embedded model (smollm2) is text-only: its default declared inputs leave images as hints."""
    file = put(store, png(4, 4), "shot.png", "image/png")
    _, body = call(llm, store, record("openai", file, model="smollm2"))
    assert body["messages"][1]["content"].endswith(hint_line(file))


def test_the_scripted_server_refuses_parts_the_chat_api_refuses() -> None:
    """The check the scripted server makes of what the openai transport sends."""
    good = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "x"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]
    assert content_part_problem(good) is None
    bad_role = [{"role": "system", "content": good[0]["content"]}]
    assert "only allowed in user messages" in (content_part_problem(bad_role) or "")
    bad_url = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert "image data URL" in (content_part_problem(bad_url) or "")
    bad_file = [
        {"role": "user", "content": [{"type": "file", "file": {"file_data": "data:application/pdf;base64,AA=="}}]}
    ]
    assert "filename" in (content_part_problem(bad_file) or "")
