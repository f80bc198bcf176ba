"""Files the model sees, end to end (docs/behaviour.md §3.3): uploads over the gateway's HTTP door,
the blob store on disk, items carrying the attachments through the real broker, the journal worker
and the LLM caller as processes, and the scripted OpenAI-compatible server (which checks the content
parts) as the model, on the `openai` transport."""

from __future__ import annotations

import base64
import hashlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processors.files import blob_path, file_url
from schemas.events import CONTEXT_ADDED, LLM_REQUEST_SETTLED
from tests.gateway_server import Reply, Tokens
from tests.kafka_stack import wait_until
from tests.support.files import multipart, pdf, png, zip_bomb
from tests.support.scripted_stack import Served, served_stack

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

MODEL = "scripted-vision"
USER_LIMIT = 25 * 1024 * 1024


class Env:
    def __init__(self, served: Served, user: str, narrow: str, integration: str) -> None:
        self.stack = served.stack
        self.gateway = served.gateway
        self.llm = served.llm
        self.user = user
        self.narrow = narrow
        self.integration = integration
        self.blobs = served.stack.settings.blob_directory

    def upload(
        self, stream: str, filename: str, data: bytes, token: str, claimed: str = "application/octet-stream"
    ) -> Reply:
        body, content_type = multipart(filename, data, claimed)
        return self.gateway.request(
            "POST", f"/v1/streams{stream}/files", token=token, raw=body, headers={"Content-Type": content_type}
        )

    def stored(self) -> list[Path]:
        folder = self.blobs / "blobs" / "sha256"
        return sorted(folder.iterdir()) if folder.is_dir() else []


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("files")
    tokens = Tokens(root / "tokens.yaml")
    user = tokens.add("user", "/agents/**", userId="u-files")
    narrow = tokens.add("user", "/agents/team-a/*")
    integration = tokens.add("integration", "/agents/**", "/integrations/**")
    with served_stack(
        root,
        tokens,
        model=MODEL,
        openai_api_key="sk-test-files-0123456789",
        llm_transport="openai",
        blob_dir=root / "blobs",
    ) as served:
        try:
            yield Env(served, user, narrow, integration)
        finally:
            # A second SIGTERM stops the caller waiting for calls still running.
            caller = served.stack.caller
            if caller is not None and caller.poll() is None:
                caller.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                if caller.poll() is None:
                    caller.send_signal(signal.SIGTERM)


def agent_path() -> str:
    return f"/agents/{uuid.uuid4().hex[:12]}"


def expected(data: bytes, filename: str, content_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    return {
        "contentType": content_type,
        "filename": filename,
        "path": blob_path(digest),
        "size": len(data),
        "url": file_url(digest),
    }


# --- uploads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "data", "content_type"),
    [
        ("shot.png", png(12, 12), "image/png"),
        ("report.pdf", pdf("upload"), "application/pdf"),
        ("notes.txt", b"remember the milk\n", "text/plain"),
    ],
)
def test_3_3_an_upload_answers_its_attachment_and_the_bytes_are_stored_once_by_hash(
    env: Env, filename: str, data: bytes, content_type: str
) -> None:
    """§3.3: `POST /v1/streams/{path}/files` stores the bytes under their sha256 and answers the
    FileAttachment; uploading the same bytes again stores nothing new."""
    path = agent_path()
    first = env.upload(path, filename, data, env.user)
    assert first.status == 201, first
    assert first.json() == expected(data, filename, content_type)
    before = env.stored()
    again = env.upload(agent_path(), "copy-" + filename, data, env.user)
    assert again.status == 201 and again.json()["path"] == first.json()["path"]
    assert env.stored() == before
    digest = hashlib.sha256(data).hexdigest()
    assert (env.blobs / "blobs" / "sha256" / digest).read_bytes() == data
    read = env.gateway.request("GET", f"/v1/files/sha256/{digest}", token=env.user)
    assert read.status == 200 and read.body == data
    assert read.headers["content-type"].startswith(content_type)
    assert read.headers["x-content-type-options"] == "nosniff"


def test_3_3_a_lying_content_type_is_not_trusted(env: Env) -> None:
    """§3.3: "contentType sniffed from the bytes (a client's claim is not trusted)"."""
    reply = env.upload(agent_path(), "cat.png", b"<script>alert(1)</script>\n", env.user, claimed="image/png")
    assert reply.status == 201, reply
    assert reply.json()["contentType"] == "text/plain"
    served = env.gateway.request("GET", reply.json()["url"], token=env.user)
    assert served.headers["content-type"] == "text/plain; charset=utf-8"
    assert served.headers["content-disposition"].startswith("attachment")


def test_3_3_an_oversized_file_is_413_and_nothing_is_stored(env: Env) -> None:
    """§3.3: the user tier's limit is 25 MiB; one byte more is refused while it arrives."""
    before = env.stored()
    reply = env.upload(agent_path(), "big.bin", b"a" * (USER_LIMIT + 1), env.user)
    assert reply.status == 413, reply
    assert reply.json()["error"] == "too_large" and str(USER_LIMIT) in reply.json()["detail"]
    assert env.stored() == before
    assert not list((env.blobs / "tmp").iterdir())  # the spool file is gone too


def test_3_3_a_zip_bomb_is_never_opened_refused_for_a_user_and_stored_as_is_for_an_integration(env: Env) -> None:
    """A ZIP of 20 MiB of zeros: a user token gets 415 (no model reads archives); an integration's
    upload is stored as the few KiB it is, `application/zip`, and reaches a model only as a hint."""
    bomb = zip_bomb(20)
    refused = env.upload(agent_path(), "bomb.zip", bomb, env.user, claimed="image/png")
    assert refused.status == 415, refused
    assert "application/zip" in refused.json()["detail"]
    stored = env.upload("/integrations/mail/1", "bomb.zip", bomb, env.integration)
    assert stored.status == 201, stored
    assert stored.json() == expected(bomb, "bomb.zip", "application/zip")
    assert stored.json()["size"] < 1024 * 1024


def test_3_3_a_filename_with_path_tricks_is_sanitised_and_nothing_lands_outside_the_store(env: Env) -> None:
    data = b"tricky\n"
    reply = env.upload(agent_path(), "../../../../etc/\u202epasswd\x00.txt", data, env.user)
    assert reply.status == 201, reply
    assert reply.json()["filename"] == "passwd.txt"
    assert reply.json()["path"] == blob_path(hashlib.sha256(data).hexdigest())
    assert not (env.blobs.parent / "etc").exists()


def test_3_3_uploads_take_the_gate_of_appends_and_a_token_reads_only_files_of_its_scope(env: Env) -> None:
    """§3.3: uploads are gated and scoped as appends; a file is readable with a token whose scope
    covers a stream it was uploaded to, and to no other (404, not telling whether it exists)."""
    data = png(9, 9, (1, 2, 3))
    digest = hashlib.sha256(data).hexdigest()
    outside = env.upload("/agents/team-b/bot", "x.png", data, env.narrow)
    assert outside.status == 403 and outside.json()["rule"] == "scope"
    assert env.upload("/integrations/x", "x.png", data, env.user).json()["rule"] == "scope"
    assert env.gateway.request("POST", "/v1/streams/agents/x/files", token="nope", raw=b"").status == 401
    assert env.upload("/agents/team-b/bot", "x.png", data, env.user).status == 201
    denied = env.gateway.request("GET", f"/v1/files/sha256/{digest}", token=env.narrow)
    assert denied.status == 404 and denied.json()["error"] == "not_found"
    assert env.gateway.request("GET", f"/v1/files/sha256/{digest}", token=env.user).status == 200
    assert env.gateway.request("GET", f"/v1/files/sha256/{digest}").status == 401
    assert env.gateway.request("GET", "/v1/files/sha256/..%2F..%2Fetc", token=env.user).status == 404
    # Uploading the same bytes to a stream in its own scope makes them readable with it too.
    assert env.upload("/agents/team-a/bot", "mine.png", data, env.narrow).status == 201
    assert env.gateway.request("GET", f"/v1/files/sha256/{digest}", token=env.narrow).body == data


def test_3_3_a_body_without_a_file_field_or_not_multipart_is_400(env: Env) -> None:
    body, content_type = multipart("a.txt", b"x")
    no_file = body.replace(b'name="file"', b'name="other"')
    reply = env.gateway.request(
        "POST", f"/v1/streams{agent_path()}/files", token=env.user, raw=no_file, headers={"Content-Type": content_type}
    )
    assert reply.status == 400 and "'file'" in reply.json()["detail"]
    json_body = env.gateway.request("POST", f"/v1/streams{agent_path()}/files", {"file": "x"}, token=env.user)
    assert json_body.status == 400 and "multipart/form-data" in json_body.json()["detail"]


# --- the model sees them -------------------------------------------------------------------------


def answered(env: Env, path: str, count: int) -> list[Any]:
    stream = env.stack.client.streams.get(path)

    def ready() -> list[Any] | None:
        events = stream.events()
        return events if sum(e.type == LLM_REQUEST_SETTLED for e in events) >= count else None

    return wait_until(ready, 60, f"{count} settled turn(s) on {path}", interval=0.2)


def sent_for(env: Env, tag: str) -> list[Any]:
    return [r.body for r in env.llm.records if tag in str(r.body)]


def test_3_3_an_uploaded_image_reaches_the_model_as_an_image_url_part(env: Env) -> None:
    """§3.3 end to end: upload, append an item carrying the attachment, and the provider receives
    the image itself; the journal holds only the attachment, never the bytes."""
    agent = env.stack.client.agents.create()
    image = png(10, 10, noise=True)
    attachment = env.upload(agent.path, "screen.png", image, env.user).json()
    tag = uuid.uuid4().hex
    item = {"role": "user", "content": f"{tag} what is this?", "files": [attachment]}
    reply = env.gateway.request(
        "POST", f"/v1/streams{agent.path}/events?wait=true", {"type": CONTEXT_ADDED, "payload": item}, token=env.user
    )
    assert reply.status == 200, reply
    events = answered(env, agent.path, 1)
    (body,) = sent_for(env, tag)
    (message,) = [m for m in body["messages"] if isinstance(m["content"], list)]
    assert message["role"] == "user"
    assert message["content"][0]["type"] == "text" and message["content"][0]["text"].endswith(f"{tag} what is this?")
    assert message["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(image).decode()},
    }
    journaled = [e for e in events if e.type == CONTEXT_ADDED and e.payload.files]
    assert [e.payload.files[0].model_dump() for e in journaled] == [attachment]
    assert base64.b64encode(image).decode()[:40] not in str([e.payload for e in events])


def test_3_3_a_missing_blob_renders_unavailable_and_the_turn_goes_on_end_to_end(env: Env) -> None:
    agent = env.stack.client.agents.create()
    lost = png(7, 7, (9, 9, 9))
    attachment = expected(lost, "lost.png", "image/png")  # never uploaded
    tag = uuid.uuid4().hex
    item = {"role": "user", "content": f"{tag} and this?", "files": [attachment]}
    # The gateway refuses it (no token could GET a blob never uploaded, rule `files`); a client
    # writing agent-appends directly is not gated, and its item renders the hint.
    reply = env.gateway.request(
        "POST", f"/v1/streams{agent.path}/events?wait=true", {"type": CONTEXT_ADDED, "payload": item}, token=env.user
    )
    assert reply.status == 403 and reply.json()["rule"] == "files", reply
    item["actor"] = {"type": "user", "origin": "cli"}
    agent.append({"type": CONTEXT_ADDED, "payload": item}).wait(timeout=60)
    events = answered(env, agent.path, 1)
    (body,) = sent_for(env, tag)
    (message,) = [m for m in body["messages"] if tag in str(m["content"])]
    assert message["content"].endswith(
        f"[attached file: lost.png (image/png, {len(lost)} bytes) {attachment['url']} (unavailable)]"
    )
    settled = [e for e in events if e.type == LLM_REQUEST_SETTLED]
    assert settled[-1].payload.result.status == "succeeded"
