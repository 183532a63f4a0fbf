"""Errors raised on purpose are AudiopipeErrors that are also the builtin they stand for; a Python caller reads
Python (`overwrite=True`), the command line reads its flags (`--overwrite`); ap.shard shows its signature."""

from __future__ import annotations

import argparse
import ast
import builtins
import inspect
import re
from pathlib import Path

import pytest

import audiopipe as ap
from audiopipe.cli import main
from audiopipe.errors import AudiopipeWarning
from audiopipe.reader.reading import Reading

PACKAGE = Path(ap.__file__).parent
# builtins that are control flow or programming errors, not messages to a user
NOT_USER_ERRORS = {"NotImplementedError", "AssertionError", "SystemExit", "KeyboardInterrupt", "StopIteration",
                   "AttributeError"}  # a module's __getattr__ must raise AttributeError itself


def test_the_package_raises_no_builtin_error_of_its_own():
    builtin_errors = {n for n, v in vars(builtins).items()
                      if isinstance(v, type) and issubclass(v, BaseException)} - NOT_USER_ERRORS
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            exc = node.exc.func if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) else \
                node.exc if isinstance(node, ast.Raise) else None
            if isinstance(exc, ast.Name) and exc.id in builtin_errors:
                stray.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} raise {exc.id}")
    assert not stray, stray


def _python(call, builtin: type[BaseException], says: str) -> str:
    with pytest.raises(ap.AudiopipeError) as e:
        call()
    assert isinstance(e.value, builtin), type(e.value).__mro__
    msg = str(e.value)
    assert says in msg and "--" not in msg and "\n" not in msg, msg
    return msg


def _cli(argv: list[str], says: str, capsys) -> None:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error: ") and says in err[0], err


def test_bad_arguments_speak_python_in_python_and_flags_on_the_command_line(f5_shards, tmp_path, capsys):
    nope = tmp_path / "nope"
    _python(lambda: ap.make_loader(nope, ["mel"], max_frames=4000), FileNotFoundError, "not a shard folder")
    _python(lambda: ap.verify(nope), FileNotFoundError, "manifest.json not found")
    _python(lambda: ap.inspect(nope), FileNotFoundError, "manifest.json not found")
    _cli(["verify", nope], "manifest.json not found", capsys)
    _python(lambda: ap.make_loader(f5_shards, ["mel"], max_frames=4000, weights=[1]), ValueError, "weights=")
    _python(lambda: ap.make_loader([f5_shards, f5_shards], ["mel"], max_frames=4000), ValueError, "listed twice")
    _python(lambda: ap.make_loader(f5_shards, ["mel"], max_frames=4000,
                                   reading=Reading(cache_dir=str(tmp_path / "c"), max_cache_bytes=1 << 20)),
            ValueError, "these folders are local already")
    _python(lambda: ap.make_loader(f5_shards, ["fbank"], max_frames=4000), ValueError, "has no feature")

    _python(lambda: ap.shard(None, tmp_path / "o"), RuntimeError, "give corpus=FOLDER")
    _cli(["shard", "--out", tmp_path / "o"], "give --corpus FOLDER (a folder of audio), or --manifest PATH", capsys)
    _python(lambda: ap.shard(tmp_path, tmp_path / "o", min_duration=-1), RuntimeError,
            "min_duration=-1: must be at least 0")
    _cli(["shard", "--corpus", tmp_path, "--out", tmp_path / "o", "--min-duration", "-1"],
         "--min-duration -1.0: must be at least 0", capsys)
    _python(lambda: ap.shard(tmp_path, tmp_path / "o", preset="ns2"), RuntimeError,
            "codec_checkpoint=DIR (a local EnCodec 24 kHz folder), or codec_random_init=True")
    _cli(["shard", "--corpus", tmp_path, "--out", tmp_path / "o", "--preset", "ns2"],
         "--codec-checkpoint DIR (a local EnCodec 24 kHz folder), or --codec-random-init", capsys)

    taken = tmp_path / "taken"
    (taken / "x").mkdir(parents=True)
    _python(lambda: ap.export_hf(f5_shards, taken), ValueError, "pass overwrite=True")
    _cli(["export-hf", "--shards", f5_shards, "--out", taken], "pass --overwrite to replace", capsys)
    _python(lambda: ap.export_hf(f5_shards, tmp_path / "hf", audio="bogus"), ValueError, "audio='bogus'")
    _python(lambda: ap.export_nemo(f5_shards, tmp_path / "nemo", audio="pcm"), ValueError, "audio='pcm' needs")
    _cli(["export-nemo", "--shards", f5_shards, "--out", tmp_path / "nemo", "--audio", "pcm"], "--audio pcm needs",
         capsys)


def test_ap_shard_shows_its_signature_and_docstring():
    from audiopipe.shard.api import shard

    assert inspect.signature(ap.shard) == inspect.signature(shard)
    assert {"corpus", "out", "preset", "features", "workers", "require_text"} <= set(
        inspect.signature(ap.shard).parameters)
    doc = inspect.getdoc(ap.shard)
    assert doc.startswith("shard(corpus") and inspect.getdoc(shard) in doc and "May import" not in doc


# Option strings of `audiopipe shard` quoted by modules that are not the shard job's own words: another tool's
# flags (Ray's, tar's) and whole commands to run (`audiopipe shard --out URL`, said by verify and inspect).
NOT_SHARD_WORDS = ("ray start --num-cpus", "without --sparse", "`audiopipe shard --out",
                   "`audiopipe verify --no-tar`")
SHARD_JOB = ("shard", "corpus", "storage", "text", "decode", "features", "index")


def test_no_shard_job_message_quotes_a_flag():
    """The shard job's messages are Python's (`out=`): a constant string of its packages that quotes one of
    `audiopipe shard`'s flags is a message the Python API would show in the command's words. Docstrings, and
    the argparse calls of a module's own command line, are not messages."""
    from audiopipe.cli import build_parser

    parser = build_parser(["shard"])
    sub = next(a.choices["shard"] for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {o for a in sub._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    quoted = []
    for pkg in SHARD_JOB:
        for path in sorted((PACKAGE / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            skip = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                    and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for call in ast.walk(tree):  # a module's own command line (argparse) speaks flags
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                        call.func.attr in ("add_argument", "error"):
                    skip |= {id(c) for c in ast.walk(call)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    text = node.value
                    for ok in NOT_SHARD_WORDS:
                        text = text.replace(ok, "")
                    hit = [f for f in flags if re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
                    if hit:
                        quoted.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {sorted(hit)}")
    assert not quoted, quoted


def test_shard_job_messages_speak_python_and_the_command_line_says_flags(asterisk_corpus, tmp_path, capsys):
    # An output folder holding something else: a one-line JobError naming out=, and --out on the command line.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine\n")
    _python(lambda: ap.shard(asterisk_corpus.root, taken, workers=0), RuntimeError, "new or empty out= folder")
    _cli(["shard", "--corpus", asterisk_corpus.root, "--out", taken, "--workers", "0"],
         "new or empty --out folder", capsys)
    _python(lambda: ap.shard(asterisk_corpus.root, tmp_path / "o", workers=0, engine="ray"), RuntimeError,
            "workers=0 builds in this process; it cannot be combined with ray_address= or engine='ray'")
    _cli(["shard", "--corpus", asterisk_corpus.root, "--out", tmp_path / "o", "--workers", "0", "--engine", "ray"],
         "--workers 0 builds in this process; it cannot be combined with --ray-address or --engine ray", capsys)

    # Notes during a job are AudiopipeWarnings in Python's words; the command line prints them with its flags.
    corpus = tmp_path / "untranscribed"
    corpus.mkdir()
    for wav in sorted((asterisk_corpus.root / "wavs").glob("*.wav"))[:2]:
        (corpus / wav.name).write_bytes(wav.read_bytes())
    with pytest.warns(AudiopipeWarning, match=r"preset='f5tts' trains on transcripts; require_text=True "
                                                 r"refuses them"):
        first = ap.shard(corpus, tmp_path / "s", workers=0, progress=False)
    again = ap.shard(corpus, tmp_path / "s", workers=0, progress=False)  # up to date: what to do instead
    assert first.written == 2 and any("another out= folder" in line for line in again.lines()), again.lines()
    assert not any("--" in line for line in first.lines() + again.lines())
    capsys.readouterr()
    assert main(["shard", "--corpus", str(corpus), "--out", str(tmp_path / "s"), "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "nothing to do; another --out folder extracts again" in out and "out=" not in out, out
