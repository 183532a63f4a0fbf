"""Import a user's GPT-SoVITS semantic tokens (6-name2semantic.tsv) and join them to shard rows by name.

The file, as GPT-SoVITS's data preparation writes it (prepare_datasets/3-get-semantic.py, merged by the webui):
    item_name<TAB>semantic_audio                 header, only in the merged file (not in the -<part>.tsv)
    <wav basename><TAB><int> <int> ... <int>     one line per utterance; the name keeps its extension
The ints are the SoVITS quantizer's codes (1024 entries, 25 per second for v1/v2); GPT-SoVITS reads them with
pandas, so we accept CRLF line ends and blank lines, and refuse anything else with file:line in the message.

Joining: GPT-SoVITS names an utterance by the basename of its wav; an audiopipe id is the path relative to the
corpus root without extension. A tsv name is matched to the ids whose basename equals the name without its
audio extension. A name that matches several ids (two speakers with the same file names) is ambiguous and is
NOT joined: guessing would pair tokens with the wrong audio. Every unmatched name and row is reported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from audiopipe.errors import InvalidValue, NotFound
from audiopipe.features.base import FeatureSpec
from audiopipe.tokens.store import TokenSet, parent_ids, phones_note, prepare_out, write_token_set

HEADER = ("item_name", "semantic_audio")
AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aac", ".wma", ".webm", ".aiff", ".aif")
SHOW = 5  # names printed per category; report.json has them all


def read_name2semantic(path: str | Path) -> dict[str, np.ndarray]:
    """{item_name: int64 tokens} in file order. Identical repeated lines collapse; conflicting ones are refused."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"name2semantic file not found: {path}")
    out: dict[str, np.ndarray] = {}
    first_line: dict[str, int] = {}
    with open(path, encoding="utf-8-sig") as f:  # -sig: a BOM from a Windows editor is not part of the name
        for no, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise InvalidValue(f"{path}:{no}: expected 'item_name<TAB>tokens', found {len(parts)} tab-separated "
                                   f"fields: {line[:80]!r}")
            name, text = parts[0].strip(), parts[1].strip()
            if (name, text) == HEADER:
                continue
            if not name:
                raise InvalidValue(f"{path}:{no}: empty item name")
            if not text:
                raise InvalidValue(f"{path}:{no}: {name!r} has no tokens")
            try:
                tokens = np.array([int(t) for t in text.split()], dtype=np.int64)
            except ValueError:
                bad = next(t for t in text.split() if not t.lstrip("-").isdigit())
                raise InvalidValue(f"{path}:{no}: {name!r} has a token that is not an integer: {bad!r}") from None
            if name in out:
                if not np.array_equal(out[name], tokens):
                    raise InvalidValue(f"{path}:{no}: {name!r} appears again (first on line {first_line[name]}) with "
                                       f"different tokens; which one belongs to the audio is unknowable")
                continue
            out[name] = tokens
            first_line[name] = no
    if not out:
        raise InvalidValue(f"{path}: no token lines (is it a 6-name2semantic.tsv?)")
    return out


def utterance_name(item_name: str) -> str:
    """'dir/utt_01.wav' -> 'utt_01' (basename without an audio extension; other dots are part of the name)."""
    base = PurePosixPath(item_name.replace("\\", "/")).name
    stem, dot, ext = base.rpartition(".")
    return stem if dot and f".{ext.lower()}" in AUDIO_EXTENSIONS else base


@dataclass
class Join:
    """Result of joining tsv names to shard ids (rows are positions in the shard index)."""

    rows: dict[int, str] = field(default_factory=dict)  # row -> tsv item name
    unmatched_names: list[str] = field(default_factory=list)  # in the tsv, no row with that name
    ambiguous: dict[str, list[str]] = field(default_factory=dict)  # tsv name -> the several ids it could be
    collisions: dict[str, list[str]] = field(default_factory=dict)  # two tsv names for one utterance name
    rows_without_tokens: list[int] = field(default_factory=list)


def join_names(item_names: list[str], ids: list[str]) -> Join:
    by_base: dict[str, list[int]] = {}
    for g, utt in enumerate(ids):
        by_base.setdefault(PurePosixPath(utt).name, []).append(g)
    by_utt: dict[str, list[str]] = {}
    for name in item_names:
        by_utt.setdefault(utterance_name(name), []).append(name)
    j = Join()
    for utt, names in by_utt.items():
        if len(names) > 1:  # "a.wav" and "a.flac": two token lists for one utterance, neither can be trusted
            j.collisions[utt] = names
            continue
        name = names[0]
        rows = by_base.get(utt, [])
        if not rows:
            j.unmatched_names.append(name)
        elif len(rows) > 1:
            j.ambiguous[name] = [ids[g] for g in rows]
        else:
            j.rows[rows[0]] = name
    j.rows_without_tokens = [g for g in range(len(ids)) if g not in j.rows]
    return j


@dataclass
class ImportSummary:
    rows: int
    matched: int
    join: Join
    out_of_range: list[str]
    length_outliers: list[str]
    out: str
    note: str | None = None

    @property
    def complete(self) -> bool:
        return self.matched == self.rows and not (self.join.unmatched_names or self.join.ambiguous
                                                  or self.join.collisions or self.out_of_range)

    def lines(self) -> list[str]:
        j = self.join
        out = [f"joined {self.matched} of {self.rows} shard rows to semantic tokens -> {self.out}"]

        def show(items: list[str]) -> str:
            more = f", ... (+{len(items) - SHOW})" if len(items) > SHOW else ""
            return ", ".join(items[:SHOW]) + more

        if j.unmatched_names:
            out.append(f"tsv names with no shard row: {len(j.unmatched_names)}: {show(j.unmatched_names)}")
        if j.ambiguous:
            out.append(f"ambiguous tsv names (several ids share the basename, not joined): {len(j.ambiguous)}: "
                       + show([f"{k} -> {'|'.join(v)}" for k, v in j.ambiguous.items()]))
        if j.collisions:
            out.append(f"utterance names given twice in the tsv (not joined): {len(j.collisions)}: "
                       + show([", ".join(v) for v in j.collisions.values()]))
        if self.out_of_range:
            out.append(f"token ids outside the codebook (not joined): {len(self.out_of_range)}: "
                       f"{show(self.out_of_range)}")
        unjoined = self.rows - self.matched
        if unjoined:
            out.append(f"shard rows without tokens: {unjoined} (listed in rejects.jsonl)")
        if self.length_outliers:
            out.append(f"warning: {len(self.length_outliers)} utterances have a token count far from duration x "
                       f"token rate (wrong file joined, or another token rate?): {show(self.length_outliers)}")
        if len(out) > 1:
            out.append("full lists in report.json")
        return out + ([self.note] if self.note else [])


def import_name2semantic(shards: str | Path, tsv: str | Path, out: str | Path, *, codebook_size: int = 1024,
                         token_rate: float = 25.0, force: bool = False) -> ImportSummary:
    """Join `tsv` to the rows of `shards` and write the token folder `out` (see audiopipe.tokens)."""
    if not 2 <= codebook_size <= 32767:
        raise InvalidValue(f"--codebook-size must be in 2..32767 (tokens are stored as int16), got {codebook_size}")
    shards, out = Path(shards), Path(out)
    prepare_out(shards, out, force)
    table = read_name2semantic(tsv)
    ids = parent_ids(shards)
    j = join_names(list(table), ids)
    from audiopipe.index.lengths import LengthIndex

    durations = LengthIndex.open(shards).duration
    tokens: dict[int, np.ndarray] = {}
    rejects: dict[int, tuple[str, str]] = {}
    out_of_range, outliers = [], []
    for g, name in j.rows.items():
        t = table[name]
        if t.min() < 0 or t.max() >= codebook_size:
            out_of_range.append(name)
            rejects[g] = ("tokens_out_of_range", f"{name}: ids {t.min()}..{t.max()}, codebook has {codebook_size}")
            continue
        expect = float(durations[g]) * token_rate
        if abs(len(t) - expect) > 0.2 * expect + 2:  # reported, not dropped: the user knows their data
            outliers.append(f"{ids[g]} ({len(t)} tokens, {durations[g]:.2f} s)")
        tokens[g] = t.astype(np.int16)
    ambiguous_of = {utt: name for name, cands in j.ambiguous.items() for utt in cands}
    for g in j.rows_without_tokens:
        base = PurePosixPath(ids[g]).name
        amb = ambiguous_of.get(ids[g])
        col = j.collisions.get(base)
        if amb is not None:
            rejects[g] = ("ambiguous_name", f"tsv name {amb!r} fits several ids; rename the files to unique names")
        elif col is not None:
            rejects[g] = ("name_collision", f"the tsv has {col} for this one utterance")
        else:
            rejects[g] = ("no_semantic_tokens", f"no line for {base!r} in {Path(tsv).name}")
    spec = FeatureSpec(name="semantic", kind="sovits_semantic", sample_rate=16000, dtype="int16", channels=0,
                       hop_length=int(round(16000 / token_rate)),
                       params={"source": "gpt_sovits_name2semantic", "codebook_size": codebook_size,
                               "token_rate": token_rate, "tsv_sha256": _sha256(tsv)})
    job = {"kind": "tokens", "source": "name2semantic", "parent": str(shards.resolve()),
           "parent_index_sha256": read_parent_index_sha(shards), "tsv": str(Path(tsv).resolve())}
    report: dict[str, Any] = {
        "source": "name2semantic", "tsv": str(tsv), "tsv_names": len(table), "rows": len(ids),
        "matched": len(tokens), "unmatched_names": j.unmatched_names, "ambiguous": j.ambiguous,
        "collisions": j.collisions, "out_of_range": out_of_range, "length_outliers": outliers,
        "rows_without_tokens": len(ids) - len(tokens),
    }
    if tokens:
        write_token_set(shards, out, TokenSet(spec, tokens, rejects, job, report))
    else:
        from audiopipe.shard.manifest import write_json_atomic
        from audiopipe.tokens.store import REPORT_NAME

        write_json_atomic(out / REPORT_NAME, report)
        if out_of_range:
            raise InvalidValue(f"no utterance got tokens: the {len(out_of_range)} matched ones have ids outside "
                               f"0..{codebook_size - 1} (e.g. {out_of_range[0]}); wrong --codebook-size? "
                               f"details in {out / REPORT_NAME}")
        first = ", ".join(list(table)[:3])
        raise InvalidValue(f"no tsv name matched a shard row (tsv names look like {first!r}; ids like "
                           f"{ids[0] if ids else '-'!r}); is it the tsv of this corpus? details in {out / REPORT_NAME}")
    return ImportSummary(len(ids), len(tokens), j, out_of_range, outliers, str(out), phones_note(shards))


def read_parent_index_sha(shards: Path) -> str:
    from audiopipe.shard.manifest import read_manifest

    return read_manifest(shards)["index"]["sha256"]


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
