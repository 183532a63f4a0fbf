"""`audiopipe verify`: prove a shard folder is intact and sane, naming the shard and sample of every failure.

Checks, in order of cost: the checksum of every file against the manifest (xxh3-128, or sha256 for shards made
before it, and for the length index); the length index against the shards themselves, entry by entry (its
shard and row, id and frame counts: an index rewritten and rehashed into the manifest would otherwise pair one
id with another utterance's features); the Arrow schema's feature hashes against
the manifest; every record decoded with semantic checks (array sizes match frame counts, frame counts match the
duration, no NaN/inf, F0 inside its range); ids and sample keys unique over the whole set, also ignoring case;
every tar member name safe (relative, no '..'), its key the id's key, decoded and compared with its Arrow twin.

An s3:// shard set is checked the same way: each object is downloaded once into a private temp folder, hashed
on the way, checked, and deleted before the next shard (so the disk holds one shard at a time).
"""

from __future__ import annotations

import io
import json
import mmap
import os
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import soundfile as sf

from audiopipe.errors import NotFound
from audiopipe.features.registry import FEATURE_KINDS, build_feature
from audiopipe.shard.checksum import Checksum, checksum_of, new_hash
from audiopipe.shard.columns import ListColumn
from audiopipe.shard.manifest import MANIFEST_NAME, read_manifest
from audiopipe.shard.keys import fold, key_to_id, member_name_problem, sample_key
from audiopipe.shard.writer import FORMAT_VERSION, METADATA_KEY, npy_parts
from audiopipe.storage.scratch import make_scratch, remove_scratch


@dataclass
class VerifyReport:
    shards: int = 0
    records: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, msg: str) -> None:
        self.failures.append(msg)

    def lines(self) -> list[str]:
        head = f"verified {self.shards} shards, {self.records} records: "
        if self.ok:
            return [head + "OK"]
        shown = self.failures[:50]
        more = [f"... and {len(self.failures) - 50} more"] if len(self.failures) > 50 else []
        return [head + f"{len(self.failures)} FAILED"] + [f"  {m}" for m in shown] + more


_FEATURES: dict[str, Any] = {}


def _expected_frames(spec: dict[str, Any], seconds: float) -> int:
    n = int(round(seconds * spec["sample_rate"]))
    if spec["kind"].startswith("encodec"):  # the codec is not in the feature registry: ceil(N / hop) frames
        return -(-n // spec["hop_length"])
    if spec["kind"] not in FEATURE_KINDS:  # semantic tokens and other derived columns: the frame rate is all we know
        return round(n / spec["hop_length"])
    if spec["hash"] not in _FEATURES:
        _FEATURES[spec["hash"]] = build_feature(spec["kind"], **spec["params"])
    return _FEATURES[spec["hash"]].num_frames(n)


def _flat(col: ListColumn) -> tuple[np.ndarray, np.ndarray]:
    """The values the rows hold and offsets from 0 into them (a sliced column's buffer may hold more)."""
    base = int(col.offsets[0])
    return col.values[base:int(col.offsets[-1])], col.offsets - base


def _rows_where(bad: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The rows (sorted, unique) that hold the flat positions where `bad` is true."""
    return np.unique(np.searchsorted(offsets, np.flatnonzero(bad), side="right") - 1)


def _check_column(shard: str, name: str, spec: dict[str, Any], col: ListColumn, ok: np.ndarray,
                  frames: np.ndarray, durations: np.ndarray, ids: list[str], table: pa.Table,
                  voiced: ListColumn | None, voiced_ok: np.ndarray | None, aligned: bool,
                  found: list[tuple[int, int, int, str]], order: int) -> None:
    """The semantic checks of one feature column over a whole shard at once (numpy over the flat values buffer;
    Python per row only for a row's expected frame count). `ok`: the rows whose array has the size its frame
    count says (the others were reported already). Found failures go to `found` as (row, order, step, message),
    so that they are reported row by row, in the order the checks are listed here."""
    values, offsets = _flat(col)
    rows = np.flatnonzero(ok)
    if spec["kind"] == "bert_phones":  # one column per phone (audiopipe.text.bert), not per time step
        phones = table.column("phones_frames").to_numpy() if "phones_frames" in table.column_names else None
        for i in rows:
            if phones is None or frames[i] != phones[i]:
                found.append((i, order, 0, f"{shard} {ids[i]}: bert has {frames[i]} columns for "
                                           f"{None if phones is None else phones[i]} phones"))
        for i in np.intersect1d(_rows_where(~np.isfinite(values), offsets), rows):
            found.append((i, order, 1, f"{shard} {ids[i]}: bert contains NaN or inf"))
        return
    # Frame counts follow from the duration; the hop is the tolerance for float32 seconds and codec rounding.
    derived = spec["kind"] not in FEATURE_KINDS
    for i in rows:
        f = int(frames[i])
        tol = 1 + (2 if aligned else 0) + (2 + f // 50 if derived else 0)
        want = _expected_frames(spec, float(durations[i]))
        if abs(want - f) > tol:
            found.append((i, order, 0, f"{shard} {ids[i]}: {name} has {f} frames but {durations[i]:.3f} s "
                                        f"implies {want}"))
    if np.issubdtype(values.dtype, np.floating):
        for i in np.intersect1d(_rows_where(~np.isfinite(values), offsets), rows):
            found.append((i, order, 1, f"{shard} {ids[i]}: {name} contains NaN or inf"))
    if name == "f0":
        p = spec["params"]
        lo, hi = p.get("fmin", 50.0), p.get("fmax", 1100.0)
        mask = values > 0
        voiced_values, voiced_offsets = _flat(voiced) if voiced is not None else (None, None)
        if voiced is not None and np.array_equal(voiced_offsets, offsets):
            # rows whose voiced column is intact take it as the mask (the others fall back to f0 > 0)
            per_value_ok = np.repeat(voiced_ok, np.diff(offsets))
            mask = np.where(per_value_ok, voiced_values.astype(bool), mask)
        out = mask & ((values < lo * 0.99) | (values > hi * 1.01))
        for i in np.intersect1d(_rows_where(out, offsets), rows):
            found.append((i, order, 2, f"{shard} {ids[i]}: f0 outside [{lo}, {hi}] Hz on voiced frames"))
        if p.get("interpolate"):
            for i in np.intersect1d(_rows_where(values <= 0, offsets), rows):
                found.append((i, order, 3, f"{shard} {ids[i]}: interpolated f0 has frames <= 0"))
    if spec["kind"].startswith("encodec"):
        bad = (values < 0) | (values >= spec["params"].get("codebook_size", 1024))
        for i in np.intersect1d(_rows_where(bad, offsets), rows):
            found.append((i, order, 4, f"{shard} {ids[i]}: codes outside the codebook"))


def _mapped_checksum(path: Path, algorithm: str) -> str:
    """The file's checksum (as file_checksum gives it) hashed through a memory map: read() would copy every byte
    into Python buffers, a third of verify's CPU on the page cache, and verify maps the same pages for the
    records next."""
    h = new_hash(algorithm)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
    return h.hexdigest()


class _Files:
    """The files of a shard set by relative path. Local: in place. s3://: each object downloaded once into a
    private temp folder and hashed on the way; `drop` deletes the copy."""

    def __init__(self, shards_dir: str | Path) -> None:
        from audiopipe.storage.s3 import is_s3, parse_s3

        self.url = parse_s3(shards_dir) if is_s3(shards_dir) else None
        self._sums: dict[str, Checksum] = {}  # taken while downloading
        if self.url is None:
            self.root = Path(shards_dir)
        else:
            from audiopipe.storage.s3 import filesystem

            self.fs = filesystem()
            self.root = make_scratch("verify")

    def manifest(self) -> dict[str, Any]:
        if self.url is not None and self.fetch(MANIFEST_NAME) is None:
            if self.fs.get_file_info(self.url.bucket).type.name == "NotFound":
                raise NotFound(f"{self.url}: bucket {self.url.bucket} does not exist (or these "
                               f"credentials cannot see it)")
            raise NotFound(f"{self.url.child(MANIFEST_NAME)} not found: run `audiopipe shard --out "
                           f"{self.url}` first (or it has not finished)")
        return read_manifest(self.root)

    def fetch(self, rel: str, algorithm: str = "sha256") -> Path | None:
        """The file's local path, or None when it does not exist (an object is hashed with `algorithm` on its
        way down)."""
        dst = self.root / rel
        if self.url is None:
            return dst if dst.exists() else None
        dst.parent.mkdir(parents=True, exist_ok=True)
        h = new_hash(algorithm)
        try:
            with self.fs.open_input_stream(self.url.child(rel).path) as src, open(dst, "wb") as f:
                while block := src.read(1 << 22):
                    h.update(block)
                    f.write(block)
        except FileNotFoundError:
            dst.unlink(missing_ok=True)
            return None
        self._sums[rel] = Checksum(algorithm, h.hexdigest())
        return dst

    def matches(self, rel: str, want: Checksum) -> bool:
        """Whether the file has this checksum (the one taken while downloading it, if of that algorithm)."""
        got = self._sums.pop(rel, None)
        if got is None or got.algorithm != want.algorithm:
            got = Checksum(want.algorithm, _mapped_checksum(self.root / rel, want.algorithm))
        return got == want

    def drop(self, rel: str) -> None:
        if self.url is not None:
            (self.root / rel).unlink(missing_ok=True)

    def close(self) -> None:
        if self.url is not None:
            remove_scratch(self.root)


def verify(shards_dir: str | Path, tars: bool = True, progress: bool = False) -> VerifyReport:
    """Re-read every shard of `shards_dir` against its checksums and rows (tars too, unless tars=False);
    progress=True shows a bar of the utterances checked on stderr."""
    files = _Files(shards_dir)
    try:
        return _verify(files, tars, progress)
    finally:
        files.close()


def _verify(files: _Files, tars: bool, progress: bool = False) -> VerifyReport:
    m = files.manifest()
    specs = m["features"]
    report = VerifyReport()
    aligned = bool(m.get("job", {}).get("align_to"))
    rel = m["index"]["path"]
    index = None
    if files.fetch(rel) is None or not files.matches(rel, Checksum("sha256", m["index"]["sha256"])):
        report.fail(f"{m['index']['path']}: missing or checksum mismatch")
    else:
        index = _read_index(files.root / rel, m, report)
    files.drop(rel)
    first = 0  # the index entry of each shard's first row: shards are listed in manifest order
    version = m.get("format_version")
    if tars and version != FORMAT_VERSION:
        # Version 1 tars used another key rule: comparing them member by member would only list every dotted id.
        report.fail(f"manifest.json: format_version {version}, this audiopipe writes {FORMAT_VERSION} (sample keys "
                    f"changed in version 2); reshard, or verify the Arrow shards alone (tars=False; "
                    f"`audiopipe verify --no-tar`)")
        tars = False
    owner: dict[str, tuple[str, str]] = {}  # folded key -> (shard, id) of its first sample
    from tqdm import tqdm

    with tqdm(total=sum(int(sh.get("rows", 0)) for sh in m["shards"]), unit="utt", desc="verify",
              disable=not progress, file=sys.stderr) as bar:
        for k, sh in enumerate(m["shards"]):
            report.shards += 1
            kinds = ["arrow"] + (["tar"] if tars and "tar" in sh else [])
            try:
                table = _verify_shard(files, sh, specs, kinds, tars, aligned, owner, report)
                if index is not None and table is not None:
                    _check_index_rows(rel, index, first, k, sh, table, report)
                first += int(sh["rows"])
            finally:
                for kind in kinds:
                    files.drop(sh[kind]["path"])
            bar.update(int(sh.get("rows", 0)))
    return report


def _read_index(path: Path, m: dict[str, Any], report: VerifyReport) -> dict[str, np.ndarray] | None:
    """The index's columns (id, shard, row, frame counts), or None (said in the report) when it cannot be
    read or does not list the manifest's rows."""
    try:
        t = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
        cols = {c: t.column(c).to_numpy(zero_copy_only=False) for c in t.column_names
                if c in ("id", "shard", "row") or c.endswith("_frames")}
    except (pa.ArrowInvalid, OSError) as e:
        report.fail(f"{path.name}: unreadable ({e})")
        return None
    total = sum(int(s["rows"]) for s in m["shards"])
    if t.num_rows != total:
        report.fail(f"{path.name}: {t.num_rows} entries, the manifest's shards hold {total}")
        return None
    return cols


def _check_index_rows(rel: str, index: dict[str, np.ndarray], first: int, k: int, sh: dict[str, Any],
                      table: pa.Table, report: VerifyReport) -> None:
    """Index entries first..first+rows-1 must be rows 0..rows-1 of shard k (its place in the manifest): the same
    shard number, row, id and frame counts (the first disagreement is reported)."""
    n = min(int(sh["rows"]), table.num_rows)
    part = {c: v[first:first + n] for c, v in index.items()}
    if "row" in part and not np.array_equal(part["row"], np.arange(n)):
        i = int(np.flatnonzero(part["row"] != np.arange(n))[0])
        report.fail(f"{rel}: entry {first + i} points at row {int(part['row'][i])} of {sh['name']}, where row {i} "
                    f"belongs")
        return
    if "shard" in part and not (part["shard"] == k).all():
        i = int(np.flatnonzero(part["shard"] != k)[0])
        report.fail(f"{rel}: entry {first + i} points at shard {int(part['shard'][i])}, where {sh['name']} belongs")
        return
    for col, want in part.items():
        if col in ("shard", "row") or col not in table.column_names:
            continue
        have = table.column(col).to_numpy(zero_copy_only=False)[:n]
        bad = np.flatnonzero(have != want)
        if bad.size:
            i = int(bad[0])
            said, holds = (v.item() if isinstance(v, np.generic) else v for v in (want[i], have[i]))
            report.fail(f"{rel}: entry {first + i} says {col} {said!r}, {sh['name']} row {i} holds {holds!r} "
                        f"({bad.size} entries of this shard disagree): the index does not describe the shards; "
                        f"rebuild the shard set")


def _verify_shard(files: _Files, sh: dict[str, Any], specs: dict[str, Any], kinds: list[str], tars: bool,
                  aligned: bool, owner: dict[str, tuple[str, str]], report: VerifyReport) -> pa.Table | None:
    name = sh["name"]
    intact = True
    paths: dict[str, Path] = {}
    for kind in kinds:
        try:
            want = checksum_of(sh[kind])
        except KeyError:
            report.fail(f"{name}: {sh[kind]['path']} has no checksum in the manifest")
            intact = False
            continue
        p = files.fetch(sh[kind]["path"], want.algorithm)
        if p is None:
            report.fail(f"{name}: {sh[kind]['path']} is missing")
            intact = False
        elif p.stat().st_size != sh[kind]["bytes"] or not files.matches(sh[kind]["path"], want):
            report.fail(f"{name}: {sh[kind]['path']} checksum mismatch (corrupted, truncated or replaced)")
            intact = False
        else:
            paths[kind] = p
    if not intact:
        return None
    try:
        with pa.memory_map(str(paths["arrow"])) as src:
            reader = pa.ipc.open_file(src)
            table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        report.fail(f"{name}: Arrow file unreadable: {e}")
        return None
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    for fname, spec in specs.items():
        got = meta["features"].get(fname, {}).get("hash")
        if got != spec["hash"]:
            report.fail(f"{name}: feature {fname} hash {got} differs from manifest {spec['hash']}")
    if table.num_rows != sh["rows"]:
        report.fail(f"{name}: {table.num_rows} rows, manifest says {sh['rows']}")
    array_names = [f.name for f in table.schema if pa.types.is_large_list(f.type)]
    channels = {n: specs[n]["channels"] if n in specs else 0 for n in array_names}
    lists = {n: ListColumn(table.column(n), zero_copy_only=False) for n in array_names}
    n_rows = table.num_rows
    ids = table.column("id").to_pylist()
    durations = table.column("duration").to_numpy()
    # Checks run column by column over the whole shard (a Python loop per record costs more than reading its
    # bytes); failures are collected as (row, step, sub-step, message) and reported in row order.
    found: list[tuple[int, int, int, str]] = []
    ok: dict[str, np.ndarray] = {}
    frames: dict[str, np.ndarray] = {}
    for k, n in enumerate(array_names):
        frames[n] = table.column(f"{n}_frames").to_numpy()
        ok[n] = np.diff(lists[n].offsets) == max(channels[n], 1) * frames[n]
        for i in np.flatnonzero(~ok[n]):
            found.append((i, 0, k, f"{name} {ids[i]}: {n} holds {lists[n].offsets[i + 1] - lists[n].offsets[i]} "
                                   f"values, expected {max(channels[n], 1)}x{frames[n][i]}"))
    report.records += n_rows
    for i, rid in enumerate(ids):
        folded = fold(sample_key(rid))
        if folded in owner:
            first_shard, first_id = owner[folded]
            same = "the same id" if first_id == rid else "a key differing only in case or normalisation"
            found.append((i, 1, 0, f"{name} {rid}: {same} as {first_id!r} in {first_shard}: a WebDataset reader "
                                   f"or a case-insensitive disk would merge the two samples"))
        else:
            owner[folded] = (name, rid)
    if "durations" in lists and "phones" in lists:
        ref = next((n for n in ("codes", "f0", "mel") if n in lists), None)
        for i in np.flatnonzero(ok["durations"] & ok["phones"]):
            durs = lists["durations"][i]
            if not durs.size:
                continue
            if durs.size != frames["phones"][i]:
                found.append((i, 2, 0, f"{name} {ids[i]}: {durs.size} durations for {frames['phones'][i]} phones"))
            elif ref and ok[ref][i] and int(durs.sum()) != frames[ref][i]:
                found.append((i, 2, 0, f"{name} {ids[i]}: durations sum to {int(durs.sum())} frames, {ref} has "
                                       f"{frames[ref][i]}"))
    checked = [n for n in specs if n in lists]
    for k, n in enumerate(checked):
        _check_column(name, n, specs[n], lists[n], ok[n], frames[n], durations, ids, table, lists.get("voiced"),
                      ok.get("voiced"), aligned, found, 3 + k)
    for _, _, _, msg in sorted(found, key=lambda f: f[:3]):
        report.fail(msg)
    if tars and "tar" in sh:
        arrow_arrays: dict[str, dict[str, np.ndarray]] = {}
        for i, rid in enumerate(ids):
            arrays = {}
            for n in array_names:
                if ok[n][i]:
                    flat = lists[n][i]
                    arrays[n] = flat.reshape(channels[n], frames[n][i]) if channels[n] else flat
            arrow_arrays[sample_key(rid)] = arrays
        _verify_tar(name, paths["tar"], arrow_arrays, specs, report)
    return table


def _same_npy(data: bytes, ref: np.ndarray, headers: dict[tuple[str, tuple[int, ...]], bytes]) -> bool:
    """Whether a .npy member is byte for byte what the writer stores for `ref` (then it decodes to `ref`). The
    header is made once per dtype and shape: np.load parses every header with ast.literal_eval, which on small
    records costs more than the rest of verify together."""
    key = (ref.dtype.str, ref.shape)
    head = headers.get(key)
    if head is None:
        head = headers[key] = npy_parts(ref)[0]
    return len(data) == len(head) + ref.nbytes and data.startswith(head) and data[len(head):] == ref.tobytes()


def _verify_tar(name: str, path: Path, arrow_arrays: dict[str, dict[str, np.ndarray]], specs: dict[str, Any],
                report: VerifyReport) -> None:
    """Every member safe, once, of a sample the Arrow shard holds, and equal to its Arrow twin. A .npy member
    equal byte for byte to the writer's bytes for that array passes without decoding; any other is decoded and
    compared, as a reader would (so an equal array stored another way still passes)."""
    seen: set[str] = set()
    names: set[str] = set()
    headers: dict[tuple[str, tuple[int, ...]], bytes] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as whole, \
            tarfile.open(fileobj=f) as tar:
        for member in tar:
            problem = member_name_problem(member.name)
            if problem or not member.isfile():
                report.fail(f"{name} tar {member.name!r}: unsafe member ({problem or 'not a regular file'})")
                continue
            if member.name in names:
                report.fail(f"{name} tar {member.name}: appears twice (two samples share a key)")
                continue
            names.add(member.name)
            # WebDataset's rule: the key ends at the first dot of the basename.
            folder, _, base = member.name.rpartition("/")
            stem, _, ext = base.partition(".")
            key = f"{folder}/{stem}" if folder else stem
            data = whole[member.offset_data:member.offset_data + member.size]  # the payload, without a file object
            seen.add(key)
            if key not in arrow_arrays:
                report.fail(f"{name} tar {member.name}: sample not in the Arrow shard")
                continue
            if ext.endswith(".npy"):
                ref = arrow_arrays[key].get(ext.removesuffix(".npy"))
                if ref is not None and _same_npy(data, ref, headers):
                    continue
            try:
                if ext == "json":
                    sample_id = json.loads(data).get("id")
                    if sample_id != key_to_id(key):
                        report.fail(f"{name} tar {member.name}: holds id {sample_id!r}, its key names "
                                    f"{key_to_id(key)!r}")
                    continue
                if ext == "flac":
                    feat, arr = "pcm", sf.read(io.BytesIO(data), dtype="int16")[0]
                else:
                    feat = ext.removesuffix(".npy")
                    arr = np.load(io.BytesIO(data), allow_pickle=False)
            except Exception as e:
                report.fail(f"{name} tar {member.name}: undecodable ({type(e).__name__}: {e})")
                continue
            ref = arrow_arrays[key].get(feat)
            if ref is None or ref.shape != arr.shape or not np.array_equal(ref, arr):
                report.fail(f"{name} tar {member.name}: differs from the Arrow record")
    missing = set(arrow_arrays) - seen
    if missing:
        report.fail(f"{name} tar: {len(missing)} samples missing, e.g. {sorted(missing)[0]}")
