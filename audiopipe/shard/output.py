"""Where a shard job's files go: a local (or mounted) folder, or an s3:// prefix fed from local staging.

Both keep the same layout (arrow/, wds/, done/, plan.json, index.arrow, rejects.jsonl, manifest.json) and the
same rule: a shard counts as finished only when its done record exists and the files it names match it.

On s3:// every file is first written whole on local disk (a staging folder on the machine that made it: a Ray
worker for shards, the driver for the rest), then uploaded so that the object appears only when complete
(audiopipe.storage.upload). Order carries the meaning: a shard's Arrow file and tar, then its done record; the
plan first; rejects, index.arrow and finally manifest.json last. A rerun lists the prefix and checks every
object a done record names, size and checksum: one that disagrees is rebuilt (its done record is deleted first,
so a run killed meanwhile still sees it as unfinished).

The checksum is checked without reading the object back: a shard's objects are uploaded with their checksum
(xxh3-128; sha256 for objects of older runs) as user metadata, taken while the file was written, and a rerun
compares it with one HEAD request per object. Reading
every object back would cost a rerun of a 10 TB shard set 10 TB of downloads. An object replaced by any other
writer loses that metadata (S3 stores metadata with each PUT), so it is read back and hashed, as is an object
written before the metadata existed; `audiopipe verify` still hashes every byte.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from audiopipe.shard.checksum import Checksum, checksum_of, new_hash
from audiopipe.shard.job import Job, JobError
from audiopipe.shard.plan import WorkUnit, plan_summary
from audiopipe.storage.atomic import fsync_dir, is_temporary
from audiopipe.storage.lock import FolderLock, LockHeld
from audiopipe.storage.s3 import ObjectStoreError, S3URL, is_s3, parse_s3
from audiopipe.storage.scratch import make_scratch, remove_scratch, sweep_abandoned

if TYPE_CHECKING:
    from audiopipe.shard.build import PendingShard


def done_path(out: Path, name: str) -> Path:
    """Where shard `name`'s done record lives (the same as audiopipe.shard.build's; this module opens an output
    without importing the feature code, so that a job locks its folder and starts its workers first)."""
    return out / "done" / f"{name}.json"

# The first file a job writes into its --out, with the job's identity: a folder holds shards of ours only when it
# holds this, so a job never writes into (or cleans) a folder that holds anything else. A folder that is empty
# but for it is one a job made (killed before its plan).
MARKER_NAME = ".audiopipe-shards.json"
# What a shard folder of ours holds at its top: a folder made before the marker existed is adopted only when it
# holds nothing else and its plan names this job.
_OWN_NAMES = {"arrow", "wds", "done", "plan.json", "index.arrow", "rejects.jsonl", "manifest.json"}


def ownership(names: set[str], marker: Any, plan: Any, identity: str, where: str) -> bool:
    """Whether a job of `identity` may write into a folder holding `names` (its top-level entries, the lock
    left out) with this marker and plan.json content (None when absent): True when the marker must be written
    first (an empty folder, or one of ours made before the marker), False when the marker is there already.
    Anything else is a one-line JobError naming what the folder holds."""
    if marker is not None:
        if not isinstance(marker, dict) or "job_identity" not in marker:
            raise JobError(f"{where} holds a damaged {MARKER_NAME}; use a new or empty out= folder")
        if marker["job_identity"] != identity:
            raise JobError(f"{where} holds shards made with other settings (job {marker['job_identity']}, now "
                           f"{identity}); use another out= folder, or delete this one")
        return False
    if not names:
        return True
    ours = (isinstance(plan, dict) and plan.get("job_identity") == identity
            and all(n in _OWN_NAMES or is_temporary(Path(n)) for n in names))
    if ours:
        return True
    shown = sorted(names)
    listed = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
    raise JobError(f"{where} is not empty and was not made by audiopipe shard (it holds {listed}): nothing "
                   f"written; use a new or empty out= folder")


def marker_record(identity: str) -> dict[str, Any]:
    return {"made_by": "audiopipe shard", "job_identity": identity}


# Objects hashed side by side when a rerun checks what exists (each a streamed read; the client is thread-safe).
CHECK_THREADS = 8


def _rel_done(name: str) -> str:
    return done_path(Path(""), name).as_posix()


def _read_arrow(source: Any, columns: Callable[[str], bool] | None) -> pa.Table:
    reader = pa.ipc.open_file(source)
    if columns is None:
        return reader.read_all()
    keep = [i for i, f in enumerate(reader.schema) if columns(f.name)]
    # Only the buffers of these columns are read: the index needs scalars, not the feature arrays.
    return pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=keep)).read_all()


class LocalOutput:
    """A local or mounted folder: files are written in place (atomically), so publishing is nothing."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.work = self.root  # where the driver writes plan, index, rejects and manifest

    def __str__(self) -> str:
        return str(self.root)

    def lock(self, command: str, break_lock: bool = False) -> FolderLock:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            return FolderLock(self.root, command)  # flock: a dead holder never blocks, --break-lock not needed
        except LockHeld as e:
            raise JobError(str(e)) from None
        except OSError as e:
            raise JobError(f"cannot write to output folder {self.root}: {e.strerror or e}") from e

    def prepare(self, identity: str) -> None:
        """Check that the folder is writable and ours (`ownership`); an empty one gets the marker first."""
        from audiopipe.storage.atomic import write_text_atomic
        from audiopipe.storage.lock import LOCK_NAME

        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
            names = {p.name for p in self.root.iterdir()} - {LOCK_NAME, MARKER_NAME}
            marker = _json_or_damaged(self.root / MARKER_NAME)
            # the plan (every utterance) is read only when there is no marker to decide
            plan = _json_or_damaged(self.root / "plan.json") if marker is None else None
            if ownership(names, marker, plan, identity, str(self.root)):
                write_text_atomic(self.root / MARKER_NAME, json.dumps(marker_record(identity)) + "\n")
        except OSError as e:
            raise JobError(f"cannot write to output folder {self.root}: {e.strerror or e}") from e

    def read_json(self, rel: str) -> Any | None:
        p = self.root / rel
        return json.loads(p.read_text()) if p.exists() else None

    def plan_summary(self, rel: str) -> tuple[dict[str, Any], list[str]] | None:
        """plan.json's fields and unit names without its utterances (audiopipe.shard.plan.plan_summary); None
        when absent or not in that layout."""
        try:
            with open(self.root / rel, encoding="utf-8") as f:
                return plan_summary(f)
        except FileNotFoundError:
            return None

    def finished(self, names: list[str]) -> set[str]:
        return {n for n in names if _local_finished(self.root, n)}

    def clean(self) -> None:
        """Remove half-written files a killed run left behind (they never carry a final name)."""
        for sub in ("", "arrow", "wds", "done"):
            d = self.root / sub
            if d.is_dir():
                for p in d.iterdir():
                    if is_temporary(p):
                        p.unlink(missing_ok=True)

    def publish(self, *rels: str) -> None:
        pass  # already in place

    def sync(self) -> None:
        """Make the renames of every shard file durable: one fsync per folder for the whole job (the workers
        fsync'd each file's bytes before its rename, but not the folders, which cost a journal commit each).
        Called before the manifest, the file that declares the set complete."""
        for sub in ("arrow", "wds", "done"):
            d = self.root / sub
            if d.is_dir():
                fsync_dir(d)

    def read_arrow(self, rel: str, columns: Callable[[str], bool] | None = None) -> pa.Table:
        with pa.memory_map(str(self.root / rel)) as src:
            return _read_arrow(src, columns)

    def arrow_schema(self, rel: str) -> pa.Schema:
        with pa.memory_map(str(self.root / rel)) as src:
            return pa.ipc.open_file(src).schema

    def close(self) -> None:
        pass


def _json_or_damaged(path: Path) -> Any:
    """A JSON file's content; None when absent; "" when it is not JSON (a damaged or foreign file)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError):
        return ""


def _local_finished(out: Path, unit_name: str) -> bool:
    dp = done_path(out, unit_name)
    if not dp.exists():
        return False
    try:
        rec = json.loads(dp.read_text())
    except json.JSONDecodeError:
        return False
    for key in ("arrow", "tar"):
        if key in rec:
            p = out / rec[key]["path"]
            if not p.exists() or p.stat().st_size != rec[key]["bytes"]:
                return False
    return True


class S3Output:
    """An s3:// prefix. The driver's own files are staged in a private folder under `staging` (default: the
    system temp folder) and removed by close()."""

    def __init__(self, url: str | S3URL, staging: str | None = None) -> None:
        from audiopipe.storage.s3 import filesystem

        self.url = url if isinstance(url, S3URL) else parse_s3(url)
        self.fs = filesystem()
        self.work = make_scratch("driver", staging)

    def __str__(self) -> str:
        return str(self.url)

    def lock(self, command: str, break_lock: bool = False):
        from audiopipe.storage.object_lock import PrefixLock

        try:
            return PrefixLock(self.url, command, break_lock=break_lock)
        except LockHeld as e:
            raise JobError(str(e)) from None
        except ObjectStoreError as e:
            raise JobError(f"cannot write to {self.url}: {e}") from e

    def prepare(self, identity: str) -> None:
        """The lock object was the write probe; the prefix must be ours (`ownership`): an empty one gets the
        marker first."""
        from audiopipe.storage.lock import LOCK_NAME

        names = {k.split("/", 1)[0] for k in self.listing()} - {LOCK_NAME, MARKER_NAME}
        try:
            marker = self.read_json(MARKER_NAME)
        except ValueError:
            marker = ""
        plan = None
        if marker is None:  # the plan (every utterance) is read only when there is no marker to decide
            try:
                plan = self.read_json("plan.json")
            except ValueError:
                plan = ""
        if ownership(names, marker, plan, identity, str(self.url)):
            (self.work / MARKER_NAME).write_text(json.dumps(marker_record(identity)) + "\n")
            self.publish(MARKER_NAME)

    def _path(self, rel: str) -> str:
        return self.url.child(rel).path

    def read_json(self, rel: str) -> Any | None:
        try:
            with self.fs.open_input_stream(self._path(rel)) as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def plan_summary(self, rel: str) -> tuple[dict[str, Any], list[str]] | None:
        """As LocalOutput.plan_summary (the object is read whole, its utterances left unparsed)."""
        try:
            with self.fs.open_input_stream(self._path(rel)) as f:
                text = f.read().decode("utf-8")
        except FileNotFoundError:
            return None
        return plan_summary(text.splitlines(keepends=True))

    def listing(self) -> dict[str, int]:
        """Relative key -> size of every object under the prefix (one paginated listing)."""
        from pyarrow import fs as pafs

        base = self.url.path.rstrip("/") + "/"
        infos = self.fs.get_file_info(pafs.FileSelector(self.url.path, recursive=True, allow_not_found=True))
        return {i.path[len(base):]: i.size for i in infos if i.type == pafs.FileType.File}

    def checksum(self, rel: str, algorithm: str) -> str:
        h = new_hash(algorithm)
        with self.fs.open_input_stream(self._path(rel)) as f:
            while block := f.read(1 << 22):
                h.update(block)
        return h.hexdigest()

    def holds(self, rel: str, want: Checksum) -> bool:
        """Whether the object `rel` has this checksum: by the checksum uploaded with it (one HEAD) if it has
        one, else by reading it whole."""
        from audiopipe.storage.upload import head, stored_checksum

        found = head(self.url.child(rel))
        if found is None:
            return False
        stored = stored_checksum(found, want.algorithm)
        if stored is not None:
            return stored == want.hexdigest
        return self.checksum(rel, want.algorithm) == want.hexdigest

    def finished(self, names: list[str]) -> set[str]:
        sizes = self.listing()
        claims: dict[str, list[tuple[str, Checksum]]] = {}  # unit -> [(object, checksum its done record names)]
        stale: list[str] = []
        for n in names:
            if _rel_done(n) not in sizes:
                continue
            try:
                rec = self.read_json(_rel_done(n))
                files = _record_files(rec)
            except (ValueError, KeyError, TypeError):
                stale.append(n)
                continue
            if all(sizes.get(p) == b for p, b, _ in files):
                claims[n] = [(p, s) for p, _, s in files]
            else:
                stale.append(n)
        checks = [(n, p, s) for n, files in claims.items() for p, s in files]
        with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="s3-check") as pool:
            ok = list(pool.map(lambda c: self.holds(c[1], c[2]), checks))
        bad = {n for (n, _, _), good in zip(checks, ok) if not good}
        from audiopipe.storage.upload import delete

        for n in sorted(bad) + stale:
            delete(self.url.child(_rel_done(n)))  # the shard is redone; until then nothing claims it is finished
        return set(claims) - bad

    def clean(self) -> None:
        """Abort the multipart uploads a killed run left under the prefix (invisible, but they cost storage)."""
        from audiopipe.storage.upload import abort_incomplete

        abort_incomplete(self.url)

    def sync(self) -> None:
        pass  # an object exists durably once its upload completed

    def publish(self, *rels: str) -> None:
        from audiopipe.storage.upload import upload_file

        for rel in rels:  # in the order given: callers put the file that makes the others count last
            upload_file(self.work / rel, self.url.child(rel))

    def read_arrow(self, rel: str, columns: Callable[[str], bool] | None = None) -> pa.Table:
        with self.fs.open_input_file(self._path(rel)) as f:
            return _read_arrow(f, columns)

    def arrow_schema(self, rel: str) -> pa.Schema:
        with self.fs.open_input_file(self._path(rel)) as f:
            return pa.ipc.open_file(f).schema

    def close(self) -> None:
        remove_scratch(self.work)
        # A process of an earlier, killed run may have died only after this job's first sweep: take its folders now.
        sweep_abandoned(self.work.parent)


def open_output(out: str, staging: str | None = None) -> LocalOutput | S3Output:
    return S3Output(out, staging) if is_s3(out) else LocalOutput(out)


def build_unit(unit: WorkUnit, job: Job, staging: str | None = None, **kw: Any) -> dict[str, Any]:
    """Build one shard where the job's output is and return its done record (see start_unit)."""
    return start_unit(unit, job, staging, **kw).finish()


def start_unit(unit: WorkUnit, job: Job, staging: str | None = None, **kw: Any) -> "PendingShard | StagedUpload":
    """Compute and write one shard where the job's output is; what is left (a local folder's fsyncs and renames,
    an s3:// prefix's uploads) runs in the background until the returned object's `finish()`, which returns the
    done record once the shard counts as finished.

    For s3://, the shard is built whole in a private staging folder on this machine, its Arrow file and tar are
    uploaded, then its done record, and the staged files are removed: nothing local is needed afterwards, so a
    worker node may vanish once its task reported the shard."""
    from audiopipe.shard.build import start_shard

    if not is_s3(job.out):
        return start_shard(unit, job, **kw)
    tmp = make_scratch(unit.name, staging)
    try:
        # No fsync: the staged files are read back from the page cache by the upload and deleted after it.
        staged = start_shard(unit, replace(job, out=str(tmp)), sync=False, **kw)
    except BaseException:
        remove_scratch(tmp)
        raise
    return StagedUpload(staged, tmp, parse_s3(job.out), unit.name)


_UPLOADS: ThreadPoolExecutor | None = None


class StagedUpload:
    """A shard staged on local disk whose upload runs in a background thread (network time a worker spends
    computing its next shard instead of waiting)."""

    def __init__(self, staged: "PendingShard", tmp: Path, root: S3URL, name: str) -> None:
        global _UPLOADS
        if _UPLOADS is None:
            _UPLOADS = ThreadPoolExecutor(2, thread_name_prefix="s3-upload")
        self._cancelled = threading.Event()
        self._future = _UPLOADS.submit(self._upload, staged, tmp, root, name, self._cancelled)

    @staticmethod
    def _upload(staged: "PendingShard", tmp: Path, root: S3URL, name: str,
                cancelled: threading.Event) -> dict[str, Any] | None:
        from audiopipe.storage.upload import upload_file

        try:
            rec = staged.finish()
            for path, _, want in _record_files(rec):  # each with its checksum, so a rerun can check it by one HEAD
                if cancelled.is_set():
                    return None
                upload_file(tmp / path, root.child(path), checksum=(want.algorithm, want.hexdigest))
            # The done record last: it is what makes the shard count as finished, so never after an abort.
            if cancelled.is_set():
                return None
            upload_file(tmp / _rel_done(name), root.child(_rel_done(name)))
            return rec
        finally:
            remove_scratch(tmp)

    def finish(self) -> dict[str, Any]:
        return self._future.result()

    def abort(self) -> None:
        """Upload nothing more of this shard (an upload under way completes; its object is whole) and wait, so
        that nothing writes once the caller has moved on; without its done record the shard counts as
        unfinished, as a local folder's aborted shard does."""
        self._cancelled.set()
        try:
            self._future.result()
        except BaseException:
            pass


def finished_record(job: Job, name: str) -> dict[str, Any] | None:
    """The done record of shard `name` if it is finished where the job's output is (its files match the record),
    else None. A retried task skips what its first attempt finished."""
    if not is_s3(job.out):
        if not _local_finished(Path(job.out), name):
            return None
        return json.loads(done_path(Path(job.out), name).read_text())
    from audiopipe.storage.s3 import filesystem
    from audiopipe.storage.upload import head, stored_checksum

    root = parse_s3(job.out)
    try:
        with filesystem().open_input_stream(root.child(_rel_done(name)).path) as f:
            rec = json.loads(f.read())
        files = _record_files(rec)
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    # By the checksum each object was uploaded with (one HEAD each); one without it is simply built again.
    for p, b, want in files:
        found = head(root.child(p))
        if found is None or found[0] != b or stored_checksum(found, want.algorithm) != want.hexdigest:
            return None
    return rec


def _record_files(rec: dict[str, Any]) -> list[tuple[str, int, Checksum]]:
    """(path, bytes, checksum) of each file a done record names (KeyError when one lacks a field)."""
    return [(rec[k]["path"], rec[k]["bytes"], checksum_of(rec[k])) for k in ("arrow", "tar") if k in rec]
