"""A real S3 endpoint on 127.0.0.1 for tests: moto's server mode speaks the S3 protocol over HTTP, and pyarrow's
S3 client (audiopipe.storage.s3) talks to it unmodified, exactly as it would to AWS, MinIO or Ceph.

The server runs in a thread of the test process, so subprocesses (the CLI, Ray workers, torchrun ranks) reach it
over TCP with the environment the fixture sets. Its objects live in moto's in-process backend, so `restart()`
(stop, then start again on the same port) keeps them: that is how a server restart mid-epoch is tested.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import pytest

# moto's werkzeug logs one line per request; the tests read their own figures, not the access log.
logging.getLogger("werkzeug").setLevel(logging.ERROR)

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._cls = ThreadedMotoServer
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.host, self.port = self._server.get_host_and_port()
        self.running = True

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables a client (this process or a subprocess) needs to reach this server."""
        return {**ENV, "AWS_ENDPOINT_URL": self.endpoint}

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def start(self) -> None:
        if not self.running:
            self._server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
            self.running = True

    def restart(self) -> None:
        self.stop()
        self.start()


def admin_client(server: S3Server):
    """A client of the test's own (not audiopipe's) for putting and breaking objects."""
    from pyarrow import fs as pafs

    env = server.env()
    return pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                             region=env["AWS_REGION"], endpoint_override=server.endpoint, scheme="http")


def upload(server: S3Server, folder, url: str) -> str:
    """Copy a local shard folder under an s3:// prefix, the same layout (what `shard --out s3://` leaves)."""
    from pyarrow import fs as pafs

    from audiopipe.storage.s3 import parse_s3

    pafs.copy_files(str(folder), parse_s3(url).path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=admin_client(server))
    return url


def object_keys(root: str) -> list[str]:
    """The key of every object under the s3:// prefix, relative to it (listed through audiopipe's own client)."""
    from pyarrow import fs as pafs

    from audiopipe.storage.s3 import filesystem, parse_s3

    url = parse_s3(root)
    infos = filesystem().get_file_info(pafs.FileSelector(url.path, recursive=True, allow_not_found=True))
    return [i.path[len(url.path) + 1:] for i in infos if i.type == pafs.FileType.File]


def object_digests(root: str) -> dict[str, str]:
    """Relative key -> sha256 of every object under the prefix (read back through audiopipe's own client)."""
    from audiopipe.storage.s3 import filesystem, parse_s3

    fs, base = filesystem(), parse_s3(root)
    out = {}
    for key in object_keys(root):
        with fs.open_input_stream(base.child(key).path) as f:
            out[key] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The server with this process's environment pointing at it and a fresh, empty bucket.

    Yields (server, "s3://bucket"); subprocesses get the environment through os.environ (monkeypatched)."""
    from pyarrow import fs as pafs

    s3_server.start()
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    # Bucket creation is an administrator's job, so audiopipe's own client is not allowed to do it.
    pafs.S3FileSystem(access_key=ENV["AWS_ACCESS_KEY_ID"], secret_key=ENV["AWS_SECRET_ACCESS_KEY"],
                      region=ENV["AWS_REGION"], endpoint_override=s3_server.endpoint,
                      allow_bucket_creation=True).create_dir(bucket)
    yield s3_server, f"s3://{bucket}"
