"""Discovery of many small files against reading their headers in parallel, at 10k, 100k and 1M files. The corpora
(built under --dir on the first run), the measurements and the commands: docs/corpus.md ("Benchmark: discovery vs
a bare parallel header read").
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

from results_io import (bars, child_env, child_result, host, output_args, peak_rss_mb, pyplot, rotated, save, spread,
                        write_results)

PROMPTS = Path("/usr/share/asterisk/sounds/en")  # Debian asterisk-core-sounds-en-wav (Makefile DEBS)
SPEAKERS = 1000
THREADS = 16  # audiopipe.corpus.discover.DEFAULT_HEADER_THREADS
ODD_EVERY = 10_000  # four odd files per this many files
ODD_REJECTS = 3  # junk, cut header, zero length; the fourth (data past the end) is read shortened


def _templates(k: int = 64) -> list[bytes]:
    """k small real WAV files as bytes (16-bit mono PCM, a 44-byte header): 100-300 samples cut from the asterisk
    prompts at varied offsets."""
    import soundfile as sf

    prompts = sorted(PROMPTS.glob("*.wav"))
    if not prompts:
        raise SystemExit(f"no prompts under {PROMPTS}: apt-get install asterisk-core-sounds-en-wav")
    out = []
    for j in range(k):
        x, sr = sf.read(str(prompts[(j * 7) % len(prompts)]), dtype="int16")
        n = 100 + (j * 37) % 201
        start = min(len(x) - n, 800 + 97 * j) if len(x) > n else 0
        buf = io.BytesIO()
        sf.write(buf, x[start:start + n], sr, format="WAV", subtype="PCM_16")
        out.append(buf.getvalue())
    return out


def _write_folder(job: tuple[str, int, int, list[bytes]]) -> None:
    folder, lo, hi, templates = job
    os.makedirs(folder, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    good = templates[0]
    odd = {"junk": b"this is not audio at all, only text\n" * 4, "cut": good[:30], "zero": b"",
           "past": good[:40] + (len(good) * 3).to_bytes(4, "little") + good[44:]}
    for i in range(lo, hi):
        files = {f"u{i:07d}.wav": templates[i % len(templates)]}
        if i % 10 == 0:
            files[f"u{i:07d}.txt"] = f"utterance {i} of the benchmark corpus\n".encode()
        if i % ODD_EVERY == 0:
            files.update({f"{name}{i:07d}.wav": data for name, data in odd.items()})
        for name, data in files.items():
            fd = os.open(f"{folder}/{name}", flags, 0o644)
            os.write(fd, data)
            os.close(fd)


def make_corpus(root: Path, n: int, procs: int = 4) -> dict:
    """The corpus of n files under root, written in parallel (bytes written directly) unless an earlier run
    finished it; returns its expected counts."""
    if (root / "EXPECTED.json").exists():
        return json.loads((root / "EXPECTED.json").read_text())
    shutil.rmtree(root, ignore_errors=True)  # a half-written one
    root.mkdir(parents=True)
    print(f"making {n:,} files under {root}", file=sys.stderr, flush=True)
    templates = _templates()
    per = -(-n // SPEAKERS)
    jobs = [(f"{root}/spk{s:04d}", s * per, min(n, (s + 1) * per), templates)
            for s in range(SPEAKERS) if s * per < n]
    with Pool(procs) as pool:
        pool.map(_write_folder, jobs, chunksize=8)
    odd = -(-n // ODD_EVERY)
    expected = {"files": n, "utterances": n + odd, "rejects": ODD_REJECTS * odd, "audio_files": n + 4 * odd}
    (root / "EXPECTED.json").write_text(json.dumps(expected))
    return expected


def audio_files(root: str | Path) -> list[str]:
    """Every .wav under root (what the baselines read), listed before their clock starts."""
    out = []
    for folder, _, names in os.walk(root):
        out.extend(os.path.join(folder, n) for n in names if n.endswith(".wav"))
    out.sort()
    return out


def headers_in_threads(files: list[str], how: str, threads: int = THREADS) -> list:
    """The baseline: one header per file (a tuple, or None for a file libsndfile refuses), `threads` at once."""
    import soundfile as sf

    def header(path: str):
        try:  # a broken file is read too: it is part of what discovery reads
            if how == "info":
                i = sf.info(path)
                return i.samplerate, i.frames, i.channels
            with sf.SoundFile(path) as f:
                return f.samplerate, f.frames, f.channels
        except Exception:
            return None

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(header, files, chunksize=64))


def child(what: str, root: str) -> dict:
    """One measurement in this (fresh) process."""
    if what == "discover":
        from audiopipe.corpus.discover import discover

        t0 = time.perf_counter()
        d = discover(root)
        sec = time.perf_counter() - t0
        counts = {"utterances": len(d.utterances), "rejects": len(d.rejects)}
    else:
        import soundfile  # noqa: F401  (imported before the clock, as discover's module is)

        files = audio_files(root)
        t0 = time.perf_counter()
        heads = headers_in_threads(files, what)
        sec = time.perf_counter() - t0
        counts = {"headers": len(heads), "readable": sum(h is not None for h in heads)}
    return {"seconds": sec, "peak_rss_mb": peak_rss_mb(), **counts}


def _drop_caches() -> None:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        raise SystemExit("--cold needs root (cannot write /proc/sys/vm/drop_caches)") from None


def measure(root: Path, expected: dict, rounds: int, cold: bool) -> list[dict]:
    res = []
    for rnd in range(rounds):
        r: dict = {}
        for what in rotated(["info", "open", "discover"], rnd):
            if cold:
                _drop_caches()
            r[what] = _run_child(what, root)
        # Every measurement must have done all of its work, or its time means nothing.
        assert r["discover"]["utterances"] == expected["utterances"], r
        assert r["discover"]["rejects"] == expected["rejects"], r
        for b in ("info", "open"):
            assert r[b]["headers"] == expected["audio_files"], r
            assert r[b]["readable"] == expected["utterances"], r
            r[f"ratio_{b}"] = r["discover"]["seconds"] / r[b]["seconds"]
        print(f"{root.name} {'cold' if cold else 'warm'} round {rnd + 1}/{rounds} done", file=sys.stderr, flush=True)
        res.append(r)
    return res


def _run_child(what: str, root: Path) -> dict:
    return child_result([sys.executable, __file__, "--child", what, str(root)], what=what, env=child_env())


def summarise(runs: dict) -> dict:
    ways = ("discover", "info", "open")
    return {key: {**{f"ratio_{b}": spread(r[f"ratio_{b}"] for r in rs) for b in ways[1:]},
                  **{f"{w}_s": spread(r[w]["seconds"] for r in rs) for w in ways},
                  **{f"{w}_peak_rss_mb": max(r[w]["peak_rss_mb"] for r in rs) for w in ways}}
            for key, rs in runs.items()}


def plot(summary: dict, path: Path, machine: str) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 4.2))
    for off, name, label in ((-0.2, "ratio_info", "discover / 16-thread sf.info"),
                             (0.2, "ratio_open", "discover / 16-thread open")):
        bars(ax, [d[name] for d in summary.values()], [f"{int(k.split('_')[0]):,} files\n{k.split('_')[1]} cache"
                                                      for k in summary], offset=off, width=0.4, label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylabel("time ratio (median, bars: range over rounds)\nbelow 1: discovery is faster")
    ax.set_title(f"discover() vs a bare parallel header read\n{machine}", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:  # one measurement in this fresh process
        print("RESULT " + json.dumps(child(sys.argv[2], sys.argv[3])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/discovery1m"), help="where the corpora are built")
    p.add_argument("--files", default="10000,100000,1000000", help="corpus sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", default="", help="sizes (comma-separated) also measured once with the page cache "
                                              "dropped before each measurement (root only)")
    p.add_argument("--clean", action="store_true", help="delete --dir at the end")
    p.add_argument("--quick", action="store_true", help="10k and 100k files, 1 round (< 2 min; indicative only)")
    output_args(p, json_required=True)
    a = p.parse_args()
    if a.quick:
        a.files, a.rounds, a.cold = "10000,100000", 1, ""
    cold = {int(s) for s in a.cold.split(",") if s}
    result: dict = {"command": " ".join(["python", "benchmarks/bench_discovery.py", *sys.argv[1:]]),
                    "machine": host(a.machine), "loads": [], "runs": {}}
    for n in (int(s) for s in a.files.split(",")):
        root = a.dir / f"n{n}"
        expected = make_corpus(root, n)
        for cache in ("warm", "cold") if n in cold else ("warm",):
            if cache == "warm":  # the listing and the headers in the page cache (in a child: this process stays small)
                _run_child("open", root)
            result["runs"][f"{n}_{cache}"] = measure(root, expected, a.rounds if cache == "warm" else 1,
                                                     cold=cache == "cold")
            result["loads"].append({"run": f"{n}_{cache}", "load_average": os.getloadavg()})
            result["summary"] = summarise(result["runs"])
            result.pop("load_average_end", None)  # the load as this write ends
            write_results(result, a.json, lambda path: None, None)  # after every size: a stopped run keeps it
    write_results(result, None, lambda path: plot(result["summary"], path, a.machine), a.plot)
    if a.clean:
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
