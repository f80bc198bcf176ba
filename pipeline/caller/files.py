"""The caller's side of files the model sees (docs/behaviour.md §3.3): fetch the blobs a call's
messages could use from the blob store, check them against their content address, and render the
messages with them (`processors/files.render_files`, pure).

Bytes come by content address and are checked against it, so every request that carries a published
item carries the same parts: prompt-cache prefixes hold, and a retry sends the same bytes. A blob
the store does not have, or whose bytes do not hash to its address, renders as the hint line with
`(unavailable)`, and so does one the store could not be asked for (logged); the turn goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from pipeline.blobs import BlobStore
from pipeline.settings import Settings
from processors.files import render_files, wanted_blobs
from schemas.requests import CallRequest

log = logging.getLogger("agentstream.caller")


class FileLoader:
    def __init__(self, store: BlobStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    async def fetch(self, hex_digest: str) -> bytes | None:
        try:
            data = await asyncio.to_thread(self.store.get, hex_digest)
        except Exception as error:  # the store is down: this request renders without the file
            log.warning("blob sha256/%s could not be read: %s", hex_digest, error)
            return None
        if data is not None and hashlib.sha256(data).hexdigest() != hex_digest:
            log.warning("blob sha256/%s does not hash to its address: left out", hex_digest)
            return None
        return data

    async def messages(self, record: CallRequest) -> list[dict[str, Any]]:
        """The call's messages as sent: each item's files as the model's declared inputs allow."""
        inputs = self.settings.file_inputs_for(record.model, record.transport)
        budget = self.settings.render_budget_for(record.model).request_bytes
        wanted = wanted_blobs(record.messages, inputs, budget)
        blobs: dict[str, bytes | None] = {}
        for hex_digest in wanted:
            blobs[hex_digest] = await self.fetch(hex_digest)
        return render_files(record.messages, blobs, inputs, budget)
