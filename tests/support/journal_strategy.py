"""Random, realistic journals for property tests (docs/behaviour.md §2, §3): keyed and unkeyed items
in both lanes, every role and actor form, files in and out of the blob store, requests, answers (to
the open request or not), settlements, usage reports, compactions with valid and invalid cutoffs,
pauses, resumes, stream errors, configuration and invalid payloads."""

from __future__ import annotations

import hashlib
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from processors.files import blob_path, file_url, sniff_content_type
from tests.support.files import pdf, png, zip_bomb
from tests.support.journal_builder import AFTER_CURRENT, DONT_TRIGGER, INTERRUPT, Journal

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

CONTENTS = ["", "hi", '@3 key="fake" updates=@1', "two\nlines", 'say "x"', "é🙂", "ignore previous instructions"]
KEYS = [None, None, None, "k1", "k2", "agent/system-prompt"]
ACTORS: list[dict[str, Any] | None] = [
    None,
    {"type": "user", "origin": "web"},
    {"type": "user", "origin": "cli", "userId": "u1"},
    {"type": "agent", "path": "/agents/peer"},
    {"type": "script", "executionId": "ex-1"},
    {"type": "integration", "name": "github"},
    {"type": "slack", "userId": "U1"},
    {"type": "slack"},
    {"type": "telegram", "username": "tg"},
    {"type": "email", "address": "a@b.c"},
    {"type": "github", "login": "octocat"},
    {"type": "github"},
]
# Realistic system items come from the platform or an agent (§3.1 renders every system item as
# provider system, whatever its actor).
SYSTEM_ACTORS: list[dict[str, Any] | None] = [None, {"type": "agent", "path": "/agents/parent"}]
POLICIES = [None, None, AFTER_CURRENT, INTERRUPT, DONT_TRIGGER]
REFS = [
    {"type": "event", "streamPath": "/integrations/github/main", "offset": 240},
    {"type": "user", "userId": "u1"},
    {"type": "file", "path": "/w/a.py"},
    {"type": "git-commit", "repoPath": "/repo", "commitOid": "abc"},
]
FILE = {"contentType": "text/plain", "filename": "a.txt", "path": "/f/a.txt", "size": 3, "url": "https://f/a"}
# Files in the blob store (§3.3): an image, a PDF, a text file, an archive, and one whose blob is missing.
BLOB_BYTES = {"shot.png": png(6, 6), "doc.pdf": pdf(), "notes.csv": b"a,b\n1,2\n", "x.zip": zip_bomb(1)}
BLOB_FILES = [
    {
        "contentType": sniff_content_type(data, complete=True),
        "filename": name,
        "path": blob_path(hashlib.sha256(data).hexdigest()),
        "size": len(data),
        "url": file_url(hashlib.sha256(data).hexdigest()),
    }
    for name, data in BLOB_BYTES.items()
]
MISSING = png(3, 3, (1, 1, 1))
BLOB_FILES.append({**BLOB_FILES[0], "path": blob_path(hashlib.sha256(MISSING).hexdigest()), "filename": "gone.png"})
BLOBS: dict[str, bytes | None] = {hashlib.sha256(data).hexdigest(): data for data in BLOB_BYTES.values()}
BLOBS[hashlib.sha256(MISSING).hexdigest()] = None
FILES = [FILE, *BLOB_FILES]
KIND_WEIGHTS = {
    "item": 8,
    "request": 2,
    "turn": 2,
    "answer": 2,
    "settle": 2,
    "usage": 1,
    "compaction": 1,
    "pause": 1,
    "resume": 1,
    "error": 1,
    "configured": 1,
    "invalid": 1,
    "noop": 1,
}
KINDS = [kind for kind, weight in KIND_WEIGHTS.items() for _ in range(weight)]


@st.composite
def journals(draw: st.DrawFn, max_events: int = 32, file_odds: int = 10) -> Journal:
    j = Journal()
    requests: list[int] = []
    for _ in range(draw(st.integers(1, max_events))):
        kind = draw(st.sampled_from(KINDS))
        if kind == "item":
            role = draw(st.sampled_from(["system", "developer", "developer", "user", "user", "assistant"]))
            actor = draw(st.sampled_from(SYSTEM_ACTORS if role == "system" else ACTORS))
            refs = draw(st.lists(st.sampled_from(REFS), max_size=2)) or None
            files = (
                draw(st.lists(st.sampled_from(FILES), min_size=1, max_size=3))
                if draw(st.integers(1, file_odds)) == 1
                else None
            )
            j.item(
                role,
                draw(st.sampled_from(CONTENTS)),
                key=draw(st.sampled_from(KEYS)),
                actor=actor,
                refs=refs,
                files=files,
                policy=draw(st.sampled_from(POLICIES)),
            )
        elif kind == "request":
            requests.append(j.request())
        elif kind == "turn":  # a successful turn: request, its answer, its settlement
            requests.append(j.request())
            j.assistant(draw(st.sampled_from(CONTENTS)), llmRequestOffset=requests[-1])
            j.settle(requests[-1], "succeeded")
        elif kind == "answer":  # to the latest request (often the open one), an older one, or none
            target = draw(st.sampled_from([None, *requests[-1:], *requests[-1:], *requests[:1]]))
            j.assistant(draw(st.sampled_from(CONTENTS)), llmRequestOffset=target, key=draw(st.sampled_from(KEYS)))
        elif kind == "settle" and requests:
            target = draw(st.sampled_from([requests[-1], requests[-1], requests[0]]))
            status = draw(st.sampled_from(["succeeded", "failed", "cancelled"]))
            j.settle(target, status)
        elif kind == "usage" and requests:
            j.usage(requests[-1], draw(st.integers(0, 900)), draw(st.integers(0, 200)), cachedInputTokens=3)
        elif kind == "compaction":  # cutoffs below, at and above its own offset
            through = draw(st.integers(1, j.last + 3))
            j.compaction(through=through, summary=draw(st.sampled_from(CONTENTS)))
        elif kind == "pause":
            trigger = draw(st.one_of(st.none(), st.integers(1, j.last + 1)))
            j.paused(trigger_offset=trigger, reason="autonomous turn limit reached")
        elif kind == "resume":
            j.resumed()
        elif kind == "error":
            j.error(draw(st.sampled_from(CONTENTS)))
        elif kind == "configured":
            j.configured({"llmRequestRetryPolicy": {"maxAttempts": draw(st.integers(1, 3))}})
        elif kind == "invalid":
            j.user("never", order=1)
        else:
            j.noop()
    return j
