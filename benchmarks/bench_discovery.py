"""Discovery of many small files against reading their headers in parallel (issue 12), at 10k, 100k and 1M files.

    python benchmarks/bench_discovery.py --files 10000,100000,1000000 --rounds 3 --cold 100000,1000000 \
        --json benchmarks/results/discovery.json --plot docs/img/discovery.png --clean
    python benchmarks/bench_discovery.py --quick        # 10k and 100k files, 1 round, < 2 min

Corpora (built once by `--make`, or on the first run, under --dir, default /tmp/discovery1m): N tiny real WAV
files (8 kHz 16-bit cuts of Debian's asterisk prompts, 0.2-0.6 KB) in 1,000 speaker folders, a sidecar `.txt`
for every 10th file, and per 10,000 files four odd ones: a text file named `.wav`, a header cut at 30 bytes, a
zero-length `.wav` (three rejects) and a file whose data chunk runs past its end (libsndfile reads it shortened).

Each measurement runs in a fresh child process (so its peak RSS is its own) and times, over the same files:
- `discover`: `audiopipe.corpus.discover.discover(root)`, walk included;
- `info`: a bare 16-thread `soundfile.info()` of every audio file (the list made before the clock starts);
- `open`: a bare 16-thread `soundfile.SoundFile` open of every audio file (the lighter libsndfile read).
Ratios are discover / baseline per round (median and range). `--cold` drops the page cache before every
measurement (`echo 3 > /proc/sys/vm/drop_caches`, root only; it slows everything else on the machine).
The JSON is rewritten after each corpus size, so a run stopped part-way keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from results_io import child_result, pyplot, save, spread  # benchmarks/ (the script's own folder is on sys.path)

PROMPTS = Path("/usr/share/asterisk/sounds/en")  # Debian asterisk-core-sounds-en-wav (Makefile DEBS)
SPEAKERS = 1000
THREADS = 16  # audiopipe.corpus.discover.DEFAULT_HEADER_THREADS
ODD_EVERY = 10_000  # four odd files per this many files
ODD_REJECTS = 3  # junk, cut header, zero length; the fourth (data past the end) is read shortened

# ------------------------------------------------------------------ corpus


def _templates(k: int = 64) -> list[bytes]:
    """k small real WAV files as bytes: 100-300 samples cut from the asterisk prompts at varied offsets."""
    import soundfile as sf

    prompts = sorted(PROMPTS.glob("*.wav"))
    if not prompts:
        raise SystemExit(f"no prompts under {PROMPTS}: apt-get install asterisk-core-sounds-en-wav")
    out = []
    for j in range(k):
        x, sr = sf.read(str(prompts[(j * 7) % len(prompts)]), dtype="int16")
        n = 100 + (j * 37) % 201
        start = min(len(x) - n, 800 + 97 * j) if len(x) > n else 0
        out.append(_wav_bytes(x[start:start + n].tobytes(), sr))
    return out


def _wav_bytes(pcm: bytes, sr: int, declared: int | None = None) -> bytes:
    """A canonical 44-byte-header PCM 16-bit mono WAV (declared: the data size written in the header)."""
    size = len(pcm) if declared is None else declared
    fmt = (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + sr.to_bytes(4, "little") + \
        (2 * sr).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    return (b"RIFF" + (36 + size).to_bytes(4, "little") + b"WAVE" + b"fmt " + (16).to_bytes(4, "little") + fmt +
            b"data" + size.to_bytes(4, "little") + pcm)


def _write_folder(job: tuple[str, int, int, list[bytes]]) -> None:
    folder, lo, hi, templates = job
    os.makedirs(folder, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for i in range(lo, hi):
        fd = os.open(f"{folder}/u{i:07d}.wav", flags, 0o644)
        os.write(fd, templates[i % len(templates)])
        os.close(fd)
        if i % 10 == 0:
            fd = os.open(f"{folder}/u{i:07d}.txt", flags, 0o644)
            os.write(fd, f"utterance {i} of the benchmark corpus\n".encode())
            os.close(fd)
        if i % ODD_EVERY == 0:
            good = templates[0]
            odd = {"junk": b"this is not audio at all, only text\n" * 4, "cut": good[:30], "zero": b"",
                   "past": good[:40] + (len(good) * 3).to_bytes(4, "little") + good[44:]}
            for name, data in odd.items():
                with open(f"{folder}/{name}{i:07d}.wav", "wb") as f:
                    f.write(data)


def make_corpus(root: Path, n: int, procs: int = 4) -> dict:
    """Write the corpus of n files under root (in parallel, bytes written directly); returns its expected counts."""
    templates = _templates()
    per = -(-n // SPEAKERS)
    jobs = [(f"{root}/spk{s:04d}", s * per, min(n, (s + 1) * per), templates)
            for s in range(SPEAKERS) if s * per < n]
    t0 = time.perf_counter()
    with Pool(procs) as pool:
        pool.map(_write_folder, jobs, chunksize=8)
    odd = -(-n // ODD_EVERY)
    expected = {"files": n, "utterances": n + odd, "rejects": ODD_REJECTS * odd, "audio_files": n + 4 * odd}
    (root / "EXPECTED.json").write_text(json.dumps(expected))
    return {**expected, "make_s": time.perf_counter() - t0}


def corpus(base: Path, n: int) -> tuple[Path, dict]:
    root = base / f"n{n}"
    exp = root / "EXPECTED.json"
    if not exp.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        info = make_corpus(root, n)
        print(f"made {n} files under {root} in {info['make_s']:.1f} s", flush=True)
    return root, json.loads(exp.read_text())


# ------------------------------------------------------------------ the three measurements

def audio_files(root: str | Path) -> list[str]:
    """Every .wav under root (what the baselines read), listed before their clock starts."""
    out = []
    for folder, _, names in os.walk(root):
        out.extend(os.path.join(folder, n) for n in names if n.endswith(".wav"))
    out.sort()
    return out


def _info(path: str):
    import soundfile as sf

    try:
        i = sf.info(path)
        return i.samplerate, i.frames, i.channels
    except Exception:  # a broken file is read too: it is part of what discovery reads
        return None


def _open(path: str):
    import soundfile as sf

    try:
        with sf.SoundFile(path) as f:
            return f.samplerate, f.frames, f.channels
    except Exception:
        return None


def headers_in_threads(files: list[str], how: str, threads: int = THREADS) -> list:
    """The baseline: one header per file (a tuple, or None for a file libsndfile refuses), `threads` at once."""
    fn = {"info": _info, "open": _open}[how]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, files, chunksize=64))


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
    return {"seconds": sec, "peak_rss_mb": _peak_rss_mb(), **counts}


def _peak_rss_mb() -> float:
    """This process's own peak RSS. Not ru_maxrss: Linux carries it across fork and exec, so a child would
    report its parent's size; VmHWM belongs to the address space that exec made."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def measure(root: Path, expected: dict, rounds: int, cold: bool) -> list[dict]:
    res = []
    steps = ["info", "open", "discover"]
    for rnd in range(rounds):
        r: dict = {}
        for what in steps[rnd % 3:] + steps[:rnd % 3]:  # rotate: the load and the cache favour none of them
            if cold and not _drop_caches():
                raise SystemExit("--cold needs root (cannot write /proc/sys/vm/drop_caches)")
            r[what] = _run_child(what, root)
        # Every measurement must have done all of its work, or its time means nothing.
        assert r["discover"]["utterances"] == expected["utterances"], r
        assert r["discover"]["rejects"] == expected["rejects"], r
        for b in ("info", "open"):
            assert r[b]["headers"] == expected["audio_files"], r
            assert r[b]["readable"] == expected["utterances"], r
        r["ratio_info"] = r["discover"]["seconds"] / r["info"]["seconds"]
        r["ratio_open"] = r["discover"]["seconds"] / r["open"]["seconds"]
        print(f"  {root.name} {'cold' if cold else 'warm'} round {rnd + 1}: discover {r['discover']['seconds']:.2f} s"
              f", info {r['info']['seconds']:.2f} s, open {r['open']['seconds']:.2f} s -> "
              f"{r['ratio_info']:.2f}x / {r['ratio_open']:.2f}x", flush=True)
        res.append(r)
    return res


def _run_child(what: str, root: Path) -> dict:
    return child_result([sys.executable, __file__, "--child", what, str(root)], what=what,
                        env={**os.environ, "PYTHONPATH": _pythonpath()})


def _pythonpath() -> str:
    repo = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join([repo] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def summarise(runs: dict) -> dict:
    out = {}
    for key, rs in runs.items():
        out[key] = {
            "ratio_info": spread([r["ratio_info"] for r in rs]),
            "ratio_open": spread([r["ratio_open"] for r in rs]),
            **{f"{w}_s": spread([r[w]["seconds"] for r in rs]) for w in ("discover", "info", "open")},
            **{f"{w}_peak_rss_mb": max(r[w]["peak_rss_mb"] for r in rs) for w in ("discover", "info", "open")},
        }
    return out


def table(summary: dict) -> str:
    lines = ["| files | page cache | discover s | 16-thread sf.info s | 16-thread SoundFile open s | "
             "discover / sf.info | discover / open | peak RSS discover / info / open (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, d in summary.items():
        n, cache = key.split("_")
        lines.append(
            f"| {int(n):,} | {cache} | {d['discover_s']['median']:.2f} | {d['info_s']['median']:.2f} | "
            f"{d['open_s']['median']:.2f} | {d['ratio_info']['median']:.2f} ({d['ratio_info']['min']:.2f}-"
            f"{d['ratio_info']['max']:.2f}) | {d['ratio_open']['median']:.2f} ({d['ratio_open']['min']:.2f}-"
            f"{d['ratio_open']['max']:.2f}) | {d['discover_peak_rss_mb']:.0f} / {d['info_peak_rss_mb']:.0f} / "
            f"{d['open_peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def plot(summary: dict, path: Path, machine: str) -> None:
    plt = pyplot()

    keys = list(summary)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = np.arange(len(keys))
    for off, (name, col) in zip((-0.2, 0.2), (("ratio_info", "#1f77b4"), ("ratio_open", "#ff7f0e"))):
        med = [summary[k][name]["median"] for k in keys]
        lo = [summary[k][name]["median"] - summary[k][name]["min"] for k in keys]
        hi = [summary[k][name]["max"] - summary[k][name]["median"] for k in keys]
        ax.bar(x + off, med, 0.4, yerr=[lo, hi], capsize=3, color=col,
               label={"ratio_info": "discover / 16-thread sf.info", "ratio_open": "discover / 16-thread open"}[name])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(x, [f"{int(k.split('_')[0]):,} files\n{k.split('_')[1]} cache" for k in keys], fontsize=8)
    ax.set_ylabel("time ratio (median, bars: range over rounds)\nbelow 1: discovery is faster")
    ax.set_title(f"discover() vs a bare parallel header read\n{machine}", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/discovery1m"), help="where the corpora are built")
    p.add_argument("--files", default="10000,100000,1000000", help="corpus sizes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cold", default="", help="sizes (comma-separated) also measured with the page cache dropped "
                                              "before each measurement (root only)")
    p.add_argument("--cold-rounds", type=int, default=1, help="rounds of each --cold size (each round drops the "
                                                                 "page cache three times)")
    p.add_argument("--make", action="store_true", help="only build the corpora")
    p.add_argument("--clean", action="store_true", help="delete --dir at the end")
    p.add_argument("--quick", action="store_true", help="10k and 100k files, 1 round (< 2 min; indicative only)")
    p.add_argument("--json", default="benchmarks/results/discovery.json")
    p.add_argument("--plot", default="docs/img/discovery.png")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers used the CPU at the same time")
    p.add_argument("--child", nargs=2, metavar=("WHAT", "ROOT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)))
        return 0
    if a.quick:
        a.files, a.rounds, a.cold = "10000,100000", 1, ""
    sizes = [int(s) for s in a.files.split(",")]
    cold = {int(s) for s in a.cold.split(",") if s}
    made = {n: corpus(a.dir, n) for n in sizes}
    if a.make:
        return 0
    runs: dict = {}
    loads: list = []
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    for n in sizes:
        root, expected = made[n]
        for cache in ("warm", "cold") if n in cold else ("warm",):
            if cache == "warm":  # the listing and the headers in the page cache (in a child: this process stays small)
                _run_child("open", root)
            runs[f"{n}_{cache}"] = measure(root, expected, a.rounds if cache == "warm" else a.cold_rounds,
                                           cold=cache == "cold")
            loads.append({"run": f"{n}_{cache}", "load_average": os.getloadavg()})
            summary = summarise(runs)  # written after every size, so a long run that is stopped keeps its figures
            Path(a.json).write_text(json.dumps({"machine": a.machine, "command": " ".join(sys.argv), "loads": loads,
                                                "summary": summary, "runs": runs}, indent=1))
    print(table(summary))
    if a.plot:
        plot(summary, Path(a.plot), a.machine)
    if a.clean:
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
