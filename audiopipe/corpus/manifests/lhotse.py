"""lhotse manifests, parsed by lhotse itself (the `lhotse` extra, imported only when such a manifest is given).

- **Recordings + supervisions** (what `lhotse prepare <corpus>` writes: `<corpus>_recordings_<part>.jsonl.gz`
  and `<corpus>_supervisions_<part>.jsonl.gz`): one utterance per supervision, the stretch
  [start, start + duration) of its recording, with its text, speaker, language and custom fields. Supervisions
  covering a whole recording give the whole file; shorter ones are read from the recording by seeking in it
  (audiopipe.decode.segments). Recordings without supervisions are left out (a note says
  how many); recordings alone (no supervisions given) are whole-file utterances without text.
- **A CutSet** (`cuts.jsonl.gz`): one utterance per cut, [cut.start, cut.end) of its recording, text the
  cut's supervisions' texts in time order, speaker theirs when they agree.
- **A Shar folder** (`cuts.000000.jsonl.gz` + `recording.000000.tar`, ...): the cuts, with their audio read
  in place from the uncompressed tars (audiopipe.decode.members), nothing unpacked.

Relative paths in recordings are read from the current folder, as lhotse reads them. Refused with a reject,
never guessed: a recording whose audio is a URL (no network at run time), a command (never run), bytes inside
the manifest, several files, or changed by transforms (speed, volume, resampling) that audiopipe would not
apply; a supervision of one channel of a multi-channel recording (audiopipe mixes channels to mono, which would
add the other channels' speech); a MixedCut or PaddingCut; a supervision whose recording no manifest lists.
"""

from __future__ import annotations

import os
from typing import Any

from audiopipe.corpus.entries import Entry, resolve_path
from audiopipe.corpus.hints import USED_EXTRA
from audiopipe.corpus.listings import json_objects, plain_value, regular_file, text_of
from audiopipe.corpus.manifests.common import Read, source_of
from audiopipe.corpus.tarmembers import Member, list_members
from audiopipe.errors import InvalidValue
from audiopipe.storage import guard


def _load(path: str) -> Any:
    from lhotse.serialization import load_manifest_lazy_or_eager

    try:
        return load_manifest_lazy_or_eager(path)
    except Exception as e:  # lhotse raises many kinds for a malformed manifest
        raise InvalidValue(f"{path}: lhotse cannot read it as a manifest ({type(e).__name__}: {e})") from None


def _is_jsonl(path: str) -> bool:
    return path.lower().removesuffix(".gz").endswith((".jsonl", ".ndjson"))


class _Bad:
    """A manifest line lhotse cannot parse: rejected alone (`where` names the file and line)."""

    def __init__(self, where: str, reason: str, detail: str) -> None:
        self.where, self.reason, self.detail = where, reason, detail


def _rows(path: str) -> Any:
    """(where, item or _Bad) of a lhotse manifest, `where` being `<file>:<line>`. A JSON-lines manifest is read
    line by line (audiopipe.corpus.listings.json_objects) and each line parsed by lhotse's own
    deserialize_item, so that a line it cannot parse is one reject, never the whole manifest; another format
    (a .json list, .yaml) is lhotse's to read whole."""
    from lhotse.serialization import deserialize_item

    name = os.path.basename(path)
    if not _is_jsonl(path):
        m = _load(path)
        for n, item in enumerate(_items(m, path) if m is not None else ()):
            yield f"{name}:{n + 1}", item
        return
    for n, rec in json_objects(path):
        where = f"{name}:{n}"
        if isinstance(rec, guard.Refused):
            yield where, _Bad(where, rec.reason, rec.detail)
            continue
        try:
            yield where, deserialize_item(rec)
        except Exception as e:  # lhotse raises many kinds for a malformed item
            first = (str(e).strip().splitlines() or [""])[0][:200]
            yield where, _Bad(where, "bad_value", f"{where}: lhotse cannot read this line ({type(e).__name__}: "
                                                  f"{first})")


def _file(where: str) -> str:
    """The manifest file name of a `<file>:<line>`."""
    return where.rsplit(":", 1)[0]


def _items(manifest: Any, path: str) -> Any:
    """The items of a (lazily read) lhotse manifest; an item lhotse cannot parse stops with one line naming the
    manifest, as a malformed index does (lhotse parses a lazy manifest while it is iterated)."""
    it = iter(manifest)
    n = 0
    while True:
        try:
            item = next(it)
        except StopIteration:
            return
        except Exception as e:  # lhotse raises many kinds for a malformed item
            raise InvalidValue(f"{path}: lhotse cannot read item {n + 1} ({type(e).__name__}: {e})") from None
        n += 1
        yield item


def _metadata(sups: list[Any], extra: dict[str, Any], keep: set[str], unused: set[str]) -> None:
    """Language (used by --language auto), then gender and custom fields if kept, else named as unused."""
    for s in sups:
        if s.language and "language" not in extra:
            extra["language"] = s.language
        fields = {"gender": s.gender, **(s.custom or {})}
        for k, v in fields.items():
            if v is None:
                continue
            if k in keep and plain_value(v):
                extra.setdefault(k, v)
            elif k not in USED_EXTRA:
                unused.add(k)
        if s.alignment:
            unused.add("alignment")


def _audio(rec: Any, where: str, cwd: str) -> tuple[str | None, tuple[str, str] | None]:
    """(path, None) of a recording's one audio file, or (None, (reason, detail)) when it cannot be read as one."""
    if rec.transforms:
        names = ", ".join(t.get("name", "?") if isinstance(t, dict) else type(t).__name__ for t in rec.transforms)
        return None, ("lhotse_transform", f"recording {rec.id} is changed by lhotse transforms ({names}) that "
                                          f"audiopipe does not apply; write the transformed audio to files first")
    if len(rec.sources) != 1:
        return None, ("lhotse_source", f"recording {rec.id} has {len(rec.sources)} audio sources (a file per "
                                       f"channel); audiopipe reads one file per recording")
    src = rec.sources[0]
    if src.type == "file":
        path = resolve_path(str(src.source), cwd)
        if not os.path.isabs(str(src.source)) and not os.path.lexists(path):
            return None, ("missing", f"recording {rec.id}: {src.source} is not found from the current folder "
                                     f"{cwd}; lhotse reads relative paths from where `lhotse prepare` ran: run "
                                     f"from there")
        return path, None
    why = {"url": "is a URL (audiopipe reads local files only: download it first)",
           "command": "is read through a command, and commands found in data files are not run (write the "
                      "audio to files first)"}.get(src.type, f"is held inside the manifest ({src.type!r} source): "
                                                         f"write it to files first")
    return None, ("lhotse_source", f"recording {rec.id} {why}")


def _one_channel_of_many(rec: Any, channel: Any) -> bool:
    if rec.num_channels <= 1 or channel is None:
        return False
    chosen = set(channel) if isinstance(channel, (list, tuple)) else {channel}
    return chosen != set(rec.channel_ids)


def _channel_problem(rec: Any, channel: Any, what: str) -> tuple[str, str]:
    return ("lhotse_channel", f"{what} is channel {channel} of the {rec.num_channels}-channel recording "
                              f"{rec.id}; audiopipe mixes channels to mono, which would add the other channels")


def _sibling_supervisions(path: str) -> str | None:
    name = os.path.basename(path)
    if "_recordings_" not in name and "recordings" not in name:
        return None
    other = os.path.join(os.path.dirname(path), name.replace("recordings", "supervisions", 1))
    return other if os.path.isfile(other) else None


def read(paths: list[str], root: str, options: Any) -> Read:
    out = Read()
    keep = set(options.keep_columns)
    cwd = os.getcwd()
    recordings: dict[str, tuple[Any, str]] = {}
    supervisions: list[tuple[Any, str]] = []
    recording_files: list[str] = []
    from lhotse import Recording, SupervisionSegment
    from lhotse.cut import Cut

    for p in paths:
        p = regular_file(p)
        name = os.path.basename(p)
        items = 0
        for where, item in _rows(p):
            items += 1
            if isinstance(item, _Bad):
                out.entries.append(Entry(p, where, where, None, problem=(item.reason, item.detail)))
            elif isinstance(item, Recording):
                if p not in recording_files:
                    recording_files.append(p)
                if item.id in recordings:  # never dropped silently: the second of an id is refused
                    out.entries.append(Entry(p, where, where, item.id, problem=(
                        "duplicate_id", f"{where}: recording id {item.id!r} is listed already "
                                        f"({recordings[item.id][1]}); the first is kept")))
                    continue
                recordings[item.id] = (item, where)
            elif isinstance(item, SupervisionSegment):
                supervisions.append((item, where))
            elif isinstance(item, Cut):
                out.entries.append(_cut_entry(item, where, root, cwd, keep, out))
            else:
                raise InvalidValue(f"{p}: a lhotse {type(item).__name__} holds no audio; give recordings + "
                                   f"supervisions or cuts")
        if items == 0:
            out.notes.append(f"{name} is an empty lhotse manifest")
    if supervisions and not recordings:
        raise InvalidValue("lhotse supervisions name their audio by recording id only: give the recordings "
                           "manifest too (manifest='<corpus>_recordings_<part>.jsonl.gz')")
    # Recordings alone are whole-file utterances only when nothing but recordings was given (a supervisions
    # manifest whose every line was refused still says that the recordings are to be cut).
    if recordings and not supervisions and len(recording_files) == len(paths):
        hint = next((s for s in map(_sibling_supervisions, recording_files) if s), None)
        out.notes.append(f"only lhotse recordings were given: {len(recordings)} whole recordings without text "
                         f"or speaker" + (f" (add manifest='{hint}')" if hint else ""))
        for rec, name in recordings.values():
            path, problem = _audio(rec, f"{name}", cwd)
            e = Entry(path or name, source_of(path, root, path) if path else f"{_file(name)}#{rec.id}",
                      f"{name}: recording {rec.id}", rec.id, problem=problem)
            out.entries.append(e)
        return out
    used: set[str] = set()
    for sup, name in supervisions:
        where = f"{name}: supervision {sup.id}"
        got = recordings.get(sup.recording_id)
        if got is None:
            out.entries.append(Entry(sup.recording_id, f"{_file(name)}#{sup.id}", where, sup.id, problem=(
                "lhotse_missing_recording", f"it cuts recording {sup.recording_id!r}, which no recordings "
                                            f"manifest given lists")))
            continue
        rec = got[0]
        used.add(rec.id)
        path, problem = _audio(rec, where, cwd)
        if problem is None and _one_channel_of_many(rec, sup.channel):
            problem = _channel_problem(rec, sup.channel, f"supervision {sup.id}")
        extra: dict[str, Any] = {}
        try:
            _metadata([sup], extra, keep, out.unused)
            text, speaker, start, end = (text_of(sup.text), text_of(sup.speaker, "speaker"), *_span(sup))
        except (TypeError, ValueError) as e:  # a text that is a list, a start that is not a number
            text, speaker, start, end = "", "", None, None
            problem = problem or (getattr(e, "reason", "bad_value"), str(e))
        out.entries.append(Entry(path or rec.id, source_of(path, root, path) if path else f"{_file(name)}#{sup.id}",
                                 where, sup.id, text, speaker, start, end, extra, problem=problem))
    if len(used) < len(recordings):
        out.notes.append(f"{len(recordings) - len(used)} lhotse recordings have no supervision and are left out")
    return out


def _cut_texts(cut: Any, keep: set[str], out: Read) -> tuple[str, str, dict[str, Any]]:
    sups = sorted(cut.supervisions, key=lambda s: (float(s.start), str(s.id)))
    text = " ".join(t for t in (text_of(s.text) for s in sups) if t)
    speakers = {text_of(s.speaker, "speaker") for s in sups if s.speaker}
    extra: dict[str, Any] = {}
    _metadata(sups, extra, keep, out.unused)
    for k, v in (cut.custom or {}).items():
        if k in keep and plain_value(v):
            extra.setdefault(k, v)
        elif k not in USED_EXTRA:
            out.unused.add(k)
    return text, speakers.pop() if len(speakers) == 1 else "", extra


def _cut_entry(cut: Any, name: str, root: str, cwd: str, keep: set[str], out: Read) -> Entry:
    from lhotse.cut.data import DataCut

    where = f"{name}: cut {cut.id}"
    name = _file(name)
    if not isinstance(cut, DataCut):
        return Entry(name, f"{name}#{cut.id}", where, cut.id, problem=(
            "lhotse_cut", f"a {type(cut).__name__} mixes or pads several recordings; write its audio to files "
                          f"first (CutSet.save_audios)"))
    if cut.recording is None:
        return Entry(name, f"{name}#{cut.id}", where, cut.id, problem=("lhotse_no_audio", "the cut has no recording"))
    path, problem = _audio(cut.recording, where, cwd)
    if problem is None and _one_channel_of_many(cut.recording, cut.channel):
        problem = _channel_problem(cut.recording, cut.channel, f"cut {cut.id}")
    try:
        text, speaker, extra = _cut_texts(cut, keep, out)
        start, end = _span(cut)
    except (TypeError, ValueError) as e:
        text, speaker, extra, start, end = "", "", {}, None, None
        problem = problem or (getattr(e, "reason", "bad_value"), str(e))
    return Entry(path or name, source_of(path, root, path) if path else f"{name}#{cut.id}", where, cut.id, text,
                 speaker, start, end, extra, problem=problem)


def _span(item: Any) -> tuple[float, float]:
    """[start, start + duration) of a supervision or cut, in seconds; ValueError when they are not numbers (a
    nan or inf is left to the cut, which refuses it as `bad_segment`)."""
    if isinstance(item.start, bool) or isinstance(item.duration, bool):
        raise InvalidValue("start and duration must be seconds")
    try:
        start, duration = float(item.start), float(item.duration)
    except (TypeError, ValueError):
        raise InvalidValue(f"start and duration must be seconds, got {item.start!r:.40} and {item.duration!r:.40}") \
            from None
    return start, start + duration


# ---------------------------------------------------------------------------------------------------- Shar

def _shar_parts(folder: str) -> list[tuple[str, str]]:
    """(cuts file, recording tar) of each shard of a Shar folder, in shard order."""
    parts = []
    for n in sorted(os.listdir(folder)):
        if n.startswith("cuts.") and (n.endswith(".jsonl.gz") or n.endswith(".jsonl")):
            suffix = n[len("cuts"):].split(".jsonl")[0]  # ".000000", or "" without sharding
            parts.append((os.path.join(folder, n), os.path.join(folder, f"recording{suffix}.tar")))
    return parts


def _tar_members(tar: str) -> tuple[dict[str, Member], dict[str, tuple[str, str]], str | None]:
    """({cut id: audio member}, {cut id: (reason, detail) of its refused member}, damage) of an uncompressed Shar
    tar (`<cut id>.<format>` beside `<cut id>.json`), listed by audiopipe.corpus.tarmembers."""
    listing = list_members(tar, "Shar recording tar")
    members: dict[str, Member] = {}
    for m in listing.members:
        key, dot, ext = m.name.rpartition(".")
        if dot and ext not in ("json", "nometa"):
            members.setdefault(key, m)
    refused = {name.rpartition(".")[0]: (reason, detail) for name, reason, detail in listing.refused}
    return members, refused, listing.damage


def read_shar(paths: list[str], root: str, options: Any) -> Read:
    from lhotse.cut.data import DataCut

    out = Read()
    keep = set(options.keep_columns)
    for folder in paths:
        folder = os.path.abspath(folder)
        parts = _shar_parts(folder)
        if not any(os.path.isfile(t) for _, t in parts):
            gz = [n for n in os.listdir(folder) if n.startswith("recording.") and n.endswith(".tar.gz")]
            raise InvalidValue(f"{folder}: this lhotse Shar folder has no uncompressed recording tars "
                               f"(recording.000000.tar)" + (": compressed tars cannot be read in place, "
                                                          "decompress them first" if gz else
                                                          "; it was written without its audio"))
        for cuts_path, tar in parts:
            cuts_path = regular_file(cuts_path)
            tar_source = source_of(tar, root, tar)
            try:
                members, refused, damage = _tar_members(regular_file(tar, "Shar recording tar"))
            except (OSError, ValueError) as e:
                members, refused, damage = {}, {}, None
                broken = f"{os.path.basename(tar)} cannot be read as an uncompressed tar ({e})"
            else:
                broken = None
            for line, cut in _rows(cuts_path):
                if isinstance(cut, _Bad):  # a line lhotse cannot parse: it alone is refused
                    out.entries.append(Entry(cuts_path, f"{tar_source}#{line}", line, None,
                                             problem=(cut.reason, cut.detail)))
                    continue
                where = f"{line}: cut {cut.id}"
                m = members.get(cut.id)
                if broken:
                    problem = ("unreadable", broken)
                elif not isinstance(cut, DataCut):
                    problem = ("lhotse_cut", f"a {type(cut).__name__} mixes or pads several recordings")
                elif m is None and cut.id in refused:
                    problem = refused[cut.id]
                elif m is None and damage:  # its member would have come after the damage
                    problem = ("truncated", f"{os.path.basename(tar)}: {damage}")
                elif m is None or m.name.endswith(".nodata"):
                    problem = ("lhotse_no_audio", f"{os.path.basename(tar)} holds no audio for it")
                else:
                    problem = None
                if problem is not None:
                    out.entries.append(Entry(tar, f"{tar_source}#{cut.id}", where, cut.id, problem=problem))
                    continue
                try:
                    text, speaker, extra = _cut_texts(cut, keep, out)
                except (TypeError, ValueError) as e:  # a text that is a list: this cut alone is refused
                    out.entries.append(Entry(tar, f"{tar_source}#{cut.id}", where, cut.id, problem=(
                        getattr(e, "reason", "bad_value"), f"{where}: {e}")))
                    continue
                extra.update(tar_member=m.name, member_offset=m.offset, member_size=m.size)
                out.entries.append(Entry(tar, f"{tar_source}#{m.name}", where, cut.id, text, speaker,
                                         extra=extra))
    return out
