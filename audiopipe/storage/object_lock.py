"""One writer per s3:// output prefix: a lock object naming its holder, kept fresh by a heartbeat.

flock (audiopipe.storage.lock) has no object-store equivalent, so the lock is the object `<prefix>/.audiopipe.lock`
holding the job's command, host, pid, start time and a random token. A job refuses a prefix whose lock is live
and names its holder. A lock is dead, and taken over, when
- its heartbeat is older than `stale_after` (ages are measured on the server's clock: the object's LastModified
  against the Date of the server's reply, so clock skew between machines does not matter), or
- its holder ran on this host and its pid no longer exists (the usual case: kill -9, then rerun the command), or
- the user says so (`--break-lock`).

S3 has no create-if-absent that pyarrow or every S3-compatible server offers, so taking the lock is write, wait
`settle` seconds, read back: of two jobs starting together, the one that reads the other's token backs off.
That closes the race unless a client stalls longer than `settle` between its read and its write. A lost race
costs little: the shard bytes depend only on the corpus and the settings (plan.json refuses other settings),
so two jobs on one prefix write the same objects; the heartbeat notices a lock taken over, and the job then
stops before writing its manifest.

Each heartbeat rewrites the lock only if it is still the object the beat just read (PutObject with If-Match on its
ETag, which S3, MinIO and moto honour): a takeover landing between the beat's read and its write makes the write
fail instead of overwriting the new holder's lock. A server that rejects the header gets plain writes from then on.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from email.utils import parsedate_to_datetime
from typing import Any

from audiopipe.storage.lock import LOCK_NAME, LockHeld, _describe
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, S3URL
from audiopipe.storage.upload import _fail, client, delete, put_bytes

STALE_AFTER = 120.0  # seconds without a heartbeat before a lock from another host is taken over
HEARTBEAT = 20.0
SETTLE = 1.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


class PrefixLock:
    """Take with `PrefixLock(S3URL, "audiopipe shard")` (raises LockHeld at once), release with `release()` or as
    a context manager. `check()` raises LockHeld if another job has taken the lock over since."""

    def __init__(self, prefix: S3URL, command: str, *, break_lock: bool = False, stale_after: float = STALE_AFTER,
                 heartbeat: float = HEARTBEAT, settle: float = SETTLE, settings: S3Settings | None = None) -> None:
        self.url = prefix.child(LOCK_NAME)
        self.prefix = prefix
        self._settings = settings
        self.stale_after = stale_after
        holder, age = self.read()
        if holder is not None and not break_lock and not self._dead(holder, age):
            raise LockHeld(f"{prefix} is in use by {_describe(holder)}, last heartbeat {age:.0f} s ago; wait for it "
                           f"to finish or use another prefix (a dead job's lock goes stale {stale_after:.0f} s "
                           f"after its last heartbeat; break_lock=True takes it over at once)")
        self.info = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                     "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "token": uuid.uuid4().hex}
        self._write()
        time.sleep(settle)
        again, _ = self.read()
        if again is None or again.get("token") != self.info["token"]:
            raise LockHeld(f"{prefix} was locked at the same moment by {_describe(again or {})}; wait for it to "
                           f"finish or use another prefix")
        self.lost: dict[str, Any] | None = None
        self._conditional = True
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat,), name="s3-lock-heartbeat",
                                      daemon=True)
        self._beat.start()

    def read(self) -> tuple[dict[str, Any] | None, float]:
        """(holder, age of its last heartbeat in seconds on the server's clock), or (None, 0) when unlocked."""
        holder, age, _ = self._read()
        return holder, age

    def _read(self) -> tuple[dict[str, Any] | None, float, str | None]:
        """read(), plus the lock object's ETag (None when unlocked)."""
        s3 = client(self._settings)
        try:
            r = s3.get_object(Bucket=self.url.bucket, Key=self.url.key)
            body = r["Body"].read()
        except s3.exceptions.NoSuchKey:
            return None, 0.0, None
        except Exception as e:
            raise ObjectStoreError(f"cannot read the lock {self.url}: {type(e).__name__}: {e}") from e
        try:
            holder = json.loads(body)
        except ValueError:
            holder = {}
        if not isinstance(holder, dict):
            holder = {}
        now = r.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        age = (parsedate_to_datetime(now) - r["LastModified"]).total_seconds() if now else 0.0
        return holder, max(age, 0.0), r.get("ETag")

    def _dead(self, holder: dict[str, Any], age: float) -> bool:
        if age > self.stale_after:
            return True
        pid = holder.get("pid")
        return holder.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid)

    def _write(self) -> None:
        put_bytes(self.url, self._body(), self._settings)

    def _body(self) -> bytes:
        return (json.dumps(self.info, sort_keys=True) + "\n").encode()

    def _rewrite(self, etag: str | None) -> bool:
        """Write the lock again if it is still the object with `etag`; False if another job's write came first."""
        if etag is None or not self._conditional:
            self._write()
            return True
        s3 = client(self._settings)
        try:
            s3.put_object(Bucket=self.url.bucket, Key=self.url.key, Body=self._body(), IfMatch=etag)
            return True
        except Exception as e:
            code = str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            if code in ("NotImplemented", "501", "InvalidArgument"):
                self._conditional = False  # this server has no conditional writes: plain writes from now on
                self._write()
                return True
            raise _fail("upload", self.url, e) from e

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                holder, _, etag = self._read()
                if holder is not None and holder.get("token") != self.info["token"]:
                    self.lost = holder
                    return
                if not self._rewrite(etag):  # another job's write landed between the read and the rewrite
                    holder, _ = self.read()
                    self.lost = holder or {}
                    return
            except ObjectStoreError:
                pass  # a server blip: the next beat tries again, and the lock only goes stale after stale_after

    def check(self) -> None:
        if self.lost is not None:
            raise LockHeld(f"{self.prefix}: the lock was taken over by {_describe(self.lost)} while this job ran; "
                           f"stopping before the manifest is written")

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._beat.join(timeout=5)
        try:
            holder, _ = self.read()
            if holder is not None and holder.get("token") == self.info["token"]:
                delete(self.url, self._settings)
        except ObjectStoreError:
            pass  # the lock then goes stale by itself

    def __enter__(self) -> "PrefixLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
