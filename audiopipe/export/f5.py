"""Export f5tts shards to the prepared-data folder SWivid/F5-TTS trains from, so its own trainer can read them.

    audiopipe export-f5 --shards ./shards --out ./data/MyCorpus_char

What F5-TTS's `prepare_*` scripts write (datasets' ArrowWriter: Arrow IPC *stream* format) and its loader reads:
  raw.arrow      rows {audio_path: string, text: string, duration: float64 seconds}
  mel.arrow      the same rows plus mel_spec: list<list<float32>> [n_mels, T], read with `audio_type="mel"`
                 (CustomDataset reads row["audio_path"] before it looks at mel_spec, so the column must exist)
  duration.json  {"duration": [seconds per row, in row order]}: the frame budget of its batch sampler
  vocab.txt      one symbol per line, line number = token id; its char tokenizer wants " " on line 0
Here mel.arrow holds the shard mels bit for bit (float32, the vocos mel F5 computes itself: 100 bins, 24 kHz,
hop 256); shards with any other mel config are refused. raw.arrow points at the corpus audio (the shard job's
corpus folder + the row's source path), for `audio_type="raw"` while that corpus is still there. Only pyarrow
is used; the files carry no `huggingface` schema metadata, so every datasets version infers the same features.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from audiopipe.errors import in_flags
from audiopipe.export.errors import ExportError
from audiopipe.features.mel import VocosMel
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.export.shardset import progress_bar
from audiopipe.storage.atomic import atomic_path, is_temporary

F5_MEL_HASH = VocosMel().specs[0].config_hash
F5_DURATION_RANGE = (0.3, 30.0)  # F5's CustomDataset silently swaps rows outside this for the next row
OUTPUTS = ("mel.arrow", "raw.arrow", "duration.json", "vocab.txt")
MEL_SCHEMA = pa.schema([("audio_path", pa.string()), ("text", pa.string()), ("duration", pa.float64()),
                        ("mel_spec", pa.list_(pa.list_(pa.float32())))])
RAW_SCHEMA = pa.schema([("audio_path", pa.string()), ("text", pa.string()), ("duration", pa.float64())])
_MAX_LIST_VALUES = 2**31 - 1  # list<> offsets are int32: the floats of one record batch must fit


def _clean_text(text: str) -> tuple[str, bool]:
    """F5 reads vocab.txt line by line: a newline inside a transcript would split a symbol. Made a space."""
    cleaned = text.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return cleaned, cleaned != text


def _mel_column(mels: list[np.ndarray], n_mels: int) -> pa.Array:
    """[n_mels, T_i] float32 arrays -> list<list<float32>>, the inner lists being the mel rows (one copy)."""
    frames = np.array([m.shape[1] for m in mels], dtype=np.int64)
    values = np.concatenate([m.reshape(-1) for m in mels]) if mels else np.empty(0, np.float32)
    starts = np.concatenate([[0], np.cumsum(frames * n_mels)[:-1]])
    inner = (starts[:, None] + np.arange(n_mels)[None, :] * frames[:, None]).reshape(-1)
    inner = np.append(inner, len(values)).astype(np.int32)
    outer = (np.arange(len(mels) + 1) * n_mels).astype(np.int32)
    rows = pa.ListArray.from_arrays(pa.array(inner), pa.array(values, type=pa.float32()))
    return pa.ListArray.from_arrays(pa.array(outer), rows)


def _batches(ds: ShardDataset, n_mels: int, batch_rows: int) -> Iterator[list[dict[str, Any]]]:
    """Rows in index order (= shard order), grouped so one record batch stays within int32 list offsets."""
    batch: list[dict[str, Any]] = []
    floats = 0
    for i in range(len(ds)):
        item = ds[i]
        size = item["mel"].size
        if batch and (len(batch) >= batch_rows or floats + size > _MAX_LIST_VALUES):
            yield batch
            batch, floats = [], 0
        batch.append(item)
        floats += size
    if batch:
        yield batch


def export_f5(shards_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False,
              batch_rows: int = 100, tokenizer: str = "char", vocab_file: str | Path | None = None,
              progress: bool = False) -> dict[str, Any]:
    """Write mel.arrow, raw.arrow, duration.json and vocab.txt for F5-TTS into out_dir; returns a summary.

    out_dir is a new or empty folder, or an earlier export (its four files, replaced with overwrite=True); a
    folder holding anything else is refused. progress: a progress bar on stderr, in utterances.

    Rows keep the shard index order. Each file is written to a temporary and renamed durably when all are complete.
    tokenizer "pinyin": `text` is the list of F5 pinyin tokens (audiopipe.text.f5_pinyin), as F5's pinyin
    preparation stores it, and vocab.txt is `vocab_file` (a checkpoint's; unknown tokens counted) or every token.
    """
    if tokenizer not in ("char", "pinyin"):
        raise ExportError(f"tokenizer must be char or pinyin, got {tokenizer!r}")
    pinyin = None
    if tokenizer == "pinyin":
        from audiopipe.text.f5_pinyin import PinyinVocab, f5_pinyin_tokens, read_vocab

        pinyin = PinyinVocab(read_vocab(vocab_file)) if vocab_file else None
    text_type = pa.list_(pa.string()) if tokenizer == "pinyin" else pa.string()
    mel_schema = MEL_SCHEMA.set(1, pa.field("text", text_type))
    raw_schema = RAW_SCHEMA.set(1, pa.field("text", text_type))
    root, out = Path(shards_dir), Path(out_dir)
    try:
        ds = ShardDataset(root, ["mel"], expect={"mel": F5_MEL_HASH},
                          meta_columns=("id", "text", "source", "duration"))
    except FileNotFoundError as e:
        raise ExportError(str(e)) from None
    except ValueError as e:  # ConfigMismatch: no mel, or a mel F5 does not compute
        raise ExportError(f"{e} (F5-TTS needs the f5tts preset's vocos mel, config {F5_MEL_HASH})") from None
    if len(ds) == 0:
        raise ExportError(f"{root} holds no utterances: nothing to export")
    n_mels = int(ds.spec("mel")["channels"])
    job = ds.manifest.get("job", {})
    corpus = job.get("corpus")
    others = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS and not is_temporary(p)) \
        if out.is_dir() else []
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise ExportError(f"{out} holds other files ({shown}): export-f5 writes into a new or empty folder, or over "
                          f"an earlier export; choose another out=")
    existing = [n for n in OUTPUTS if (out / n).exists()]
    if existing and not overwrite:
        raise ExportError(f"{out} already has {', '.join(existing)}; pass overwrite=True to replace")
    out.mkdir(parents=True, exist_ok=True)

    durations: list[float] = []
    vocab: set[str] = set()
    stats = {"empty_text": 0, "newlines_replaced": 0, "outside_f5_duration_range": 0, "audio_found": 0}
    seen_paths: dict[str, int] = {}  # Kaldi segments share their recording's path
    # Each file is written to a temporary and renamed durably (audiopipe.storage.atomic) only once all four are
    # complete; an error removes the temporaries and leaves any earlier export untouched.
    with ExitStack() as stack:
        tmp = {n: stack.enter_context(atomic_path(out / n)) for n in OUTPUTS}
        bar = stack.enter_context(progress_bar(len(ds), "export-f5", progress))
        with pa.OSFile(str(tmp["mel.arrow"]), "wb") as mel_sink, pa.OSFile(str(tmp["raw.arrow"]), "wb") as raw_sink, \
                pa.ipc.new_stream(mel_sink, mel_schema) as mel_w, pa.ipc.new_stream(raw_sink, raw_schema) as raw_w:
            for batch in _batches(ds, n_mels, batch_rows):
                paths, texts, secs = [], [], []
                for item in batch:
                    text, changed = _clean_text(item["text"] or "")
                    stats["newlines_replaced"] += changed
                    stats["empty_text"] += not text
                    if tokenizer == "pinyin":
                        text = f5_pinyin_tokens(text)
                        if pinyin is not None:
                            pinyin.ids(text)  # counts the tokens the given vocab lacks
                    vocab.update(text)
                    path = str(Path(corpus) / item["source"]) if corpus else item["source"]
                    stats["audio_found"] += os.path.exists(path)
                    sec = float(item["duration"])  # float32 in the shards: exact as a float64
                    lo, hi = F5_DURATION_RANGE
                    stats["outside_f5_duration_range"] += not lo <= sec <= hi
                    paths.append(path)
                    seen_paths[path] = seen_paths.get(path, 0) + 1
                    texts.append(text)
                    secs.append(sec)
                durations.extend(secs)
                bar.update(len(batch))
                cols = [pa.array(paths, pa.string()), pa.array(texts, text_type), pa.array(secs, pa.float64())]
                raw_w.write_batch(pa.record_batch(cols, schema=raw_schema))
                mel_w.write_batch(pa.record_batch(cols + [_mel_column([it["mel"] for it in batch], n_mels)],
                                                  schema=mel_schema))
        stats["rows_sharing_audio"] = sum(n for n in seen_paths.values() if n > 1)
        tmp["duration.json"].write_text(json.dumps({"duration": durations}, ensure_ascii=False), encoding="utf-8")
        # Space first: F5's char tokenizer asserts vocab[" "] == 0 (it is also the id of unknown symbols).
        symbols = [" "] + sorted(vocab - {" "})
        if pinyin is not None:
            symbols = pinyin.vocab  # the checkpoint's ids, unchanged
            stats["unknown_tokens"] = sum(pinyin.unknown.values())
            stats["unknown_symbols"] = dict(pinyin.unknown.most_common(20))
        with open(tmp["vocab.txt"], "w", encoding="utf-8", newline="\n") as f:
            f.writelines(s + "\n" for s in symbols)
    return {"shards": str(root), "out": str(out), "rows": len(durations), "hours": round(sum(durations) / 3600, 6),
            "n_mels": n_mels, "mel_hash": F5_MEL_HASH, "vocab_size": len(symbols), "tokenizer": tokenizer,
            "files": {n: (out / n).stat().st_size for n in OUTPUTS}, "trimmed": bool(job.get("trim")), **stats}


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = [f"exported {s['rows']} utterances ({s['hours']:.3f} h) to {s['out']}: "
             f"{', '.join(OUTPUTS)}; vocab {s['vocab_size']} symbols"]
    lo, hi = F5_DURATION_RANGE
    if s["outside_f5_duration_range"]:
        lines.append(f"warning: {s['outside_f5_duration_range']} rows are outside {lo}-{hi} s; F5-TTS's loader "
                     f"silently replaces them with the next row")
    if s["empty_text"]:
        lines.append(f"warning: {s['empty_text']} rows have an empty transcript")
    if s["newlines_replaced"]:
        lines.append(f"note: newlines in {s['newlines_replaced']} transcripts were replaced by spaces")
    if s["audio_found"] < s["rows"]:
        lines.append(f"note: {s['rows'] - s['audio_found']} audio_path entries do not exist here; raw.arrow needs "
                     f"the corpus audio (mel.arrow does not)")
    if s.get("rows_sharing_audio"):
        lines.append(f"warning: {s['rows_sharing_audio']} rows are cuts of longer recordings (Kaldi segments): their "
                     f"raw.arrow audio_path is the whole recording, so train those with audio_type=\"mel\" only")
    if s.get("unknown_tokens"):
        lines.append(f"warning: {s['unknown_tokens']} pinyin tokens are not in the given vocab and map to id 0 "
                     f"(most frequent: {', '.join(list(s['unknown_symbols'])[:10])})")
    if s["trimmed"]:
        lines.append("note: the shards were trimmed; mel.arrow and the durations are trimmed, the audio raw.arrow "
                     "points at is not")
    lines.append(f"train in F5-TTS with audio_type=\"mel\" (mel.arrow) and tokenizer {s.get('tokenizer', 'char')} "
                 f"with this vocab.txt, or the pretrained model's vocab.txt to fine-tune")
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", required=True, help="audiopipe shard folder made with the f5tts preset")
    p.add_argument("--out", required=True, help="F5-TTS data folder to write (e.g. data/<name>_char): a new or "
                                                "empty folder, or an earlier export with --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace mel.arrow/raw.arrow/... already in --out")
    p.add_argument("--tokenizer", choices=("char", "pinyin"), default="char",
                   help="char (default): text as is; pinyin: F5's Chinese tokens (text stored as a token list, "
                        "as F5's pinyin preparation does)")
    p.add_argument("--vocab", default=None, help="with --tokenizer pinyin: a checkpoint's vocab.txt to keep (its "
                                                 "ids); tokens it lacks are counted and reported")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """The `audiopipe export-f5` command. Problems raise ExportError (a ValueError) for the CLI's error line."""
    for line in summary_lines(export_f5(args.shards, args.out, overwrite=args.overwrite,
                                        tokenizer=getattr(args, "tokenizer", "char"), vocab_file=args.vocab,
                                        progress=not getattr(args, "no_progress", False))):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m audiopipe.export.f5", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"audiopipe: error: {in_flags(str(e), {o for a in p._actions for o in a.option_strings})}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
