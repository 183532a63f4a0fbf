"""Publish finished local files as S3 objects that become visible only when complete.

Why not pyarrow's `open_output_stream`: its S3 stream completes the multipart upload on close(), and close() also
runs when an exception leaves a `with` block or the stream is garbage-collected, so a failure half-way publishes
the half written so far under the final name (checked against the test server: a 12 MiB write interrupted by an
exception left a 12 MiB object). pyarrow offers no abort from Python.

So uploads go through boto3 (the AWS SDK for Python), with the protocol spelled out:
- a file up to one part is one PutObject: S3 stores a PUT only once its whole body (Content-Length) arrived;
- a larger file is a multipart upload whose parts are sent first and whose CompleteMultipartUpload is the very
  last request; any error before it aborts the upload. A process killed mid-way never sends the completion, so
  nothing appears under the key; the parts it left (invisible, but billed) are aborted by `abort_incomplete`,
  which a rerun calls on its prefix (a bucket lifecycle rule AbortIncompleteMultipartUpload does the same).

The client takes its credentials, region and endpoint from the same environment as audiopipe.storage.s3, and
the same bounded retries and timeouts (S3Settings).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from audiopipe.errors import StorageError
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, S3URL, _endpoint

# 8 MiB parts: S3's minimum is 5 MiB (except the last); a 256 MB shard is then 32 requests.
PART_SIZE = 8 << 20


def checksum_key(algorithm: str) -> str:
    """The user-metadata key under which an object's checksum is stored: x-amz-meta-audiopipe-xxh3-128 (or
    -sha256, as objects uploaded before xxh3 have it). Hyphens, not underscores: some proxies drop headers with
    underscores."""
    return "audiopipe-" + algorithm.replace("_", "-")


def client(settings: S3Settings | None = None):
    """A boto3 S3 client from the environment (one per settings and environment per process; it is thread-safe)."""
    s = settings or S3Settings()
    env = tuple(os.environ.get(k) for k in (
        "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    return _client(s, env)


@lru_cache(maxsize=8)
def _client(s: S3Settings, _env: tuple):
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:  # pragma: no cover - the s3 extra installs it
        raise ObjectStoreError("writing to s3:// needs boto3: pip install 'audiopipe[s3]'") from e
    endpoint, scheme = _endpoint()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    config = Config(connect_timeout=s.connect_timeout, read_timeout=s.request_timeout,
                    retries={"max_attempts": s.attempts, "mode": "standard"})
    return boto3.session.Session().client(
        "s3", region_name=region, endpoint_url=f"{scheme}://{endpoint}" if endpoint else None, config=config)


def _fail(op: str, url: S3URL, e: Exception) -> ObjectStoreError:
    return ObjectStoreError(f"{op} {url}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


def _metadata(checksum: tuple[str, str] | None) -> dict:
    """User metadata stored with an object: its checksum (algorithm, hex digest), so that a rerun can check a
    finished object with one HEAD request instead of reading it back whole (see audiopipe.shard.output)."""
    return {"Metadata": {checksum_key(checksum[0]): checksum[1]}} if checksum else {}


def head(url: S3URL, settings: S3Settings | None = None) -> tuple[int, dict[str, str]] | None:
    """(size, its user metadata) of an object, or None if there is none."""
    try:
        r = client(settings).head_object(Bucket=url.bucket, Key=url.key)
    except Exception as e:
        if getattr(e, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise _fail("head", url, e) from e
    return int(r["ContentLength"]), dict(r.get("Metadata") or {})


def stored_checksum(found: tuple[int, dict[str, str]] | None, algorithm: str) -> str | None:
    """The checksum of this algorithm stored with an object (`head`'s answer), or None."""
    return None if found is None else found[1].get(checksum_key(algorithm))


def put_bytes(url: S3URL, data: bytes, settings: S3Settings | None = None,
              checksum: tuple[str, str] | None = None) -> None:
    """One PutObject: the object appears whole or not at all."""
    try:
        client(settings).put_object(Bucket=url.bucket, Key=url.key, Body=data, **_metadata(checksum))
    except Exception as e:
        raise _fail("upload", url, e) from e


def upload_file(path: str | os.PathLike[str], url: S3URL, *, part_size: int = PART_SIZE,
                settings: S3Settings | None = None, checksum: tuple[str, str] | None = None) -> int:
    """Upload the finished local file `path` to `url`; return its size. Nothing is visible under `url` until the
    whole file is stored (see the module docstring); on any error the upload is aborted and ObjectStoreError
    raised. `checksum` (algorithm, hex digest: the file's, as the caller computed it while writing) is stored
    with the object."""
    path = Path(path)
    size = path.stat().st_size
    if size <= part_size:
        put_bytes(url, path.read_bytes(), settings, checksum)
        return size
    s3 = client(settings)
    try:
        upload_id = s3.create_multipart_upload(Bucket=url.bucket, Key=url.key, **_metadata(checksum))["UploadId"]
    except Exception as e:
        raise _fail("upload", url, e) from e
    try:
        parts, sent = [], 0
        with open(path, "rb") as f:
            while block := f.read(part_size):
                n = len(parts) + 1
                r = s3.upload_part(Bucket=url.bucket, Key=url.key, UploadId=upload_id, PartNumber=n, Body=block)
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
                sent += len(block)
        if sent != size:  # the file is meant to be finished: one still being written must not be published
            raise StorageError(f"{path} changed size during the upload ({size} -> {sent} bytes)")
        # The completion is the last request: only now does the object exist.
        s3.complete_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload_id,
                                     MultipartUpload={"Parts": parts})
    except BaseException as e:
        try:
            s3.abort_multipart_upload(Bucket=url.bucket, Key=url.key, UploadId=upload_id)
        except Exception:
            pass  # e.g. the server is down: the parts stay invisible until abort_incomplete or a lifecycle rule
        if isinstance(e, Exception):
            raise _fail("upload", url, e) from e
        raise
    return size


def incomplete_uploads(prefix: S3URL, settings: S3Settings | None = None) -> list[tuple[str, str]]:
    """(key, upload id) of every multipart upload under `prefix` that was started and never completed."""
    s3 = client(settings)
    out: list[tuple[str, str]] = []
    kw = {"Bucket": prefix.bucket, "Prefix": f"{prefix.key}/" if prefix.key else ""}
    try:
        while True:
            r = s3.list_multipart_uploads(**kw)
            out += [(u["Key"], u["UploadId"]) for u in r.get("Uploads", [])]
            if not r.get("IsTruncated"):
                return out
            kw.update(KeyMarker=r["NextKeyMarker"], UploadIdMarker=r["NextUploadIdMarker"])
    except Exception as e:
        raise _fail("list uploads under", prefix, e) from e


def abort_incomplete(prefix: S3URL, settings: S3Settings | None = None) -> int:
    """Abort what killed uploads under `prefix` left (invisible parts that still cost storage); return how many.
    Call only while holding the prefix's lock: a running job's uploads are incomplete too."""
    s3 = client(settings)
    n = 0
    for key, upload_id in incomplete_uploads(prefix, settings):
        try:
            s3.abort_multipart_upload(Bucket=prefix.bucket, Key=key, UploadId=upload_id)
            n += 1
        except Exception as e:
            raise _fail("abort upload of", S3URL(prefix.bucket, key), e) from e
    return n


def delete(url: S3URL, settings: S3Settings | None = None) -> None:
    try:
        client(settings).delete_object(Bucket=url.bucket, Key=url.key)
    except Exception as e:
        raise _fail("delete", url, e) from e
