"""The blob store's contract (docs/behaviour.md §3.3: "file bytes live in a blob store under their
content address"), one suite run against both backends: the directory and an S3-compatible object
store, the latter a real s3proxy 2.6.0 started by the test (tests/support/s3proxy.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.blobs import BlobStore, DirectoryBlobStore, ObjectBlobStore, blob_store
from pipeline.settings import Settings
from tests.support.files import png
from tests.support.s3proxy import BUCKET, CREDENTIAL, IDENTITY, S3Proxy


@pytest.fixture(scope="module")
def s3proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Proxy]:
    with S3Proxy(tmp_path_factory.mktemp("s3proxy")) as server:
        yield server


def s3_settings(server: S3Proxy, prefix: str) -> Settings:
    return Settings.from_env(
        {
            "AGENTSTREAM_BLOB_S3_BUCKET": BUCKET,
            "AGENTSTREAM_BLOB_S3_PREFIX": prefix,
            "AGENTSTREAM_BLOB_S3_ENDPOINT": server.endpoint,
            "AGENTSTREAM_BLOB_S3_REGION": "us-east-1",
            "AGENTSTREAM_BLOB_S3_ACCESS_KEY_ID": IDENTITY,
            "AGENTSTREAM_BLOB_S3_SECRET_ACCESS_KEY": CREDENTIAL,
        }
    )


@pytest.fixture(params=["directory", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "directory":
        return DirectoryBlobStore(tmp_path / "blobs")
    server: S3Proxy = request.getfixturevalue("s3proxy")
    made = blob_store(s3_settings(server, f"t-{tmp_path.name}"))
    assert isinstance(made, ObjectBlobStore)
    return made


def staged(store: BlobStore, data: bytes) -> tuple[str, Path]:
    path = store.temp_dir() / f"staged-{hashlib.sha256(data).hexdigest()[:8]}-{os.getpid()}"
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def test_3_3_a_blob_round_trips_by_its_content_address_and_is_stored_once(store: BlobStore) -> None:
    data = png(16, 16)
    digest, path = staged(store, data)
    assert store.get(digest) is None
    store.put_file(digest, path)
    store.put_file(digest, path)  # the same bytes again: nothing changes
    assert store.get(digest) == data


def test_3_3_the_streams_a_blob_was_uploaded_to_are_recorded_once_each(store: BlobStore) -> None:
    digest, path = staged(store, b"shared notes\n")
    store.put_file(digest, path)
    assert store.refs(digest) == []
    for stream in ("/agents/b", "/agents/a", "/agents/b", "/agents/with space/ünïcode"):
        store.add_ref(digest, stream)
    assert store.refs(digest) == ["/agents/a", "/agents/b", "/agents/with space/ünïcode"]


def test_3_3_a_blob_larger_than_one_multipart_chunk_round_trips(store: BlobStore) -> None:
    data = os.urandom(6 * 1024 * 1024)  # over obstore's 5 MiB chunk: a multipart upload on S3
    digest, path = staged(store, data)
    store.put_file(digest, path)
    assert store.get(digest) == data


def test_3_3_an_address_that_is_not_a_sha256_is_refused(store: BlobStore) -> None:
    for bad in ("../../etc/passwd", "ABC", "0" * 63, "g" * 64):
        with pytest.raises(ValueError, match="content address"):
            store.get(bad)


def test_3_3_the_s3_store_keeps_its_objects_under_its_prefix(s3proxy: S3Proxy, tmp_path: Path) -> None:
    """The S3 round trip against s3proxy, seen from the server's side: the objects sit under the prefix."""
    store = blob_store(s3_settings(s3proxy, "team-x/files"))
    digest, path = staged(store, b"prefixed\n")
    store.put_file(digest, path)
    store.add_ref(digest, "/agents/x")
    on_disk = s3proxy.root / "data" / BUCKET / "team-x" / "files"
    assert (on_disk / "blobs" / "sha256" / digest).read_bytes() == b"prefixed\n"
    assert len(list((on_disk / "refs" / "sha256" / digest).iterdir())) == 1


def test_3_3_the_default_store_is_a_directory_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings.from_env({"AGENTSTREAM_DATA_DIR": str(tmp_path)})
    store = blob_store(settings)
    assert isinstance(store, DirectoryBlobStore) and store.root == tmp_path / "blobs"
    assert blob_store(settings.model_copy(update={"blob_dir": tmp_path / "b"})).root == tmp_path / "b"  # type: ignore[attr-defined]
