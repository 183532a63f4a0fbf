"""What discovery tells the user beyond its lists: notes about likely mistakes, and a hint when nothing usable
was found.

- A speaker folder named like a split (`train-clean-100`, `dev`) or a corpus folder (`LibriTTS`, `wav48`):
  every file under it would get that name as its speaker, so a speaker model would learn the splits.
- Utterances without a transcript while a preset trains on transcripts: how many (`--require-text` refuses
  them: they become `no_text` rejects here, before any decoding).
- Metadata that the shards will not hold (manifest columns, layout fields): named once, with the flag that
  keeps them.
- Nothing found: what the folder holds instead (parquet files, a lhotse manifest, a Common Voice TSV, ...) and
  the command that reads it; everything refused: the reasons and the first detail.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from audiopipe.corpus.records import Reject

SPLIT_NAME = re.compile(r"^(train|dev|test|valid|validation|val|eval|evaluation|devel|development)"
                        r"([-_.].*|\d+)?$", re.IGNORECASE)
CORPUS_FOLDER = re.compile(r"^(libri(tts|speech|light)([-_]?r)?|vctk([-_].*)?|ljspeech([-_].*)?|wav48(_.*)?|"
                           r"wav16|wav22|aishell[-_]?\d?|emilia|common[-_]?voice|cv-corpus.*|clips|corpus|data|"
                           r"audio|speech)$", re.IGNORECASE)
# Extra keys that say where the audio lies, not what it is: never named as metadata to keep.
INTERNAL_EXTRA = frozenset(("recording", "start_frame", "end_frame", "tar_member", "member_offset", "member_size",
                            "cell_format", "cell_column", "cell_field", "cell_row", "cell_group"))
# Of those, the keys that decide which bytes are decoded: a manifest or JSON field with one of these names is
# refused, so that a row cannot point the decoder at a byte range of its own choosing.
LOCATION_EXTRA = INTERNAL_EXTRA - {"recording"}
USED_EXTRA = frozenset(("language", "textgrid"))
_HINT_SCAN_ENTRIES = 20_000


def speaker_folder_note(speakers: set[str]) -> str | None:
    odd = sorted(s for s in speakers if s and (SPLIT_NAME.match(s) or CORPUS_FOLDER.match(s)))
    if not odd:
        return None
    shown = ", ".join(odd[:5]) + (", ..." if len(odd) > 5 else "")
    return (f"speaker folders named like splits or corpus folders: {shown} ({len(odd)} of {len(speakers)} "
            f"speakers); every file under them gets that name as its speaker. Point corpus= at the folder whose "
            f"subfolders are speakers, or choose the speaker folder with speaker='dir:N' (LibriTTS and VCTK are "
            f"read from their top folder with layout='libritts' or layout='vctk')")


def finish(d: Any, options: Any, speaker_auto: bool, manifest_given: bool = False) -> Any:
    """The discovery with --require-text applied, its notes completed and its hint set."""
    if d.walked and speaker_auto:
        note = speaker_folder_note({u.speaker for u in d.utterances})
        if note:
            d.notes.append(note)
    if options.require_text:
        kept = []
        for u in d.utterances:
            if u.text:
                kept.append(u)
            else:
                d.rejects.append(Reject(u.path, u.source, "no_text", "no transcript was found, and the job requires text"))
        if len(kept) < len(d.utterances):
            d.rejects.sort(key=lambda r: (r.source, r.reason))
            d.utterances = kept
    elif options.text_for and d.utterances:
        n = d.untranscribed
        if n:
            d.notes.append(f"{n} of {len(d.utterances)} utterances have no transcript, and {options.text_for} "
                           f"trains on transcripts; require_text=True refuses them")
    keys: set[str] = set()
    for u in d.utterances:
        if u.extra:
            keys.update(u.extra)
    keep = set(options.keep_columns)
    unused = (keys | set(d.unused_columns)) - INTERNAL_EXTRA - USED_EXTRA - keep
    if unused:
        d.notes.append(f"not written to the shards: {', '.join(sorted(unused))} (keep_columns='"
                       f"{','.join(sorted(unused)[:3])},...' writes them as columns)")
    missing = sorted(keep - keys)
    if missing and d.utterances:
        d.notes.append(f"no utterance has the keep_columns= column(s) {', '.join(missing)} (written empty)")
    if not d.utterances:
        if d.rejects:
            d.hint = rejects_hint(d.rejects)
        else:
            d.hint = "the manifest lists no audio" if manifest_given else found_hint(d.root)
    return d


def rejects_hint(rejects: list[Any]) -> str:
    reasons = Counter(r.reason for r in rejects)
    top = ", ".join(f"{k} {v}" for k, v in reasons.most_common(4))
    first = rejects[0]
    hint = f"all {len(rejects)} inputs were refused ({top}); first: {first.source}: {first.detail}"
    if reasons.get("missing") == len(rejects):
        hint += " (check where the manifest's relative paths start: see docs/corpus.md, Manifests)"
    return hint


def _scan(root: str) -> Counter:
    """What lies under root (three levels, bounded): counts of telling file kinds."""
    seen: Counter = Counter()
    entries = 0
    top = root.rstrip(os.sep).count(os.sep)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        if folder.count(os.sep) - top >= 3:
            dirs[:] = []
        entries += len(files) + len(dirs)
        names = set(files)
        if "state.json" in names or "dataset_dict.json" in names:
            seen[("hf_disk", folder)] += 1
        for n in files:
            low = n.lower()
            if low.endswith(".parquet"):
                seen[("parquet", folder)] += 1
            elif low.endswith(".arrow"):
                seen[("arrow", folder)] += 1
            elif re.match(r"cuts\.(\d+\.)?jsonl(\.gz)?$", low):
                seen[("shar", folder)] += 1
            elif "_recordings_" in low and ".jsonl" in low:
                seen[("lhotse", os.path.join(folder, n))] += 1
            elif low.endswith(".tsv") and "clips" in dirs:
                seen[("cv", os.path.join(folder, n))] += 1
            elif low.endswith((".jsonl", ".json", ".jsonl.gz")):
                seen[("jsonl", os.path.join(folder, n))] += 1
            elif low.endswith((".tar.gz", ".tgz", ".zip", ".tar.bz2", ".7z")):
                seen[("archive", os.path.join(folder, n))] += 1
            elif low.endswith(".tar"):
                seen[("tar", os.path.join(folder, n))] += 1
        if entries > _HINT_SCAN_ENTRIES:
            break
    return seen


def found_hint(root: str) -> str:
    """One sentence: what the folder holds instead of audio, and the flag that reads it."""
    seen = _scan(root)

    def where(kind: str) -> list[str]:
        return sorted(p for k, p in seen if k == kind)

    def count(kind: str) -> int:
        return sum(v for (k, _), v in seen.items() if k == kind)

    if where("hf_disk"):
        return f"{where('hf_disk')[0]} is a Hugging Face save_to_disk folder: use manifest='{where('hf_disk')[0]}'"
    if where("shar"):
        return f"{where('shar')[0]} is a lhotse Shar folder: use manifest='{where('shar')[0]}'"
    for kind, name in (("parquet", "parquet"), ("arrow", "Arrow")):
        if count(kind):
            folder = where(kind)[0]
            return (f"found {count(kind)} {name} files (a Hugging Face dataset?): use manifest='{folder}' "
                    f"(and text_column= / speaker_column= as needed)")
    if where("lhotse"):
        rec = where("lhotse")[0]
        sup = rec.replace("_recordings_", "_supervisions_")
        return f"found lhotse manifests {rec} and {sup}: give both as manifest="
    if where("cv"):
        tsv = next((p for p in where("cv") if p.endswith("validated.tsv")), where("cv")[0])
        return f"found a Common Voice release: use manifest='{tsv}'"
    if where("jsonl"):
        return f"found {where('jsonl')[0]}: if it lists the audio (NeMo, lhotse or audiopipe JSONL), use manifest="
    if where("archive"):
        return f"found archives ({where('archive')[0]}, ...): unpack them first"
    if where("tar"):
        return (f"found tar files ({where('tar')[0]}, ...): an Emilia WebDataset release is read with "
                f"layout='emilia'; other tars must be unpacked first")
    return f"no audio files under {root} (audiopipe reads the formats libsndfile reads: wav, flac, mp3, ogg, ...)"
