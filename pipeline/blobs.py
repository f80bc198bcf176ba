"""The blob store: file bytes by content address, never in the journal (docs/behaviour.md §3.3).

A blob is stored once under `blobs/sha256/<hex>`, whoever uploads it and however often. Beside it
the store keeps which streams it was uploaded to (`refs/sha256/<hex>/<key>`, the stream path as the
body): the gateway serves a file to a token whose scope covers one of them.

Two backends with one contract (tests/pipeline/test_blobs.py runs the same tests against both):
- `DirectoryBlobStore` (default): a directory (`AGENTSTREAM_BLOB_DIR`), written by rename so a
  reader never sees half a blob;
- `ObjectBlobStore`: any S3-compatible object store through obstore (bucket, prefix, endpoint
  settings). obstore, not boto3: one small wheel with no dependencies (the Rust `object_store`
  crate), atomic puts (multipart for large files), and the same interface for S3, GCS, Azure and a
  local directory should a deployment need another.

Calls block: the gateway and the caller run them in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Protocol

from pipeline.settings import Settings
from processors.files import BLOB_PREFIX, blob_path, is_sha256_hex

REFS_PREFIX = "refs/sha256/"


class BlobStoreError(RuntimeError):
    """The store could not be reached or answered an error (not: the blob is missing)."""


class BlobStore(Protocol):
    def temp_dir(self) -> Path:
        """Where an upload is spooled before it is stored (the same filesystem, for a directory)."""
        ...

    def put_file(self, hex_digest: str, source: Path) -> None:
        """Store the file at `source` (whose sha256 is `hex_digest`) unless the blob is there."""
        ...

    def get(self, hex_digest: str) -> bytes | None:
        """The blob's bytes, None when there is no such blob."""
        ...

    def add_ref(self, hex_digest: str, stream_path: str) -> None:
        """Record that the blob was uploaded to `stream_path` (idempotent)."""
        ...

    def refs(self, hex_digest: str) -> list[str]:
        """The stream paths the blob was uploaded to, sorted."""
        ...


def _ref_key(stream_path: str) -> str:
    # A stream path may hold any character a file or object name cannot: name the record by its hash.
    return hashlib.sha256(stream_path.encode()).hexdigest()[:32]


def _checked(hex_digest: str) -> str:
    if not is_sha256_hex(hex_digest):
        raise ValueError(f"not a sha256 content address: {hex_digest!r} (64 lower-case hex digits)")
    return hex_digest


class DirectoryBlobStore:
    """Blobs as files under one directory: `blobs/sha256/<hex>`, `refs/sha256/<hex>/<key>`, `tmp/`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def temp_dir(self) -> Path:
        path = self.root / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _blob(self, hex_digest: str) -> Path:
        return self.root / blob_path(_checked(hex_digest))

    def put_file(self, hex_digest: str, source: Path) -> None:
        target = self._blob(hex_digest)
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.parent == self.temp_dir():  # an upload spooled here: move it, do not copy it
            os.replace(source, target)
            return
        staged = Path(tempfile.mkstemp(dir=self.temp_dir(), prefix="put-")[1])
        try:
            shutil.copyfile(source, staged)
            os.replace(staged, target)  # atomic: readers see the whole blob or none
        finally:
            staged.unlink(missing_ok=True)

    def get(self, hex_digest: str) -> bytes | None:
        try:
            return self._blob(hex_digest).read_bytes()
        except FileNotFoundError:
            return None

    def add_ref(self, hex_digest: str, stream_path: str) -> None:
        folder = self.root / REFS_PREFIX / _checked(hex_digest)
        target = folder / _ref_key(stream_path)
        if target.exists():
            return
        folder.mkdir(parents=True, exist_ok=True)
        fd, staged = tempfile.mkstemp(dir=self.temp_dir(), prefix="ref-")
        with os.fdopen(fd, "wb") as out:
            out.write(stream_path.encode())
        os.replace(staged, target)

    def refs(self, hex_digest: str) -> list[str]:
        folder = self.root / REFS_PREFIX / _checked(hex_digest)
        if not folder.is_dir():
            return []
        return sorted(entry.read_text("utf-8") for entry in folder.iterdir() if entry.is_file())


class ObjectBlobStore:
    """Blobs as objects of an S3-compatible bucket (through obstore), under an optional prefix."""

    def __init__(self, store: object, spool: Path | None = None) -> None:
        self.store = store
        self.spool = spool

    @classmethod
    def s3(
        cls,
        bucket: str,
        *,
        prefix: str = "",
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        spool: Path | None = None,
    ) -> ObjectBlobStore:
        from obstore.store import S3Store

        config: dict[str, object] = {}
        if endpoint:
            config["endpoint"] = endpoint
            config["virtual_hosted_style_request"] = False  # path-style: what S3-compatible servers serve
        if region:
            config["region"] = region
        if access_key_id:
            config["access_key_id"] = access_key_id
        if secret_access_key:
            config["secret_access_key"] = secret_access_key
        client = {"allow_http": True} if endpoint and endpoint.startswith("http://") else None
        store = S3Store(bucket, prefix=prefix.strip("/") or None, config=config, client_options=client)  # type: ignore[arg-type]
        return cls(store, spool)

    def temp_dir(self) -> Path:
        if self.spool is None:
            return Path(tempfile.gettempdir())
        self.spool.mkdir(parents=True, exist_ok=True)
        return self.spool

    def _head(self, key: str) -> bool:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            obstore.head(self.store, key)  # type: ignore[arg-type]
        except (NotFoundError, FileNotFoundError):
            return False
        except Exception as error:
            raise BlobStoreError(f"blob store: {error}") from error
        return True

    def put_file(self, hex_digest: str, source: Path) -> None:
        import obstore

        key = blob_path(_checked(hex_digest))
        if self._head(key):
            return
        try:
            obstore.put(self.store, key, source)  # type: ignore[arg-type]
        except Exception as error:
            raise BlobStoreError(f"blob store: storing {key} failed: {error}") from error

    def get(self, hex_digest: str) -> bytes | None:
        import obstore
        from obstore.exceptions import NotFoundError

        key = blob_path(_checked(hex_digest))
        try:
            return obstore.get(self.store, key).bytes().to_bytes()  # type: ignore[arg-type]
        except (NotFoundError, FileNotFoundError):
            return None
        except Exception as error:
            raise BlobStoreError(f"blob store: reading {key} failed: {error}") from error

    def add_ref(self, hex_digest: str, stream_path: str) -> None:
        import obstore

        key = f"{REFS_PREFIX}{_checked(hex_digest)}/{_ref_key(stream_path)}"
        try:
            obstore.put(self.store, key, stream_path.encode())  # type: ignore[arg-type]
        except Exception as error:
            raise BlobStoreError(f"blob store: recording {key} failed: {error}") from error

    def refs(self, hex_digest: str) -> list[str]:
        import obstore

        prefix = f"{REFS_PREFIX}{_checked(hex_digest)}/"
        try:
            paths: list[str] = []
            for batch in obstore.list(self.store, prefix):  # type: ignore[arg-type]
                for meta in batch:
                    paths.append(obstore.get(self.store, meta["path"]).bytes().to_bytes().decode())  # type: ignore[arg-type]
            return sorted(paths)
        except Exception as error:
            raise BlobStoreError(f"blob store: listing {prefix} failed: {error}") from error


def blob_store(settings: Settings) -> BlobStore:
    """The store the settings name: the bucket when `blob_s3_bucket` is set, else the directory."""
    if settings.blob_s3_bucket:
        return ObjectBlobStore.s3(
            settings.blob_s3_bucket,
            prefix=settings.blob_s3_prefix,
            endpoint=settings.blob_s3_endpoint,
            region=settings.blob_s3_region,
            access_key_id=settings.blob_s3_access_key_id,
            secret_access_key=settings.blob_s3_secret_access_key,
        )
    return DirectoryBlobStore(settings.blob_directory)


__all__ = ["BLOB_PREFIX", "BlobStore", "BlobStoreError", "DirectoryBlobStore", "ObjectBlobStore", "blob_store"]
