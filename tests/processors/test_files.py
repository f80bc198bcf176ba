"""Files the model sees, the pure part (docs/behaviour.md §3.3): sniffing, filenames, the upload
gate and rendering files as content parts within the request budget. No broker, no store."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import orjson
import pytest

from pipeline.settings import Settings
from processors import llm_outcomes
from processors.files import (
    FILENAME_MAX_CHARS,
    TEXT_INLINE_MAX_BYTES,
    blob_hex,
    blob_path,
    file_url,
    hint_line,
    render_files,
    sanitise_filename,
    sniff_content_type,
    wanted_blobs,
)
from processors.gate import Claims, admit_upload
from schemas.context import FileAttachment
from schemas.requests import Message
from tests.support.files import pdf, png, zip_bomb

ALL = frozenset({"image", "pdf", "text"})
TEXT_ONLY = frozenset({"text"})


def sniff(data: bytes) -> str:
    return sniff_content_type(data[:TEXT_INLINE_MAX_BYTES], len(data) <= TEXT_INLINE_MAX_BYTES)


def attachment(data: bytes, filename: str, content_type: str | None = None) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    return FileAttachment(
        contentType=content_type or sniff(data),
        filename=filename,
        path=blob_path(digest),
        size=len(data),
        url=file_url(digest),
    ).model_dump()


def blobs_of(*files: bytes) -> dict[str, bytes | None]:
    return {hashlib.sha256(data).hexdigest(): data for data in files}


# --- sniffing: the bytes decide, never the client's claim ----------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (png(), "image/png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(20), "image/jpeg"),
        (b"GIF89a" + bytes(20), "image/gif"),
        (b"GIF87a" + bytes(20), "image/gif"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(20), "image/webp"),
        (pdf(), "application/pdf"),
        (b"hello\nworld\n", "text/plain"),
        (b'{"a": [1, 2]}', "application/json"),
        (b"[1, 2, 3]\n", "application/json"),
        (b"name: agent\nmodel: gpt\nlimits:\n  turns: 3\n", "application/yaml"),
        (b"---\n- a\n- b\n", "application/yaml"),
        (b"id,name,score\n1,ada,3\n2,bob,4\n", "text/csv"),
        ("héllo wörld ✓\n".encode(), "text/plain"),
        (zip_bomb(2), "application/zip"),
        (b"\x1f\x8b\x08\x00" + bytes(20), "application/gzip"),
        (b"\x00\x01\x02\x03binary", "application/octet-stream"),
        (b"\xff\xfe\xfa not utf-8", "application/octet-stream"),
        (b"<html><script>alert(1)</script></html>", "text/plain"),
        (b"{not json", "text/plain"),
    ],
)
def test_3_3_the_content_type_is_sniffed_from_the_bytes(data: bytes, expected: str) -> None:
    """§3.3: "contentType sniffed from the bytes"; HTML is never served as HTML (plain text)."""
    assert sniff(data) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"\x89PNG\r\n\x1a" + bytes(24), "application/octet-stream"),  # 7 of the PNG signature's 8 bytes
        (b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(24), "application/octet-stream"),  # RIFF, but a WAV
        (b"id\tname\tscore\n1\tada\t3\n", "text/plain"),  # tab-separated
        (b"def f():\n\treturn 1\n", "text/plain"),  # tab-indented
    ],
)
def test_3_3_only_a_whole_magic_number_names_an_image_and_a_tab_is_not_a_binary_control(
    data: bytes, expected: str
) -> None:
    """§3.3: "PNG, JPEG, GIF, WebP and PDF by their magic numbers" (all of it: the 8-byte PNG signature,
    RIFF with WEBP); "UTF-8 text without binary control characters" is text, and a tab is text."""
    assert sniff(data) == expected


def test_3_3_a_multibyte_character_cut_at_the_end_of_the_sniffed_head_is_still_text() -> None:
    data = ("é" * TEXT_INLINE_MAX_BYTES).encode()  # two bytes each: the head ends mid-character or not
    assert sniff_content_type(data[: TEXT_INLINE_MAX_BYTES - 1], complete=False) == "text/plain"


# --- filenames ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("shot.png", "shot.png"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\ada\\report.pdf", "report.pdf"),
        ("/absolute/path/notes.txt", "notes.txt"),
        ("..", "file"),
        ("", "file"),
        (None, "file"),
        (".bashrc", "bashrc"),
        ("a\x00b\nc\r\x1b[31md.txt", "abc[31md.txt"),
        ("evil\u202egnp.exe", "evilgnp.exe"),  # a right-to-left override would show it as "exe.png"
        ("  spaced  .txt ", "spaced  .txt"),
        ("cafe\u0301.txt", "café.txt"),
    ],
)
def test_3_3_the_filename_is_sanitised(raw: str | None, expected: str) -> None:
    """§3.3: "filename (sanitised)": no path parts, no control or format characters."""
    assert sanitise_filename(raw) == expected


def test_3_3_a_long_filename_is_capped_keeping_its_extension() -> None:
    name = sanitise_filename("x" * 1000 + ".csv")
    assert len(name) == FILENAME_MAX_CHARS and name.endswith(".csv")
    assert len(sanitise_filename("y" * 1000)) == FILENAME_MAX_CHARS


def test_3_3_a_filename_of_exactly_128_characters_is_kept_and_one_more_is_capped_to_128() -> None:
    """§3.3: the filename is "at most 128 characters keeping the extension"."""
    exact = "x" * 124 + ".csv"
    assert len(exact) == 128 and sanitise_filename(exact) == exact
    longer = sanitise_filename("y" * 125 + ".csv")
    assert longer == "y" * 124 + ".csv" and len(longer) == 128


# --- the upload gate ----------------------------------------------------------------------------


def test_3_3_an_upload_passes_the_gate_an_append_to_that_stream_would() -> None:
    """§3.3: uploads take "gate and scope as for appends"."""
    user = Claims("user", ("/agents/team-a/**",))
    assert admit_upload(user, "/agents/team-a/bot") is None
    refused = admit_upload(user, "/agents/team-b/bot")
    assert refused is not None and refused.rule == "scope"
    refused = admit_upload(Claims("user", ("/**",)), "/integrations/x")
    assert refused is not None and refused.rule == "user-agent-streams-only"
    refused = admit_upload(Claims("agent", ("/**",), agent_path="/agents/a"), "/integrations/x")
    assert refused is not None and refused.rule == "agent-agent-streams-only"
    assert admit_upload(Claims("integration", ("/**",)), "/integrations/github/1") is None
    refused = admit_upload(Claims("integration", ("/**",)), "/other/x")
    assert refused is not None and refused.rule == "integration-streams"
    assert admit_upload(Claims("platform", ("/**",)), "/anything/at/all") is None


def test_3_3_the_user_tier_limit_is_25_mib_and_other_tiers_have_their_own() -> None:
    settings = Settings.from_env({})
    assert settings.max_file_bytes("user") == 25 * 1024 * 1024
    assert settings.max_file_bytes("integration") == settings.gateway_max_file_bytes


def test_3_3_declared_inputs_default_per_transport_and_per_model() -> None:
    """§3.3: "default: openai transport takes images and PDFs, openai-compatible text only"."""
    settings = Settings.from_env({})
    assert settings.file_inputs_for("gpt-4o", "openai") == ALL
    assert settings.file_inputs_for("local", "openai-compatible") == TEXT_ONLY
    assert settings.file_inputs_for("smollm2", "openai") == TEXT_ONLY  # the embedded model is text-only
    custom = Settings.from_env({"AGENTSTREAM_LLM_FILE_INPUTS": '{"vision-local": ["image"]}'})
    assert custom.file_inputs_for("vision-local", "openai-compatible") == frozenset({"image"})


# --- rendering ---------------------------------------------------------------------------------


def test_3_3_an_image_is_an_image_url_part_with_a_data_url_after_the_text_part() -> None:
    image = png()
    message = Message(role="user", content="@5\nlook", files=[attachment(image, "shot.png")])
    [sent] = render_files([message], blobs_of(image), ALL, None)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    assert sent == {
        "role": "user",
        "content": [{"type": "text", "text": "@5\nlook"}, {"type": "image_url", "image_url": {"url": url}}],
    }


def test_3_3_a_pdf_is_a_file_part_with_its_filename() -> None:
    document = pdf()
    message = Message(role="user", content="@5\nread", files=[attachment(document, "report.pdf")])
    [sent] = render_files([message], blobs_of(document), ALL, None)
    assert sent["content"][1] == {
        "type": "file",
        "file": {
            "filename": "report.pdf",
            "file_data": "data:application/pdf;base64," + base64.b64encode(document).decode(),
        },
    }


def test_3_3_a_small_text_file_is_inlined_as_a_fenced_block_labelled_with_its_filename() -> None:
    text = b"id,name\n1,ada\n```\n"
    message = Message(role="user", content="@5\ndata", files=[attachment(text, "t.csv")])
    [sent] = render_files([message], blobs_of(text), TEXT_ONLY, None)
    assert sent == {"role": "user", "content": "@5\ndata\n[file: t.csv]\n````\nid,name\n1,ada\n```\n\n````"}


def test_3_3_a_text_file_over_64_kib_is_a_hint_line() -> None:
    big = b"a" * (TEXT_INLINE_MAX_BYTES + 1)
    file = attachment(big, "big.txt")
    message = Message(role="user", content="@5\nx", files=[file])
    assert wanted_blobs([message], ALL, None) == []
    [sent] = render_files([message], blobs_of(big), ALL, None)
    assert sent["content"] == f"@5\nx\n{hint_line(file)}"
    exact = b"b" * TEXT_INLINE_MAX_BYTES
    [sent] = render_files(
        [Message(role="user", content="y", files=[attachment(exact, "e.txt")])], blobs_of(exact), ALL, None
    )
    assert "[file: e.txt]" in sent["content"]


def test_3_3_text_of_exactly_64_kib_is_fetched_and_inlined_and_one_byte_more_is_a_hint_line() -> None:
    """§3.3: "text, JSON, YAML or CSV of at most 64 KiB" (65 536 bytes) is inlined in a fence."""
    exact, over = b"a" * 65_536, b"b" * 65_537
    files = [attachment(exact, "exact.txt"), attachment(over, "over.txt")]
    message = Message(role="user", content="t", files=files)
    assert wanted_blobs([message], TEXT_ONLY, None) == [blob_hex(files[0]["path"])]
    [sent] = render_files([message], blobs_of(exact, over), TEXT_ONLY, None)
    assert sent["content"] == "t\n[file: exact.txt]\n```\n" + "a" * 65_536 + "\n```\n" + hint_line(files[1])


def test_3_3_an_input_the_model_does_not_take_is_the_hint_line_and_the_content_stays_a_string() -> None:
    """§3.3: an image on an openai-compatible (text-only) model is the hint line."""
    image = png()
    file = attachment(image, "shot.png")
    message = Message(role="user", content="@5\nlook", files=[file])
    assert wanted_blobs([message], TEXT_ONLY, None) == []
    [sent] = render_files([message], {}, TEXT_ONLY, None)
    assert sent == {
        "role": "user",
        "content": f"@5\nlook\n[attached file: shot.png (image/png, {len(image)} bytes) {file['url']}]",
    }


def test_3_3_anything_else_such_as_a_zip_archive_is_the_hint_line_and_never_opened() -> None:
    bomb = zip_bomb(2)
    file = attachment(bomb, "bomb.zip")
    assert file["contentType"] == "application/zip"
    message = Message(role="user", content="z", files=[file])
    assert wanted_blobs([message], ALL, None) == []
    [sent] = render_files([message], blobs_of(bomb), ALL, None)
    assert sent["content"] == "z\n" + hint_line(file)


def test_3_3_a_message_without_files_stays_exactly_as_recorded() -> None:
    messages = [Message(role="system", content="protocol"), Message(role="user", content="@2\nhi")]
    assert render_files(messages, {}, ALL, 8192) == [
        {"role": "system", "content": "protocol"},
        {"role": "user", "content": "@2\nhi"},
    ]


def test_3_3_without_blobs_every_file_renders_as_the_caller_always_rendered_it() -> None:
    """With nothing fetched, the rendering is the hint-line rendering of compaction calls, byte for byte."""
    files = [attachment(png(), "a.png"), attachment(b"text", "b.txt")]
    messages = [Message(role="user", content="@3\nboth", files=files), Message(role="assistant", content="ok")]
    assert render_files(messages, {}, ALL, None) == llm_outcomes.provider_messages(messages)


def test_3_3_a_missing_blob_renders_the_hint_line_with_unavailable() -> None:
    """§3.3: "a missing blob renders the hint line with (unavailable)"."""
    image = png()
    file = attachment(image, "gone.png")
    message = Message(role="user", content="@4\nsee", files=[file])
    [sent] = render_files([message], {blob_hex(file["path"]) or "": None}, ALL, None)
    assert (
        sent["content"]
        == f"@4\nsee\n[attached file: gone.png (image/png, {len(image)} bytes) {file['url']} (unavailable)]"
    )


def test_3_3_the_bytes_decide_the_part_not_the_attachments_claim() -> None:
    """An attachment that claims image/png for text bytes is inlined as text, never sent as an image."""
    text = b"just words\n"
    file = attachment(text, "fake.png", content_type="image/png")
    [sent] = render_files([Message(role="user", content="c", files=[file])], blobs_of(text), ALL, None)
    assert sent["content"] == "c\n[file: fake.png]\n```\njust words\n\n```"


def test_3_3_parts_go_only_in_user_messages_other_roles_get_the_hint_line() -> None:
    image = png()
    file = attachment(image, "shot.png")
    message = Message(role="developer", content="@6\nfrom an agent", files=[file])
    assert wanted_blobs([message], ALL, None) == []
    [sent] = render_files([message], blobs_of(image), ALL, None)
    assert sent["content"] == "@6\nfrom an agent\n" + hint_line(file)


def test_3_3_files_render_in_order_text_blocks_and_hints_in_the_text_part_parts_after_it() -> None:
    image, text, document = png(), b"note\n", pdf()
    files = [
        attachment(image, "1.png"),
        attachment(text, "2.txt"),
        attachment(b"\x00bin", "3.bin"),
        attachment(document, "4.pdf"),
    ]
    [sent] = render_files([Message(role="user", content="c", files=files)], blobs_of(image, text, document), ALL, None)
    parts = sent["content"]
    assert [part["type"] for part in parts] == ["text", "image_url", "file"]
    assert parts[0]["text"] == "c\n[file: 2.txt]\n```\nnote\n\n```\n" + hint_line(files[2])


def _size(messages: list[dict[str, Any]]) -> int:
    return len(orjson.dumps(messages))


def test_3_3_file_bytes_count_against_the_budget_and_the_newest_files_fall_back_first() -> None:
    """§3.3: "over it, the newest files fall back to hint lines first"."""
    old, new = png(40, 40, (1, 2, 3)), png(40, 40, (4, 5, 6))
    messages = [
        Message(role="system", content="protocol"),
        Message(role="user", content="@2\nold", files=[attachment(old, "old.png")]),
        Message(role="user", content="@3\nnew", files=[attachment(new, "new.png")]),
    ]
    blobs = blobs_of(old, new)
    whole = render_files(messages, blobs, ALL, None)
    assert render_files(messages, blobs, ALL, _size(whole)) == whole  # exactly at the budget: all parts
    fitted = render_files(messages, blobs, ALL, _size(whole) - 1)
    assert fitted[1] == whole[1]  # the older image keeps its part
    assert fitted[2]["content"] == "@3\nnew\n" + hint_line(messages[2].files[0])  # type: ignore[index]
    assert _size(fitted) <= _size(whole) - 1
    tiny = render_files(messages, blobs, ALL, 100)
    assert all(isinstance(message["content"], str) for message in tiny)


def test_3_3_the_same_request_renders_to_the_same_bytes_every_time() -> None:
    """§3.3: "the parts of a published item are byte-identical in every later request"."""
    image, document = png(), pdf()
    messages = [
        Message(role="user", content="@2\nx", files=[attachment(image, "a.png"), attachment(document, "b.pdf")])
    ]
    blobs = blobs_of(image, document)
    first = orjson.dumps(render_files(messages, blobs, ALL, 1 << 20))
    assert all(orjson.dumps(render_files(messages, dict(blobs), ALL, 1 << 20)) == first for _ in range(3))
    assert json.loads(first)[0]["content"][0]["text"] == "@2\nx"


def test_3_3_wanted_blobs_names_each_usable_blob_once_in_order_within_the_budget() -> None:
    image, document = png(), pdf()
    a, b = attachment(image, "a.png"), attachment(document, "b.pdf")
    messages = [Message(role="user", content="1", files=[a, b]), Message(role="user", content="2", files=[a])]
    assert wanted_blobs(messages, ALL, None) == [blob_hex(a["path"]), blob_hex(b["path"])]
    assert wanted_blobs(messages, frozenset({"pdf"}), None) == [blob_hex(b["path"])]
    assert wanted_blobs(messages, ALL, 8) == []  # neither fits the budget at all


def test_3_3_wanted_blobs_counts_a_file_as_its_base64_against_the_budget() -> None:
    """§3.3: file bytes count against the request budget "in bytes of the messages as sent", and a
    file is sent as base64 (4 bytes for 3): a blob whose base64 cannot fit is not fetched."""
    document = pdf()
    file = attachment(document, "b.pdf")
    message = Message(role="user", content="1", files=[file])
    as_sent = len(base64.b64encode(document))
    assert as_sent > len(document)
    assert wanted_blobs([message], ALL, as_sent) == [blob_hex(file["path"])]
    assert wanted_blobs([message], ALL, as_sent - 1) == []
