"""The `audiopipe` command line: shard, verify, inspect, bench-loader, export-f5, export-checkpoint, tokens.

Every user-fixable problem ends in one line `audiopipe: error: ...` and a non-zero exit, never a traceback
(set AUDIOPIPE_DEBUG=1 to see one).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Callable, Iterator

from audiopipe.errors import AudiopipeError, AudiopipeWarning, in_flags
from audiopipe.shard.checksum import ALGORITHMS, DEFAULT as DEFAULT_CHECKSUM

EPILOG_SHARD = """\
examples:
  audiopipe shard --corpus ./wavs                       # F5-TTS mels into ./shards
  audiopipe shard --corpus ./LibriTTS --preset f5tts,eres2net --workers 16
  audiopipe shard --corpus ./vctk --preset ns2 --codec-checkpoint ./encodec_24khz
  audiopipe shard --corpus ./wavs --features mel,f0 --ray-address ray://head:10001
  audiopipe shard --corpus ./aishell3 --preset f5tts,gpt_sovits --language zh   # Mandarin: GPT-SoVITS phones
  audiopipe shard --corpus ./data/train --layout kaldi --preset eres2net        # wav.scp + segments
  audiopipe shard --corpus ./VCTK-Corpus-0.92 --vctk-mic mic2                   # txt/ + wav48_silence_trimmed/
  audiopipe shard --manifest data/libritts_recordings_dev-clean.jsonl.gz \
                  --manifest data/libritts_supervisions_dev-clean.jsonl.gz       # lhotse prepare's output
  audiopipe shard --manifest ./hf_dataset --text-column sentence                # Hugging Face save_to_disk
  audiopipe shard --manifest cv-corpus-17.0/en/validated.tsv --require-text     # Common Voice
  audiopipe shard --corpus ./wavs --out s3://bucket/shards/v1   # upload to S3 (AWS_* env, AWS_ENDPOINT_URL)

Rerunning the same command after a crash resumes: finished shards are kept, the rest are rebuilt, and the
result is byte-identical to an uninterrupted run. On a finished output it is a fast no-op (on s3:// it
checks every object against the checksum uploaded with it, one HEAD each, and rebuilds any that disagree).
"""


def _shard_seed(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed or 'none', got {text!r}") from None
    if not 0 <= value < 2 ** 64:
        raise argparse.ArgumentTypeError(f"the seed must be in 0..2**64-1, got {value}")
    return value


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 256MB or 1GB)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _presets_help() -> str:
    from audiopipe.presets import PRESETS

    return "\n".join(f"  {k:<11} {p.description}" for k, p in PRESETS.items())


# Subcommands that live in their own module (add_arguments(parser) and run(args) -> int). A module is imported
# only when its subcommand is the one being run, so `audiopipe shard` never pays for the benchmark's imports.
PLUGGED = {
    "bench-loader": ("audiopipe.bench.loader_bench", "time the mmap loader against honest baselines"),
    "export-f5": ("audiopipe.export.f5", "export shards to F5-TTS's own mel.arrow layout"),
    "export-checkpoint": ("audiopipe.checkpoints.cli", "write a trained run as the checkpoint files its upstream "
                                                       "project loads (F5-TTS, ...)"),
    "export-hf": ("audiopipe.export.hf", "export shards as a Hugging Face datasets folder (load_from_disk, no copy)"),
    "export-lhotse": ("audiopipe.export.lhotse", "export shards as a lhotse CutSet in Shar (audio, supervisions, "
                                                 "features)"),
    "export-nemo": ("audiopipe.export.nemo", "export shards as a NeMo JSON-lines manifest with its audio"),
    "tokens": ("audiopipe.tokens.cli", "add semantic tokens (a GPT-SoVITS tsv, or k-means units) as a shard set"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="audiopipe", description="Speech training data, extracted once and read at "
                                "memcpy speed. `audiopipe COMMAND --help` for each command; docs/ for the rest.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((x for x in (argv if argv is not None else sys.argv[1:]) if not x.startswith("-")), None)

    s = sub.add_parser("shard", help="extract features from a corpus into Arrow + WebDataset shards",
                       description="Decode every utterance once, compute the features a preset needs, and write "
                                   "checksummed Arrow IPC shards (mmap, zero-copy) and WebDataset tars.\n\n"
                                   "presets:\n" + _presets_help(),
                       epilog=EPILOG_SHARD, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--corpus", default=None,
                   help="folder of audio (searched recursively), or the folder ids and sources are relative to "
                        "with --manifest (default there: the first manifest's folder)")
    s.add_argument("--out", default="./shards",
                   help="output folder, or s3://bucket/prefix for any S3-compatible store: credentials, region "
                        "and endpoint from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_REGION, "
                        "AWS_ENDPOINT_URL (default ./shards); see docs/shard.md")
    s.add_argument("--staging", default=None,
                   help="with --out s3://: local folder where each machine writes files whole before uploading "
                        "them (default: the system temp folder; a shard's files are removed once uploaded)")
    s.add_argument("--break-lock", action="store_true",
                   help="with --out s3://: take over the prefix's lock although its holder looks alive (only "
                        "when you know that job is dead; a lock goes stale by itself 2 minutes after its last "
                        "heartbeat, at once when its holder ran on this host and is gone)")
    s.add_argument("--preset", default="f5tts", help="comma-separated presets (default f5tts); see above")
    s.add_argument("--features", default=None,
                   help="comma-separated features instead of a preset's: mel (F5-TTS's vocos mel), slaney_mel, "
                        "fbank (Kaldi), f0, energy, pcm; the same names make_loader and the exports read "
                        "(vocos_mel and kaldi_fbank are accepted for mel and fbank)")
    s.add_argument("--manifest", action="append", default=None, metavar="PATH",
                   help="use only what a manifest lists (repeat for several): audiopipe JSONL/CSV/TSV "
                        "(path[,id,text,speaker]), lhotse recordings + supervisions or cuts (.jsonl[.gz]) or a "
                        "Shar folder, NeMo JSONL (audio_filepath, offset, duration, text), a Common Voice TSV, "
                        "Hugging Face parquet/Arrow files or a save_to_disk folder; see docs/corpus.md")
    s.add_argument("--speaker", default="auto", help="auto (first folder), dir:N, or none (default auto)")
    s.add_argument("--layout", default="auto",
                   choices=("auto", "files", "kaldi", "aishell3", "libritts", "vctk", "emilia"),
                   help="corpus layout: auto detects a Kaldi/ESPnet data dir (wav.scp), AISHELL-3 (content.txt), "
                        "LibriTTS(-R) (split folders), VCTK (txt/ + wav48*/) or Emilia (JSONL beside MP3 "
                        "folders), else walks the folder (files); see docs/corpus.md")
    s.add_argument("--vctk-mic", default="mic1", choices=("mic1", "mic2"),
                   help="VCTK 0.92: which microphone's recordings to take (default mic1)")
    s.add_argument("--text-column", default=None,
                   help="table manifests (Hugging Face, CSV/TSV/JSONL, NeMo, Common Voice): the transcript column "
                        "(default: text, sentence, transcription, ... whichever exists)")
    s.add_argument("--speaker-column", default=None,
                   help="table manifests: the speaker column (default: speaker, speaker_id, client_id)")
    s.add_argument("--audio-column", default=None,
                   help="Hugging Face manifests: the audio column (default: the one typed Audio)")
    s.add_argument("--id-column", default=None, help="table manifests: a column of unique utterance ids")
    s.add_argument("--keep-columns", default=None, metavar="A,B",
                   help="metadata to write as text columns beside id/speaker/text (e.g. gender,original_text,snr,"
                        "language); discovery names what is available and not kept")
    s.add_argument("--require-text", action="store_true",
                   help="refuse (no_text) every utterance without a transcript")
    s.add_argument("--language", default="en", choices=("en", "zh", "mixed", "auto"),
                   help="transcript language for phones (default en: ARPAbet ids). zh, mixed or auto: GPT-SoVITS "
                        "symbol ids, Chinese by jieba + pypinyin. zh drops Latin letters in Chinese lines, as "
                        "GPT-SoVITS's own data preparation does; mixed reads them as English phones (CMU dict); "
                        "auto decides per line (a manifest/Emilia `language` field, else the script) and reads "
                        "Chinese lines as zh. See docs/features.md")
    s.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per CPU; more than the CPUs here is capped, and said). "
                        "0: build in this process only, no other process and no Ray (small jobs, debugging; "
                        "the same bytes)")
    s.add_argument("--engine", default="auto", choices=("auto", "local", "ray"),
                   help="where shards are built: auto (default) runs a small local job on local processes, "
                        "which start in about a second, and a large one (over 10 h of audio per worker), a "
                        "cluster (--ray-address) or a codec stage on Ray; local or ray to choose. See "
                        "docs/shard.md")
    s.add_argument("--nice", type=int, default=None,
                   help="niceness of the worker processes, -20..19 (default: this command's own niceness, "
                        "0 from a normal shell; Ray's own default would be 15, which lets any other busy process "
                        "on the machine starve extraction). Use e.g. --nice 10 to yield to a trainer; on a "
                        "cluster, going below the cluster's setting needs CAP_SYS_NICE")
    s.add_argument("--ray-address", default=None,
                   help="join a running Ray cluster (e.g. HEAD:6379); paths must be on shared storage. A cluster "
                        "with token authentication needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN (or "
                        "RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token), as on its nodes (docs/shard.md). Without it, a "
                        "private Ray (when the engine is Ray) listens on 127.0.0.1 only, with a token")
    s.add_argument("--shard-size", type=_size, default=None,
                   help="target shard size, e.g. 256MB (default: 256MB, or smaller for small corpora so there "
                        "are up to 64 shards of at least 16MB)")
    s.add_argument("--shard-seed", type=_shard_seed, default=0,
                   help="utterances go into shards in a pseudo-random order drawn from this seed (default 0), so "
                        "every shard is a random sample of the corpus (what readers that take a few shards at a "
                        "time need); 'none' fills shards in id order")
    s.add_argument("--min-duration", type=float, default=0.3, help="reject shorter clips, seconds (default 0.3)")
    s.add_argument("--max-duration", type=float, default=30.0, help="reject longer clips, seconds (default 30)")
    s.add_argument("--max-channels", type=int, default=2, help="reject files with more channels (default 2)")
    s.add_argument("--silence-dbfs", type=float, default=-60.0,
                   help="reject clips whose peak is below this level (default -60 dBFS)")
    s.add_argument("--no-tar", action="store_true", help="write Arrow shards only, no WebDataset tars")
    s.add_argument("--checksum", choices=list(ALGORITHMS), default=DEFAULT_CHECKSUM,
                   help="checksum of each shard file in the manifest, checked by verify and the readers "
                        f"(default {DEFAULT_CHECKSUM}: ~30x faster than sha256, and as sure to catch accidental corruption; "
                        "sha256 when you want a cryptographic digest in the records)")
    s.add_argument("--codec-checkpoint", default=None, help="local EnCodec folder (save_pretrained layout)")
    s.add_argument("--codec-random-init", action="store_true",
                   help="random EnCodec weights, for tests and demos only (recorded in the manifest)")
    s.add_argument("--codec-batch-size", type=int, default=8, help="utterances per codec batch on a GPU (default 8; CPU actors encode one at a time)")
    s.add_argument("--bert-checkpoint", default=None, metavar="DIR",
                   help="GPT-SoVITS stage 1, Chinese: per-phone BERT features (column `bert`, float16 [1024, phones]) "
                        "from this local chinese-roberta-wwm-ext-large folder (save_pretrained layout); needs "
                        "phones with --language zh, mixed or auto. See docs/trainers/gpt_sovits.md")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.add_argument("--timings", default=None, metavar="FILE",
                   help="write where the wall time went as JSON: the driver's phases and, for every shard built, "
                        "its worker, start, end (seconds since the command started) and CPU seconds "
                        "(docs/extraction.md)")

    v = sub.add_parser("verify", help="re-check checksums and decode every record with semantic checks",
                       description="Recompute every shard file's checksum, decode every record of the Arrow shards and "
                                   "the tars, and check frame counts against durations, NaN/inf, and F0 range. "
                                   "Names the shard and sample of every failure; exit 1 if any.")
    v.add_argument("shards", nargs="?", default="./shards",
                   help="shard folder or s3://bucket/prefix (default ./shards); each s3 object is read once")
    v.add_argument("--no-tar", action="store_true", help="skip the WebDataset tars")
    v.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")

    i = sub.add_parser("inspect", help="print counts, hours, speakers; write a duration histogram PNG",
                       description="Summarise a shard folder from its manifest and length index.")
    i.add_argument("shards", nargs="?", default="./shards",
                   help="shard folder or s3://bucket/prefix (default ./shards)")
    i.add_argument("--plot", default=None,
                   help="histogram PNG path (default <shards>/durations.png; ./durations.png for s3://)")
    i.add_argument("--json", action="store_true", help="print the summary as JSON")

    for name, (module, help_text) in PLUGGED.items():
        sp = sub.add_parser(name, help=help_text, description=help_text,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == chosen:
            import importlib

            importlib.import_module(module).add_arguments(sp)
    return p


def _cmd_shard(a: argparse.Namespace, words: Callable[[str], str] = str) -> int:
    """words: a summary line (Python's `out=`) in the command's flags (as_flags)."""
    # A thin layer over audiopipe.shard.api.shard: the options are checked there (before torch or Ray is
    # imported: a typo costs milliseconds), the same for the command line and for Python.
    from audiopipe.shard.worker import THREAD_ENV

    for k, v in THREAD_ENV.items():  # this process builds shards too (the local engine): one thread each
        os.environ.setdefault(k, v)
    from audiopipe.shard.api import shard

    summary = shard(a.corpus, a.out, preset=a.preset, features=a.features, manifest=a.manifest,
                    speaker=a.speaker, layout=a.layout, language=a.language, workers=a.workers, engine=a.engine,
                    nice=a.nice, ray_address=a.ray_address, shard_size=a.shard_size, shard_seed=a.shard_seed,
                    min_duration=a.min_duration, max_duration=a.max_duration, max_channels=a.max_channels,
                    silence_dbfs=a.silence_dbfs, tar=not a.no_tar, checksum=a.checksum,
                    codec_checkpoint=a.codec_checkpoint, codec_random_init=a.codec_random_init,
                    codec_batch_size=a.codec_batch_size, bert_checkpoint=a.bert_checkpoint,
                    keep_columns=a.keep_columns, text_column=a.text_column, speaker_column=a.speaker_column,
                    audio_column=a.audio_column, id_column=a.id_column, vctk_mic=a.vctk_mic,
                    require_text=a.require_text, staging=a.staging, break_lock=a.break_lock,
                    progress=not a.no_progress)
    for line in summary.lines():
        print(words(line))
    if a.timings:
        import json

        Path(a.timings).write_text(json.dumps(summary.timeline, indent=1) + "\n")
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    from audiopipe.shard.verify import verify

    report = verify(a.shards, tars=not a.no_tar, progress=not a.no_progress)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def _cmd_inspect(a: argparse.Namespace) -> int:
    from audiopipe.shard.inspect import inspect_shards

    return inspect_shards(a.shards, plot=a.plot, as_json=a.json)


# Arguments that are addresses, not paths: the only ones where `scheme://` is expected.
_URL_ARGUMENTS = {"ray_address"}
# (command, argument) pairs that take an s3:// URL as well as a local path (shards written to or read from
# object storage); every other scheme is refused there in one line.
_S3_ARGUMENTS = {("shard", "out"), ("verify", "shards"), ("inspect", "shards"), ("bench-loader", "shards")}


def _refuse_urls(args: argparse.Namespace) -> None:
    """Refuse `gs://...` and friends wherever a path is expected, before pathlib turns them into local folders;
    s3:// only where it is supported."""
    from audiopipe.storage.paths import require_local
    from audiopipe.storage.s3 import require_local_or_s3

    for name, value in vars(args).items():
        if name not in _URL_ARGUMENTS and isinstance(value, str):
            what = f"--{name.replace('_', '-')}" if name != "shards" else "shard folder"
            check = require_local_or_s3 if (args.command, name) in _S3_ARGUMENTS else require_local
            check(value, what)


def main(argv: list[str] | None = None) -> int:
    """Run a command; returns its exit code. Called as the program (no `argv`), a `shard` run then ends the
    process itself (see _leave)."""
    rc = _main(argv)
    if argv is None and sys.argv[1:2] == ["shard"] and not os.environ.get("AUDIOPIPE_DEBUG"):
        _leave(rc)
    return rc


def _leave(rc: int) -> None:
    """End the process as the interpreter would, without its teardown of every module (with torch & co.
    loaded, 1.5 s median at load 10 on the 2-core VM against 0.1 s; benchmarks/bench_extract.py's whole runs
    include it). Every file of the job is written and closed by now.

    The steps are the interpreter's own shutdown, in its order, up to the teardown: first the threads
    (threading._shutdown: non-daemon threads joined, and concurrent.futures' exit hook, whose worker pool
    manager sends its workers their stop and joins them), then the atexit handlers (Ray's shutdown,
    multiprocessing's finalizers: they close the pool's queues, so they must come after the stop was sent, or
    the workers never get it and both sides wait for ever), then the streams."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def as_flags(message: str, parser: argparse.ArgumentParser, command: str | None) -> str:
    """A library message in the command's words (audiopipe.errors.in_flags with the command's flags)."""
    sub = next((a.choices.get(command) for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return in_flags(message, {o for a in (sub or parser)._actions for o in a.option_strings})


@contextlib.contextmanager
def _notes_as_lines(parser: argparse.ArgumentParser, command: str | None) -> Iterator[None]:
    """audiopipe's own warnings (an alias translated, rows without transcripts) as `audiopipe: note: ...` lines,
    each time they happen, while a command runs."""
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, AudiopipeWarning):
            print(f"audiopipe: note: {as_flags(str(message), parser, command)}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", AudiopipeWarning)
        warnings.showwarning = show
        yield


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    handlers = {"shard": _cmd_shard, "verify": _cmd_verify, "inspect": _cmd_inspect}
    try:
        _refuse_urls(args)
        with _notes_as_lines(parser, args.command):
            if args.command in PLUGGED:
                import importlib

                return importlib.import_module(PLUGGED[args.command][0]).run(args)
            if args.command == "shard":
                return _cmd_shard(args, lambda m: as_flags(m, parser, args.command))
            return handlers[args.command](args)
    except KeyboardInterrupt:
        print("audiopipe: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except (AudiopipeError, OSError, ValueError, RuntimeError, KeyError) as e:
        if os.environ.get("AUDIOPIPE_DEBUG"):
            raise
        msg = str(e).strip() or type(e).__name__
        if isinstance(e, AudiopipeError):
            msg = as_flags(msg, parser, args.command)
        print(f"audiopipe: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
