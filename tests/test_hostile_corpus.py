"""Hostile input at discovery: every file the corpus layer opens is guarded, and one bad input is one reject
naming its file (and line), never a hang, a traceback, a machine out of memory or a silently changed value.

Each test here fails on the code before the guard (audiopipe/storage/guard.py): it hung, read without bound,
raised, or stored the wrong text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.corpus.discover import discover
from audiopipe.corpus.textgrid import TextGridError, read_textgrid
from audiopipe.decode.audio import DecodeLimits, RejectError
from audiopipe.decode.segments import RecordingCache

from hostile_inputs import audio_bytes, fifo, signal, sparse_member_bytes, within, write_tar

SR = 16000


def wav(path: Path, seconds: float = 0.5, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, signal(seconds, SR, seed), SR, subtype="PCM_16")
    return path


def reasons(d) -> dict[str, str]:
    return {r.source: r.reason for r in d.rejects}


def details(d) -> dict[str, str]:
    return {r.source: r.detail for r in d.rejects}


# ----------------------------------------------------------------------------------------------- pipes

def test_a_sidecar_that_is_a_named_pipe_is_a_reject_not_a_hang(tmp_path):
    wav(tmp_path / "spk" / "a.wav")
    wav(tmp_path / "spk" / "b.wav")
    (tmp_path / "spk" / "b.txt").write_text("bee")
    pipe = fifo(tmp_path / "spk" / "a.txt")
    d = within(30, lambda: discover(tmp_path), [pipe])
    assert [(u.id, u.text) for u in d.utterances] == [("spk/b", "bee")]
    assert reasons(d) == {"spk/a.wav": "unreadable"}
    assert "a.txt is not a regular file" in details(d)["spk/a.wav"]


@pytest.mark.parametrize("name", ["ZH-B000000.tar", "ZH_B00000.jsonl"])
def test_emilia_detection_does_not_open_a_pipe_named_like_an_index(tmp_path, name):
    """Layout detection runs on every corpus: a pipe named x.tar or x.jsonl must not block it."""
    wav(tmp_path / "spk" / "a.wav")
    pipe = fifo(tmp_path / name)
    d = within(30, lambda: discover(tmp_path), [pipe])
    assert [u.id for u in d.utterances] == ["spk/a"]


def test_a_textgrid_that_is_a_pipe_is_refused_at_once(tmp_path):
    pipe = fifo(tmp_path / "a.TextGrid")
    with pytest.raises(TextGridError, match="not a regular file"):
        within(30, lambda: read_textgrid(pipe), [pipe])


def test_kaldi_text_that_is_a_pipe_stops_with_one_line_instead_of_losing_every_transcript(tmp_path):
    wav(tmp_path / "a.wav")
    (tmp_path / "wav.scp").write_text("rec1 a.wav\n")
    pipe = fifo(tmp_path / "text")
    with pytest.raises(ValueError, match="text .* is not a regular file"):
        within(30, lambda: discover(tmp_path), [pipe])


# ------------------------------------------------------------------------------------- bounded reads

def _in_child(code: str, limit_bytes: int) -> subprocess.CompletedProcess:
    """Run `code` in a child whose address space is capped, so that an unbounded read fails there (MemoryError)
    instead of taking this machine's memory."""
    prelude = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_sidecar_linked_to_dev_zero_or_huge_is_refused_without_reading_it(tmp_path):
    wav(tmp_path / "spk" / "zero.wav")
    os.symlink("/dev/zero", tmp_path / "spk" / "zero.txt")
    wav(tmp_path / "spk" / "huge.wav")
    with open(tmp_path / "spk" / "huge.txt", "wb") as f:  # 4 GiB of holes: costs no disk
        f.truncate(4 << 30)
    wav(tmp_path / "spk" / "fine.wav")
    (tmp_path / "spk" / "fine.txt").write_text("fine")
    got = _in_child(f"""
        import json
        from audiopipe.corpus.discover import discover
        d = discover({str(tmp_path)!r})
        print(json.dumps({{"utts": [(u.id, u.text) for u in d.utterances],
                          "rejects": {{r.source: [r.reason, r.detail] for r in d.rejects}}}}))
    """, 1 << 30)  # 1 GiB of address space: a whole read of either sidecar cannot fit
    assert got.returncode == 0, got.stderr[-2000:]
    out = json.loads(got.stdout)
    assert out["utts"] == [["spk/fine", "fine"]]
    assert out["rejects"]["spk/zero.wav"][0] == "unreadable" and "zero.txt" in out["rejects"]["spk/zero.wav"][1]
    assert out["rejects"]["spk/huge.wav"][0] == "too_large" and "1 MiB" in out["rejects"]["spk/huge.wav"][1]


# ----------------------------------------------------------------------------------------- Emilia tars

def _json(**kw) -> bytes:
    return json.dumps(kw, ensure_ascii=False).encode()


def _emilia_tar(path: Path, members: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tar(path, members)
    return path


def _sparse_wav(seed: int) -> tuple[bytes, tuple[int, int]]:
    """A WAV whose middle is digital silence stored as a hole, as GNU tar --sparse packs it."""
    x = signal(4.0, SR, seed)
    x[int(0.5 * SR):int(3.5 * SR)] = 0.0
    data = audio_bytes(x, SR, "WAV", "PCM_16")
    a, b = 44 + int(0.5 * SR) * 2, 44 + int(3.5 * SR) * 2
    a, b = -(-a // 512) * 512, b // 512 * 512
    return data, (a, b)


@pytest.mark.parametrize("last", [False, True], ids=["middle", "last"])
def test_a_sparse_tar_member_is_refused_not_read_as_one_byte_range(tmp_path, last):
    sparse, hole = _sparse_wav(1)
    good = audio_bytes(signal(1.0, SR, 2), SR, "WAV", "PCM_16")
    members = [("k1.json", _json(id="k1", text="one")), ("sparse", "k1.wav", sparse, hole),
               ("k2.json", _json(id="k2", text="two")), ("k2.wav", good)]
    if last:
        members = members[2:] + members[:2]
    _emilia_tar(tmp_path / "ZH" / "ZH-B000000.tar", members)
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["k2"]
    assert reasons(d) == {"ZH/ZH-B000000.tar#k1.wav": "bad_member"}
    assert "sparse" in details(d)["ZH/ZH-B000000.tar#k1.wav"]
    wav_, _ = RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits())
    assert np.array_equal(wav_, sf.read(__import__("io").BytesIO(good), dtype="float32")[0])


def test_links_duplicates_nested_archives_and_odd_members_are_each_a_reject(tmp_path):
    one, two = (audio_bytes(signal(1.0, SR, s), SR, "WAV", "PCM_16") for s in (3, 4))
    _emilia_tar(tmp_path / "ZH-B000000.tar", [
        ("a.json", _json(id="a", text="first a")), ("a.wav", one),
        ("a.json", _json(id="a", text="second a")), ("a.wav", two),  # the same names again
        ("b.json", _json(id="b", text="bee")), ("hardlink", "b.wav", "a.wav"),
        ("c.json", _json(id="c", text="sea")), ("symlink", "c.wav", "a.wav"),
        ("inner.tar", b"\0" * 1024), ("notes.txt", b"hello"),
        ("d.json", _json(id="d", text="dee")), ("d.wav", one), ("d.flac", two),  # two audio files, one key
    ])
    d = discover(tmp_path)
    assert [(u.id, u.text) for u in d.utterances] == [("a", "first a"), ("d", "dee")]
    assert reasons(d) == {
        "ZH-B000000.tar#a.json": "duplicate_member", "ZH-B000000.tar#a.wav": "duplicate_member",
        "ZH-B000000.tar#b.wav": "bad_member", "ZH-B000000.tar#c.wav": "bad_member",
        "ZH-B000000.tar#inner.tar": "nested_archive", "ZH-B000000.tar#notes.txt": "bad_member",
        "ZH-B000000.tar#d.flac": "duplicate_member"}
    assert d.discovered == 9  # 2 pairs, 2 duplicates, 2 links (their JSON with them), an archive, a text file,
    # a second audio file


def test_a_tar_cut_short_keeps_its_intact_members(tmp_path):
    members = []
    for k in range(4):
        members += [(f"k{k}.json", _json(id=f"k{k}", text=f"t{k}")),
                    (f"k{k}.wav", audio_bytes(signal(1.0, SR, k), SR, "WAV", "PCM_16"))]
    tar = _emilia_tar(tmp_path / "ZH-B000000.tar", members)
    data = tar.read_bytes()
    tar.write_bytes(data[:len(data) - 14_000 - 10240])  # the end blocks and 14 KB of the last member
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["k0", "k1", "k2"]
    assert reasons(d) == {"ZH-B000000.tar#k3.wav": "truncated"}


@pytest.mark.parametrize("member, reason, said", [
    (b'["a", "list"]', "bad_json", "a list of 2, not a JSON object"),
    (b'{"id": "k", "text": ', "bad_json", "not JSON"),
    ('{"id": "k", "text": "caf\u00e9"}'.encode("latin-1"), "bad_encoding", "ZH-B000000.tar#k.json:1: not UTF-8"),
    (b'{"id": "k", "text": ["hello", "world"]}', "bad_value", "text is a list of 2, not a string"),
    (b'{"id": "k", "text": "hi", "speaker": {"name": "x"}}', "bad_value", "speaker is an object of 1 fields"),
])
def test_a_bad_json_member_is_a_reject_naming_it_and_the_rest_is_read(tmp_path, member, reason, said):
    _emilia_tar(tmp_path / "ZH-B000000.tar", [
        ("good.json", _json(id="good", text="fine")), ("good.wav", audio_bytes(signal(1.0, SR), SR, "WAV", "PCM_16")),
        ("k.json", member), ("k.wav", audio_bytes(signal(1.0, SR, 5), SR, "WAV", "PCM_16"))])
    d = discover(tmp_path)
    assert [(u.id, u.text) for u in d.utterances] == [("good", "fine")]
    assert reasons(d) == {"ZH-B000000.tar#k.wav": reason}
    assert said in details(d)["ZH-B000000.tar#k.wav"] and "['hello'" not in details(d)["ZH-B000000.tar#k.wav"]


def test_emilia_jsonl_values_of_the_wrong_type_are_rejects_naming_the_line(tmp_path):
    wav(tmp_path / "ZH" / "ZH_B00000" / "a.wav")
    wav(tmp_path / "ZH" / "ZH_B00000" / "b.wav", seed=1)
    wav(tmp_path / "ZH" / "ZH_B00000" / "c.wav", seed=2)
    rows = [{"id": "a", "wav": "ZH_B00000/a.wav", "text": "fine", "speaker": "s1"},
            {"id": "b", "wav": "ZH_B00000/b.wav", "text": ["hello", "world"], "speaker": "s1"},
            {"id": "c", "wav": "ZH_B00000/c.wav", "text": "ok", "speaker": {"who": "s1"}}]
    latin1 = '{"id": "d", "wav": "x.wav", "text": "caf\u00e9"}'.encode("latin-1")
    lines = [json.dumps(r).encode() for r in rows] + [latin1]
    (tmp_path / "ZH" / "ZH_B00000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    d = discover(tmp_path)
    assert [(u.id, u.text, u.speaker) for u in d.utterances] == [("a", "fine", "s1")]
    assert reasons(d) == {"ZH/ZH_B00000/b.wav": "bad_value", "ZH/ZH_B00000/c.wav": "bad_value",
                          "ZH/ZH_B00000.jsonl:4": "bad_encoding"}
    assert details(d)["ZH/ZH_B00000/b.wav"].startswith("ZH_B00000.jsonl:2: text is a list")
    assert details(d)["ZH/ZH_B00000/c.wav"].startswith("ZH_B00000.jsonl:3: speaker is an object")


# ----------------------------------------------------------------------------------------------- Kaldi

def _kaldi(root: Path, seconds: float = 4.0) -> None:
    wav(root / "rec1.wav", seconds)
    (root / "wav.scp").write_bytes(b"\xef\xbb\xbfrec1 rec1.wav\n")  # a BOM, as Windows editors save


def test_a_bom_at_the_start_of_wav_scp_stays_out_of_the_id(tmp_path):
    _kaldi(tmp_path)
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["rec1"]


@pytest.mark.parametrize("start, end", [("0.5", "inf"), ("nan", "1.0"), ("0.5", "nan"), ("-inf", "1.0"),
                                        ("zero", "1.0")])
def test_a_kaldi_segment_at_inf_or_nan_is_a_bad_segment_reject(tmp_path, start, end):
    _kaldi(tmp_path)
    (tmp_path / "segments").write_text(f"rec1-ok rec1 0.0 1.0\nrec1-bad rec1 {start} {end}\n")
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["rec1-ok"]
    assert reasons(d) == {"segments#rec1-bad": "bad_segment"}
    assert details(d)["segments#rec1-bad"].startswith("segments:2: ")


def test_a_latin1_kaldi_text_line_rejects_its_utterance_only(tmp_path):
    _kaldi(tmp_path)
    (tmp_path / "segments").write_text("rec1-a rec1 0.0 1.0\nrec1-b rec1 1.0 2.0\nrec1-c rec1 2.0 3.0\n")
    (tmp_path / "text").write_bytes("rec1-a hello\nrec1-b caf\u00e9\nrec1-c world\n".encode("latin-1"))
    d = discover(tmp_path)
    assert [(u.id, u.text) for u in d.utterances] == [("rec1-a", "hello"), ("rec1-c", "world")]
    assert reasons(d) == {"segments#rec1-b": "bad_transcript"}
    assert ":2: not UTF-8 text (byte 0xe9 at column 11)" in details(d)["segments#rec1-b"]


# ------------------------------------------------------------------------------------ names, manifests

def test_a_file_name_that_is_not_utf8_is_a_reject_naming_it(tmp_path):
    wav(tmp_path / "spk" / "good.wav")
    bad = os.path.join(os.fsencode(tmp_path / "spk"), b"caf\xe9.wav")
    with open(bad, "wb") as f:
        f.write(audio_bytes(signal(0.5, SR), SR, "WAV", "PCM_16"))
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["spk/good"]
    assert reasons(d) == {"spk/caf\\xe9.wav": "bad_encoding"}
    json.dumps([r.to_dict() for r in d.rejects], ensure_ascii=False).encode("utf-8")  # the record can be written


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_manifest_text_or_speaker_of_the_wrong_type_is_a_reject_naming_the_line(tmp_path, kind):
    for n in "abc":
        wav(tmp_path / f"{n}.wav")
    if kind == "jsonl":
        m = tmp_path / "list.jsonl"
        m.write_text("\n".join(json.dumps(r) for r in [
            {"path": "a.wav", "text": "fine"}, {"path": "b.wav", "text": ["hello", "world"]},
            {"path": "c.wav", "text": "ok", "speaker": {"name": "x"}}]) + "\n")
        want = {"b.wav": ("bad_value", "list.jsonl:2: text is a list"),
                "c.wav": ("bad_value", "list.jsonl:3: speaker is an object")}
    else:  # CSV cells are strings: a surrogate escaped in JSON cannot reach them, a reserved column can
        m = tmp_path / "list.csv"
        m.write_text("path,text,start_frame\na.wav,fine,\nb.wav,two,5\n")
        want = {"b.wav": ("bad_value", "list.csv:3: column start_frame is reserved")}
        (tmp_path / "c.wav").unlink()
    d = discover(tmp_path, manifest=m)
    assert [(u.id, u.text) for u in d.utterances] == [("a", "fine")]
    got = {r.source: (r.reason, r.detail) for r in d.rejects}
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in want.items()}
    for k, (_, said) in want.items():
        assert said in got[k][1] and "['hello'" not in got[k][1]


def test_nemo_values_of_the_wrong_type_are_rejects_naming_the_line(tmp_path):
    wav(tmp_path / "a.wav", 2.0)
    m = tmp_path / "train_manifest.json"
    m.write_text("\n".join(json.dumps(r) for r in [
        {"audio_filepath": "a.wav", "offset": 0.0, "duration": 1.0, "text": "fine"},
        {"audio_filepath": "a.wav", "offset": 0.5, "duration": "long", "text": "x"},
        {"audio_filepath": "a.wav", "offset": 0.5, "duration": 1.0, "text": {"t": 1}},
        {"audio_filepath": "a.wav", "offset": float("nan"), "duration": 1.0, "text": "nan start"},
        {"audio_filepath": "a.wav", "offset": 0.0, "duration": float("inf"), "text": "inf end"},
        {"audio_filepath": ["a.wav"], "duration": 1.0, "text": "x"}]).replace("NaN", "NaN") + "\n")
    d = discover(tmp_path, manifest=m)
    assert [u.text for u in d.utterances] == ["fine"]
    assert sorted((r.reason, r.detail.split(": ")[0]) for r in d.rejects) == [
        ("bad_segment", "train_manifest.json:4"), ("bad_segment", "train_manifest.json:5"),
        ("bad_value", "train_manifest.json:2"), ("bad_value", "train_manifest.json:3"),
        ("bad_value", "train_manifest.json:6")]


def test_a_manifest_string_holding_a_lone_surrogate_is_a_reject(tmp_path):
    wav(tmp_path / "a.wav")
    wav(tmp_path / "b.wav", seed=1)
    m = tmp_path / "list.jsonl"
    m.write_text('{"path": "a.wav", "text": "fine"}\n{"path": "b.wav", "text": "bad \\ud800 text"}\n')
    d = discover(tmp_path, manifest=m)
    assert [u.id for u in d.utterances] == ["a"]
    assert reasons(d) == {"b.wav": "bad_value"} and "U+D800" in details(d)["b.wav"]


def test_a_decode_of_a_member_of_a_tar_swapped_for_a_pipe_is_refused_not_hung(tmp_path):
    tar = _emilia_tar(tmp_path / "ZH-B000000.tar", [
        ("k.json", _json(id="k", text="t")), ("k.wav", audio_bytes(signal(1.0, SR), SR, "WAV", "PCM_16"))])
    d = discover(tmp_path)
    tar.unlink()
    fifo(tar)
    with pytest.raises(RejectError, match="not a regular file"):
        within(30, lambda: RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits()), [tar])


def test_sparse_helper_packs_what_tar_reads_back():
    """The hand-made GNU sparse header (hostile_inputs) is read by tarfile as GNU tar's own: the same bytes."""
    import io
    import tarfile

    data, hole = _sparse_wav(7)
    blob = sparse_member_bytes("x.wav", data, hole) + b"\0" * 1024
    with tarfile.open(fileobj=io.BytesIO(blob)) as tf:
        m = tf.next()
        assert m.issparse() and tf.extractfile(m).read() == data


# ------------------------------------------------------------------------------------------------- docs

def _emitted_reasons() -> dict[str, str]:
    """Every reject code the library's source passes to RejectError / Refused / Reject / a reject record, or
    puts first in a (reason, detail) pair, with one file that does."""
    import ast
    import re

    code = re.compile(r"^[a-z]+(_[a-z]+)*$")
    found: dict[str, str] = {}
    package = Path(__file__).parents[1] / "audiopipe"
    for path in package.rglob("*.py"):
        for n in ast.walk(ast.parse(path.read_text())):
            got = []
            if isinstance(n, ast.Call):
                f = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                at = {"RejectError": 0, "Refused": 0, "Reject": 2, "_reject": 1}.get(f)
                if at is not None and len(n.args) > at and isinstance(n.args[at], ast.Constant):
                    got.append(n.args[at].value)
                got += [k.value.value for k in n.keywords if k.arg == "reason" and isinstance(k.value, ast.Constant)]
            elif isinstance(n, ast.Dict):
                got += [v.value for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant)
                        and k.value == "reason" and isinstance(v, ast.Constant)]
            elif isinstance(n, ast.Tuple) and len(n.elts) == 2 and isinstance(n.elts[0], ast.Constant) \
                    and isinstance(n.elts[0].value, str) and code.match(n.elts[0].value) \
                    and (isinstance(n.elts[1], ast.JoinedStr) or isinstance(n.elts[1], ast.Constant)
                         and " " in str(n.elts[1].value)):
                got.append(n.elts[0].value)
            for g in got:
                if isinstance(g, str) and code.match(g):
                    found.setdefault(g, str(path.relative_to(package.parent)))
    return found


def _documented_reasons() -> dict[str, list[str]]:
    import re

    text = (Path(__file__).parents[1] / "docs" / "corpus.md").read_text()
    table = text.split("## Reject reasons", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    cells = re.compile(r"(?<!\\)\|")  # a cell ends at a | that is not escaped
    return {r.split("`")[1]: [c.strip() for c in cells.split(r.strip().strip("|"))] for r in rows}


def test_docs_list_every_reject_reason_with_an_example():
    documented = _documented_reasons()
    emitted = _emitted_reasons()
    missing = {r: where for r, where in emitted.items() if r not in documented}
    assert not missing, f"reject reasons not in docs/corpus.md's table: {missing}"
    for reason, cells in documented.items():
        assert len(cells) == 4 and cells[3].startswith("`") and len(cells[3]) > 4, f"{reason}: no example"
    from fuzz_corpus import REASONS

    assert REASONS <= set(documented), REASONS - set(documented)
