"""Find the audio files of a corpus, read their headers (no decode), attach transcripts and speakers.

Every file found either becomes an `Utterance` or a `Reject` with a reason; discovery never raises for a bad
audio file. Layouts, transcript precedence and speaker rules are described in docs/corpus.md.
"""

from __future__ import annotations

import gc
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Iterable, Iterator

import soundfile as sf

from audiopipe.corpus.entries import resolve
from audiopipe.corpus.hints import finish
from audiopipe.corpus.layouts import discover_layout, pick_layout
from audiopipe.corpus.manifests import kind_of, read
from audiopipe.corpus.manifests.plain import ManifestRow, read_manifest
from audiopipe.corpus.options import CorpusOptions
from audiopipe.corpus.records import Reject, Utterance, id_problem, unique_ids
from audiopipe.corpus.transcripts import METADATA_NAME, MetadataIndex, find_sidecar, read_text_file
from audiopipe.corpus.wavheader import read_wav_header
from audiopipe.decode.audio import RejectError, read_info
from audiopipe.errors import InvalidValue, NotAFolder
from audiopipe.storage import guard

# Extensions of each libsndfile major format. RAW is left out on purpose: headerless files cannot be read
# without being told their layout.
_FORMAT_EXTENSIONS: dict[str, tuple[str, ...]] = {
    "WAV": ("wav", "wave"), "WAVEX": ("wav",), "RF64": ("rf64", "wav"), "W64": ("w64",),
    "AIFF": ("aiff", "aif", "aifc"), "AU": ("au", "snd"), "CAF": ("caf",), "FLAC": ("flac",),
    "OGG": ("ogg", "oga", "opus"), "MP3": ("mp3",), "NIST": ("nist", "sph"), "IRCAM": ("sf", "ircam"),
    "SVX": ("svx", "iff", "8svx"), "MAT4": ("mat",), "MAT5": ("mat",), "HTK": ("htk",), "VOC": ("voc",),
    "AVR": ("avr",), "PAF": ("paf",), "PVF": ("pvf",), "SD2": ("sd2",), "SDS": ("sds",), "XI": ("xi",),
    "WVE": ("wve",), "MPC2K": ("mpc2k",),
}
_NOT_DISCOVERED = {"RAW"}


def audio_extensions() -> frozenset[str]:
    """Lower-case extensions (no dot) of every format the installed libsndfile reads."""
    exts: set[str] = set()
    for fmt in sf.available_formats():
        if fmt in _NOT_DISCOVERED:
            continue
        exts.update(_FORMAT_EXTENSIONS.get(fmt, (fmt.lower(),)))
    return frozenset(exts)


@dataclass
class Discovery:
    root: str
    utterances: list[Utterance]  # sorted by id
    rejects: list[Reject]  # sorted by source
    # What the user should hear about once (split-named speaker folders, utterances without transcripts,
    # manifest columns not written, recordings left out): one sentence each.
    notes: list[str] = field(default_factory=list)
    # Why nothing usable was found and what to do about it ("found 3 parquet files: use --manifest ...");
    # "" when there are utterances.
    hint: str = ""
    # Metadata read from the manifest or index files that the utterances do not carry (named in a note).
    unused_columns: set[str] = field(default_factory=set)
    walked: bool = False  # the files were found by walking the root (no layout, no manifest)

    @property
    def discovered(self) -> int:
        """Files seen: len(utterances) + len(rejects)."""
        return len(self.utterances) + len(self.rejects)

    @property
    def untranscribed(self) -> int:
        """Utterances without a transcript."""
        return sum(1 for u in self.utterances if not u.text)


@dataclass(slots=True)
class _Candidate:
    path: str  # absolute
    source: str  # relative to root (or as written in the manifest when outside the root)
    id: str
    names_in_dir: set[str] | None = None
    row: ManifestRow | None = None
    inside: bool = True  # under the root (a manifest may list files elsewhere)


def _rel(path: str, root: str) -> str:
    return PurePosixPath(*os.path.relpath(path, root).split(os.sep)).as_posix()


def _walk(root: str, exts: frozenset[str]) -> tuple[list[_Candidate], list[Reject]]:
    """Audio files under root, following symlinks but entering each real directory once (no loops)."""
    found: list[_Candidate] = []
    unlisted: list[Reject] = []
    seen_dirs: set[tuple[int, int]] = set()

    def cannot_list(err: OSError) -> None:  # os.walk would skip such a folder silently
        where = err.filename or root
        unlisted.append(Reject(where, _rel(where, root) + "/", "unreadable", f"cannot list the folder: {err}"))

    for folder, dirnames, filenames in os.walk(root, followlinks=True, onerror=cannot_list):
        st = os.stat(folder)
        key = (st.st_dev, st.st_ino)
        if key in seen_dirs:  # a symlink back to a folder already walked: skip it and its subtree
            dirnames[:] = []
            continue
        seen_dirs.add(key)
        # Hidden entries (.git, macOS ._x.wav resource forks) are never corpus audio.
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        names = set(filenames)
        rel_dir = _rel(folder, root)  # once per folder: path arithmetic per file costs as much as its header
        bad_dir = guard.name_problem(rel_dir)
        for name in sorted(filenames):
            if name.startswith(".") or "." not in name or name.rsplit(".", 1)[1].lower() not in exts:
                continue
            path = os.path.join(folder, name)
            source = name if rel_dir == "." else f"{rel_dir}/{name}"
            # A name that is not UTF-8 cannot become an id, an Arrow string or a JSON record: refuse it here,
            # printable, rather than fail the job when the shards are written.
            bad_name = bad_dir or guard.name_problem(name)
            if bad_name:
                unlisted.append(Reject(guard.shown(path), guard.shown(source), "bad_encoding", bad_name))
                continue
            found.append(_Candidate(path, source, source.rsplit(".", 1)[0], names))
    return found, unlisted


def _from_manifest(root: str, manifest: str) -> tuple[list[_Candidate], list[Reject]]:
    cands: list[_Candidate] = []
    rejects: list[Reject] = []
    real_root = os.path.realpath(root)
    for row in read_manifest(manifest):
        if row.problem is not None and row.path == os.path.abspath(manifest):  # the line names no audio
            rejects.append(Reject(row.path, row.written_path, *row.problem))
            continue
        inside = row.path.startswith(root + os.sep)
        source = _rel(row.path, root) if inside else row.written_path.replace(os.sep, "/")
        if not inside:  # the root or the listed path may go through a symlink: compare real paths too
            real = os.path.realpath(row.path)
            if real.startswith(real_root + os.sep):
                inside, source = True, _rel(real, real_root)
        if row.problem is not None:
            rejects.append(Reject(row.path, source, *row.problem))
            continue
        uid = row.id
        problem = id_problem(uid) if uid is not None else None
        if problem:
            rejects.append(Reject(row.path, source, "bad_id", f"{manifest}:{row.line}: id {uid!r} {problem}"))
            continue
        if uid is None:
            if not inside:
                rejects.append(Reject(row.path, source, "outside_root",
                                      f"{manifest}:{row.line}: {row.written_path} is not under the corpus root "
                                      f"{root}; give it an 'id' column"))
                continue
            uid = source.rsplit(".", 1)[0] if "." in PurePosixPath(source).name else source
        cands.append(_Candidate(row.path, source, uid, None, row, inside))
    return cands, rejects


def _parse_speaker_rule(speaker: str) -> int | None:
    """-1 for auto, N for dir:N, None for none."""
    if speaker == "auto":
        return -1
    if speaker == "none":
        return None
    if speaker.startswith("dir:") and speaker[4:].isdigit():
        return int(speaker[4:])
    raise InvalidValue(f"speaker must be 'auto', 'none' or 'dir:N' (N = folder depth, 0 = first folder under "
                       f"the root), got {speaker!r}")


def _speaker_from_path(source: str, rule: int | None, root: str, meta: MetadataIndex) -> str:
    folders = source.split("/")[:-1]  # sources are '/'-separated; PurePosixPath per file costs as much as a header
    if rule is None:
        return ""
    if rule >= 0:
        return folders[rule] if rule < len(folders) else ""
    # auto: the first folder, except an LJSpeech `wavs/` folder, which sits beside its metadata.csv.
    if folders and folders[0] == "wavs" and meta.has_csv(root):
        return ""
    return folders[0] if folders else ""


# Header reads are small blocking reads (a page from local disk, a round trip on NFS/Lustre/FUSE mounts of
# object storage); os.read and libsndfile run without the GIL, so threads overlap them. Below this many files a
# pool costs more than it saves. Work goes to the threads in blocks: one future per file costs ~1 KB and a
# hand-over, which at a million files is more than the header itself.
PARALLEL_HEADERS_FROM = 64
DEFAULT_HEADER_THREADS = 16
_BLOCK = 256
_WAV_EXTS = ("wav", "wave")


def _read_one(c: _Candidate) -> tuple[Any, str | None, guard.Refused | None]:
    """(info or RejectError, own transcript, why the sidecar was refused): everything per file that touches
    storage."""
    # A plain PCM WAV is read directly (5x less Python than a SoundFile open); anything else by libsndfile.
    info = read_wav_header(c.path) if c.source.rsplit(".", 1)[-1].lower() in _WAV_EXTS else None
    if info is None:
        try:
            info = read_info(c.path)
        except RejectError as e:
            return e, None, None
    if info.frames <= 0:
        return info, None, None
    try:
        return info, _own_transcript(c), None
    except guard.Refused as e:  # a sidecar that is a pipe, too large, or not UTF-8: this file only
        return info, None, e


def _read_block(block: list[_Candidate]) -> list[tuple[Any, str | None, Exception | None]]:
    return [_read_one(c) for c in block]


def _read_all(cands: list[_Candidate], threads: int) -> Iterator[tuple[Any, str | None, Exception | None]]:
    """_read_one for every candidate, in the candidates' order (so the result never depends on timing). Results
    are yielded as they come in, so the caller's decisions overlap the reads still running; at most a few
    blocks per thread are in flight, so memory does not grow with the corpus."""
    if threads <= 1 or len(cands) < PARALLEL_HEADERS_FROM:
        yield from map(_read_one, cands)
        return
    size = max(1, min(_BLOCK, len(cands) // (4 * threads)))  # a small corpus still reaches every thread
    blocks = (cands[i:i + size] for i in range(0, len(cands), size))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="headers") as pool:
        pending: deque = deque()
        for block in blocks:
            pending.append(pool.submit(_read_block, block))
            if len(pending) >= 2 * threads:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def discover(root: str | os.PathLike[str], *, manifest: Any = None, speaker: str = "auto",
             exts: Iterable[str] | None = None, layout: str = "auto", header_threads: int = DEFAULT_HEADER_THREADS,
             options: Any = None) -> Discovery:
    """Describe the corpus under `root`: sorted utterances and the files that were refused.

    manifest: a manifest path, or several (then nothing is walked): audiopipe's JSONL/CSV/TSV, lhotse
    recordings + supervisions / cuts / a Shar folder, NeMo JSONL, a Common Voice TSV, Hugging Face parquet /
    Arrow / save_to_disk (audiopipe.corpus.manifests); speaker: 'auto', 'dir:N' or 'none'; exts: audio
    extensions to walk for (default: every format libsndfile reads); layout: 'auto' (detect a layout with index
    files, else walk), 'files' (walk), or a layout name; header_threads: headers and sidecar transcripts read at
    once (1: one by one; the result is the same either way); options: audiopipe.corpus.options.CorpusOptions
    (column names, VCTK microphone, --keep-columns, --require-text).
    """
    options = options if options is not None else CorpusOptions()
    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise NotAFolder(f"corpus root is not a directory: {root}")
    rule = _parse_speaker_rule(speaker)
    # Discovery builds a few objects per file and frees none until it returns: the cyclic garbage collector
    # would scan them all again and again (a third of the time at 1M files) for cycles that are not there.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        d = _discover(root, manifest, rule, exts, layout, header_threads, options)
        return finish(d, options, speaker_auto=rule == -1, manifest_given=manifest is not None)
    finally:
        if was_enabled:
            gc.enable()


def _manifest_paths(manifest: Any) -> list[str]:
    if isinstance(manifest, (str, os.PathLike)):
        return [os.path.abspath(os.fspath(manifest))]
    return [os.path.abspath(os.fspath(m)) for m in manifest]


def _discover(root: str, manifest: Any, rule: int | None, exts: Iterable[str] | None, layout: str,
              header_threads: int, options: Any) -> Discovery:
    if manifest is None:
        chosen = pick_layout(root, layout)
        if chosen is not None:  # a layout with its own index files (audiopipe/corpus/layouts/)
            utts, rejected, notes = discover_layout(chosen, root, rule, options)
            return Discovery(root, sorted(utts, key=lambda u: u.id),
                             sorted(rejected, key=lambda r: (r.source, r.reason)), notes)
        d = _discover_files(root, None, rule, exts, header_threads)
        d.walked = True
        return d
    by_kind: dict[str, list[str]] = {}
    for p in _manifest_paths(manifest):
        by_kind.setdefault(kind_of(p), []).append(p)
    plain = by_kind.pop("plain", None)
    d = _discover_files(root, plain, rule, exts, header_threads) if plain else Discovery(root, [], [])
    if not by_kind:
        return d
    utts, rejects, notes, unused = list(d.utterances), list(d.rejects), list(d.notes), set()
    for kind, paths in by_kind.items():
        got = read(kind, paths, root, rule, options)
        u, r = resolve(got.entries, header_threads)
        utts += u
        rejects += got.rejects + r
        notes += got.notes
        unused |= got.unused
    utts = unique_ids(utts, rejects, "manifest")
    return Discovery(root, utts, sorted(rejects, key=lambda r: (r.source, r.reason)), notes,
                     unused_columns=unused)


def _discover_files(root: str, manifests: list[str] | None, rule: int | None, exts: Iterable[str] | None,
                    header_threads: int) -> Discovery:
    """A walk of the root (manifests None), or the files that audiopipe's own manifests list."""
    ext_set = frozenset(e.lower().lstrip(".") for e in exts) if exts is not None else audio_extensions()
    if not ext_set:
        raise InvalidValue("exts is empty: no file could be discovered")
    meta = MetadataIndex(ext_set)

    rejects: list[Reject] = []
    if manifests is not None:
        cands = []
        for m in manifests:
            c, r = _from_manifest(root, m)
            cands += c
            rejects += r
    else:
        cands, rejects = _walk(root, ext_set)

    utterances: list[Utterance] = []
    seen: dict[str, str] = {}
    speakers: dict[str, str] = {}  # one string per speaker, not one per file
    # Sorting by source makes the duplicate rule deterministic: of a.flac and a.wav, a.wav is refused.
    cands = sorted(cands, key=lambda c: (c.source, c.id))
    # metadata.csv lookups cost ~0.3 ms of path arithmetic per file: skip them when no folder from the root
    # down to the audio holds one (files listed by a manifest outside the root are always looked up).
    csv_folders = _folders_with_metadata(root, cands)
    # Storage is read for all files first, in parallel; the decisions below stay sequential and in order.
    for c, (info, text, text_error) in zip(cands, _read_all(cands, header_threads)):
        if c.id in seen:
            rejects.append(Reject(c.path, c.source, "duplicate_id",
                                  f"id {c.id!r} is already used by {seen[c.id]}"))
            continue
        if isinstance(info, RejectError):
            rejects.append(Reject(c.path, c.source, info.reason, info.detail))
            continue
        if info.frames <= 0:
            rejects.append(Reject(c.path, c.source, "empty", "the header declares no audio frames"))
            continue
        if text_error is not None:  # an unreadable sidecar concerns one file only
            rejects.append(Reject(c.path, c.source, text_error.reason, text_error.detail))
            continue
        if text is None:
            # A malformed metadata.csv is not caught: it concerns every file it lists, so discovery stops
            # with its file:line message instead of refusing each file.
            text = (meta.lookup(c.path, root) or "") if csv_folders or not c.inside else ""
        if c.row is not None and c.row.speaker is not None:
            spk = c.row.speaker
        else:
            spk = _speaker_from_path(c.source, rule, root, meta) if c.inside else ""
            spk = speakers.setdefault(spk, spk)
        seen[c.id] = c.source
        utterances.append(Utterance(
            id=c.id, path=c.path, source=c.source, speaker=spk, text=text,
            sample_rate=int(info.samplerate), num_samples=int(info.frames), channels=int(info.channels),
            duration=float(info.frames) / float(info.samplerate) if info.samplerate > 0 else 0.0,
            extra=dict(c.row.extra) if c.row is not None else {},
        ))

    utterances.sort(key=lambda u: u.id)
    rejects.sort(key=lambda r: (r.source, r.reason))
    return Discovery(root=root, utterances=utterances, rejects=rejects)


def _folders_with_metadata(root: str, cands: list[_Candidate]) -> bool:
    """Whether a metadata.csv sits in the root or any folder between it and a candidate (a stat per folder)."""
    folders = {root}
    # The distinct folders first (a string slice per file), then their ancestors (path arithmetic per folder).
    for d in {c.path[:c.path.rfind(os.sep)] for c in cands if c.inside}:
        while d not in folders and len(d) > len(root):
            folders.add(d)
            d = os.path.dirname(d)
    return any(os.path.exists(os.path.join(d, METADATA_NAME)) for d in folders)


def _own_transcript(c: _Candidate) -> str | None:
    """Text from the manifest row, else from a sidecar file; None sends the lookup on to metadata.csv."""
    if c.row is not None and c.row.text is not None:
        return c.row.text
    sidecar = find_sidecar(c.path, c.names_in_dir)
    # An empty sidecar counts as absent, like an empty manifest cell (and so does one deleted since the listing).
    return (read_text_file(sidecar) or None) if sidecar is not None else None
