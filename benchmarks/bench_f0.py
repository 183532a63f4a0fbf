"""F0 trackers against the consensus reference: accuracy (GPE, VDE, FFE, GPE_all), frame lag and speed, in one run.

    python benchmarks/bench_f0.py --pocketsphinx /path/to/pocketsphinx-5.1.1.tar.gz \
        --json benchmarks/results/f0.json --plot docs/img/f0_error_vs_speed.png

Every tracker (audiopipe yin, Praat 75-600, Praat 50-1100, pyworld dio and harvest at 50-1100, librosa pyin at
50-1100) runs on the same clips, 24 kHz, hop 320 (the NS2 framing), and is scored on the frames of
tests/data/f0_reference.npz (built by benchmarks/build_f0_reference.py; read its docstring for the rule):

  GPE      frames the reference and the tracker both call voiced where F0 is more than 20 % off, over those frames;
  VDE      frames whose voicing decision differs from the reference, over all reference frames;
  FFE      (GPE frames + VDE frames) over all reference frames;
  GPE_all  the tracker's F0 linearly interpolated through its unvoiced frames (interpolate=True, what NS2 trains
           on), > 20 % off, over the reference's voiced frames;
  lag      the shift s in [-3, 3] frames minimising the median |log2(f0[t + s] / ref[t])| on frames both call voiced.

Speed is CPU time of this process on one thread (OpenMP/MKL/numba pinned to 1 before import): audio seconds per
CPU second ("x RT per core"). Each round times every tracker once over all clips, interleaved, so trackers are
compared under the same machine load; the table gives the median over rounds and the yin / Praat 75-600 ratio per
round (min-max). Note that Praat 50-1100 is one half of the reference, so its scores are optimistic by construction.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy/numba load their thread pools

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import build_f0_reference as ref_builder  # noqa: E402
import f0_speech  # noqa: E402
from audiopipe.features.f0 import F0, interpolate_unvoiced  # noqa: E402
from results_io import cpu_name, pyplot, save, spread  # benchmarks/ (the script's own folder is on sys.path)

warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
SR, HOP = ref_builder.SR, ref_builder.HOP


def _feature(**kw) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    feat = F0(sample_rate=SR, hop_length=HOP, **kw)

    def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = feat(x)
        return out["f0"].astype(np.float64), out["voiced"].astype(bool)

    return run


def _pyin(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import librosa

    f0, voiced, _ = librosa.pyin(x, fmin=50.0, fmax=1100.0, sr=SR, frame_length=2048, hop_length=HOP, center=True)
    f0 = np.nan_to_num(f0)
    return np.where(voiced, f0, 0.0), voiced & (f0 > 0)


TRACKERS: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    "yin": _feature(),
    "praat 75-600": _feature(fmin=75.0, fmax=600.0, backend="praat"),
    "praat 50-1100": _feature(fmin=50.0, fmax=1100.0, backend="praat"),
    "dio": _feature(backend="dio"),
    "harvest": _feature(backend="harvest"),
    "pyin": _pyin,
}


def scores(f0: np.ndarray, voiced: np.ndarray, filled: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> dict:
    """GPE, VDE, FFE, GPE_all in % on the frames where mask is set; filled is f0 interpolated through unvoiced
    frames clip by clip (never across two clips)."""
    m = mask.astype(bool)
    r = (ref > 0) & m
    both = r & voiced
    gross = both & (np.abs(f0 / np.where(r, ref, 1.0) - 1.0) > 0.2)
    vde = (r != voiced) & m
    gross_all = r & (np.abs(filled / np.where(r, ref, 1.0) - 1.0) > 0.2)
    n = int(m.sum())
    return {
        "GPE": 100.0 * gross.sum() / max(int(both.sum()), 1),
        "VDE": 100.0 * vde.sum() / n,
        "FFE": 100.0 * (gross.sum() + vde.sum()) / n,
        "GPE_all": 100.0 * gross_all.sum() / max(int(r.sum()), 1),
        "frames": n,
        "ref_voiced": int(r.sum()),
    }


def best_lag(tracks: list[tuple[np.ndarray, np.ndarray]], refs: list[np.ndarray], masks: list[np.ndarray]) -> dict:
    """Median |log2 ratio| on frames both call voiced, for each shift of the tracker against the reference."""
    out = {}
    for s in range(-3, 4):
        errs = []
        for (f0, v), ref, m in zip(tracks, refs, masks):
            t = np.flatnonzero(m.astype(bool) & (ref > 0))
            t = t[(t + s >= 0) & (t + s < len(f0))]
            t = t[v[t + s]]
            errs.append(np.abs(np.log2(f0[t + s] / ref[t])))
        e = np.concatenate(errs)
        out[s] = float(np.median(e)) if len(e) else float("nan")
    return {"best": min(out, key=out.get), "median_abs_log2_by_shift": out}


def sensitivity(z, bounds, tracks: dict, splits: list[str], names: list[str]) -> list[dict]:
    """Scores on consensus references rebuilt from the stored Praat and CREPE tracks with other rules."""
    out = []
    for crepe_voiced in (0.1, 0.21, 0.5):
        for agree in (0.03, 0.05, 0.10):
            praat, crepe, per = z["praat"].astype(np.float64), z["crepe"].astype(np.float64), z["periodicity"]
            ran = ~np.isnan(per)
            pv, cv = praat > 0, ran & (np.nan_to_num(per) >= crepe_voiced)
            ok = pv & cv & (np.abs(np.nan_to_num(crepe) / np.where(pv, praat, 1.0) - 1.0) <= agree)
            mask = ran & (ok | (~pv & ~cv))
            ref = np.where(ok, np.sqrt(praat * np.nan_to_num(crepe)), 0.0)
            for split in sorted(set(splits), key=splits.index):
                sel = [i for i, s in enumerate(splits) if s == split]
                rr = np.concatenate([ref[bounds[i] : bounds[i + 1]] for i in sel])
                mm = np.concatenate([mask[bounds[i] : bounds[i + 1]] for i in sel])
                row = {"crepe_voiced": crepe_voiced, "agree": agree, "split": split, "frames": int(mm.sum())}
                for n in names:
                    row[n] = scores(np.concatenate([tracks[n][i][0] for i in sel]),
                                    np.concatenate([tracks[n][i][1] for i in sel]),
                                    np.concatenate([interpolate_unvoiced(*tracks[n][i], 50.0) for i in sel]), rr, mm)
                out.append(row)
    return out


def score_sel(track: list, refs: list, masks: list, sel: list[int]) -> dict:
    return scores(np.concatenate([track[i][0] for i in sel]), np.concatenate([track[i][1] for i in sel]),
                  np.concatenate([interpolate_unvoiced(*track[i], 50.0) for i in sel]),
                  np.concatenate([refs[i] for i in sel]), np.concatenate([masks[i] for i in sel]))


METRICS = ("GPE", "VDE", "FFE", "GPE_all")


def by_source(tracks: dict, refs: list, masks: list, splits: list[str], sources: list[str], names: list[str]) -> dict:
    """Per source: every tracker's scores on that source alone; and leave-one-source-out: each split's scores with
    one of its sources dropped."""
    per, loso = {}, {}
    groups = sorted(set(zip(sources, splits)), key=list(zip(sources, splits)).index)
    for src, split in groups:
        key = src if sum(g[0] == src for g in groups) == 1 else f"{src} ({split})"
        sel = [i for i, g in enumerate(zip(sources, splits)) if g == (src, split)]
        per[key] = {"split": split, "clips": len(sel), **{n: score_sel(tracks[n], refs, masks, sel) for n in names}}
        rest = [i for i, g in enumerate(zip(sources, splits)) if g[1] == split and g[0] != src]
        if rest:
            loso[key] = {"split": split, **{n: score_sel(tracks[n], refs, masks, rest) for n in names}}
    return {"per_source": per, "leave_one_source_out": loso}


def goal(res: dict, material: str, split: str) -> dict:
    """yin <= Praat 75-600 on every measure: on the split, on each leave-one-source-out subset, on each source alone
    (the worst source is reported), and under each reference rule of the sensitivity grid."""
    if "yin" not in res["trackers"] or "praat 75-600" not in res["trackers"]:
        return {}
    t = res["trackers"]
    margin = {m: t["yin"][split][m] - t["praat 75-600"][split][m] for m in METRICS}
    out = {"split": split, "yin_minus_praat75": margin, "holds": all(v <= 0 for v in margin.values()),
           "x_rt_cpu_median": t["yin"]["x_rt_cpu_median"]}
    srcs = {k: v for k, v in res["sources"]["per_source"].items() if v["split"] == split}
    worst = {}
    for m in METRICS:
        k = max(srcs, key=lambda k: srcs[k]["yin"][m] - srcs[k]["praat 75-600"][m])
        worst[m] = {"source": k, "yin": srcs[k]["yin"][m], "praat 75-600": srcs[k]["praat 75-600"][m]}
    out["worst_source"] = worst
    out["sources_where_yin_is_worse"] = {
        k: [m for m in METRICS if v["yin"][m] > v["praat 75-600"][m]] for k, v in srcs.items()
        if any(v["yin"][m] > v["praat 75-600"][m] for m in METRICS)}
    loso = {k: v for k, v in res["sources"]["leave_one_source_out"].items() if v["split"] == split}
    out["loso_fails"] = {k: [m for m in METRICS if v["yin"][m] > v["praat 75-600"][m]] for k, v in loso.items()
                         if any(v["yin"][m] > v["praat 75-600"][m] for m in METRICS)}
    out["loso_holds"] = not out["loso_fails"]
    if "sensitivity" in res:
        rows = [r for r in res["sensitivity"] if r["split"] == split]
        fails = [f"{r['crepe_voiced']}/{r['agree']:.0%}:" + ",".join(m for m in METRICS
                 if r["yin"][m] > r["praat 75-600"][m]) for r in rows
                 if any(r["yin"][m] > r["praat 75-600"][m] for m in METRICS)]
        out["rules_checked"], out["rule_fails"] = len(rows), fails
    return out


def machine() -> str:
    import numba

    return f"{cpu_name()}, 1 thread, {os.cpu_count()} cores; numba {numba.__version__}"


def load_material(material: str, reference: Path, source_arg: Path) -> dict:
    """Clips of one material set with their reference frames; exits if the audio is not what the reference saw."""
    z = np.load(reference, allow_pickle=False)
    bounds = np.concatenate([[0], np.cumsum(z["frames"])])
    if material == "prompts":
        items = [(c.source, c.ident, c.split, c.source, lambda c=c: ref_builder.load(c, source_arg))
                 for c in ref_builder.clips()]
    else:
        items = [(c.source.name, c.name, c.split, c.source.name, lambda c=c: f0_speech.load(c, source_arg))
                 for c in ref_builder.read_clips()]
    if len(items) != len(z["frames"]):
        sys.exit(f"bench_f0: {reference} lists {len(z['frames'])} clips, the {material} set has {len(items)} (rebuild)")
    out = {"clips": [], "refs": [], "masks": [], "splits": [], "sources": [], "z": z, "bounds": bounds}
    for i, (source, ident, split, group, loader) in enumerate(items):
        if z["source"][i] != source or z["ident"][i] != ident:
            sys.exit(f"bench_f0: {reference} does not list the builder's clips (rebuild it)")
        x = loader()
        if ref_builder.audio_digest(x) != z["digest"][i]:
            sys.exit(f"bench_f0: {ident} decodes differently from when the reference was built (rebuild it)")
        out["clips"].append(x)
        out["refs"].append(z["ref"][bounds[i] : bounds[i + 1]].astype(np.float64))
        out["masks"].append(z["mask"][bounds[i] : bounds[i + 1]].astype(bool))
        out["splits"].append(split)
        out["sources"].append(group)
    out["audio_s"] = sum(len(x) for x in out["clips"]) / SR
    return out


SPLITS = {"prompts": ("in", "out"), "read": ("dev", "test")}
SPLIT_NAMES = {"in": "held-in", "out": "held-out", "dev": "dev (tuned on)", "test": "test (never tuned on)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pocketsphinx", type=Path, default=None,
                   help="pocketsphinx-5.1.1.tar.gz (sdist): scores the first material set (prompts)")
    p.add_argument("--speech-cache", type=Path, default=None,
                   help="folder of the PyPI archives of the real read speech set (benchmarks/f0_speech.py fetch)")
    p.add_argument("--reference", type=Path, default=HERE.parent / "tests/data/f0_reference.npz")
    p.add_argument("--reference-read", type=Path, default=HERE.parent / "tests/data/f0_reference_read.npz")
    p.add_argument("--rounds", type=int, default=3, help="timing rounds (every tracker once per round)")
    p.add_argument("--trackers", default=",".join(TRACKERS), help="comma-separated subset of: " + ", ".join(TRACKERS))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("--sensitivity", action="store_true",
                   help="also score on references rebuilt from the stored raw tracks with other CREPE voicing "
                        "thresholds and agreement tolerances (does the reference's rule decide the ranking?)")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.trackers.split(",")]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        p.error(f"unknown tracker(s) {unknown}; choose from {list(TRACKERS)}")
    if a.pocketsphinx is None and a.speech_cache is None:
        p.error("give --pocketsphinx (the prompts set) and/or --speech-cache (the real read speech set)")
    sets = {}
    if a.pocketsphinx is not None:
        sets["prompts"] = load_material("prompts", a.reference, a.pocketsphinx)
    if a.speech_cache is not None:
        sets["read"] = load_material("read", a.reference_read, a.speech_cache)

    load_before = os.getloadavg()
    # Warm-up: numba compiles, parselmouth/pyworld/librosa load.
    first = next(iter(sets.values()))["clips"][0]
    for n in names:
        TRACKERS[n](first[: SR // 2])
    cpu = {(m, n): [] for m in sets for n in names}
    wall = {(m, n): [] for m in sets for n in names}
    tracks: dict = {}
    for r in range(a.rounds):
        for m, d in sets.items():
            for n in names:
                c0, w0 = time.process_time(), time.perf_counter()
                out = [TRACKERS[n](x) for x in d["clips"]]
                cpu[m, n].append(time.process_time() - c0)
                wall[m, n].append(time.perf_counter() - w0)
                tracks[m, n] = out
            print(f"round {r + 1}/{a.rounds} {m}: " + ", ".join(f"{n} {d['audio_s'] / cpu[m, n][-1]:.0f}x"
                                                                 for n in names), flush=True)

    info = {"machine": machine(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python benchmarks/bench_f0.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "rounds": a.rounds, "load_before": load_before,
            "note": "shared 2-core CPU VM, no GPU; other engineers were using the CPU at the same time"}
    results: dict = {}
    for m, d in sets.items():
        tr = {n: tracks[m, n] for n in names}
        res: dict = {"audio_s": d["audio_s"], "clips": len(d["clips"]), "trackers": {}}
        for n in names:
            t = {"x_rt_cpu_median": d["audio_s"] / float(np.median(cpu[m, n])),
                 "x_rt_cpu_rounds": [d["audio_s"] / c for c in cpu[m, n]],
                 "x_rt_wall_median": d["audio_s"] / float(np.median(wall[m, n]))}
            for split in (*SPLITS[m], "all"):
                sel = [i for i, s in enumerate(d["splits"]) if split in ("all", s)]
                t[split] = score_sel(tr[n], d["refs"], d["masks"], sel)
            t["lag"] = best_lag(tr[n], d["refs"], d["masks"])
            res["trackers"][n] = t
        res["sources"] = by_source(tr, d["refs"], d["masks"], d["splits"], d["sources"], names)
        if a.sensitivity:
            res["sensitivity"] = sensitivity(d["z"], d["bounds"], tr, d["splits"], names)
        if "yin" in names and "praat 75-600" in names:
            ratios = [p_ / y for y, p_ in zip(cpu[m, "yin"], cpu[m, "praat 75-600"])]
            res["yin_over_praat75_speed"] = spread(ratios)
            res["goal"] = {split: goal(res, m, split) for split in SPLITS[m]}
        results[m] = res
    info["load_after"] = os.getloadavg()
    report(results, names, info)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"info": info, "results": results}, indent=2) + "\n")
    if a.plot:
        plot(results, names, info, a.plot)
    return 0


def report(results: dict, names: list[str], info: dict) -> None:
    print(f"\n{info['machine']}; {info['rounds']} rounds; load {info['load_before'][0]:.1f} before, "
          f"{info['load_after'][0]:.1f} after")
    for m, res in results.items():
        print(f"\n## {m}: {res['clips']} clips, {res['audio_s']:.0f} s\n")
        print("| tracker | split (frames) | x RT per core (CPU) | GPE % | VDE % | FFE % | GPE_all % | best lag |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for n in names:
            t = res["trackers"][n]
            for split in (*SPLITS[m], "all"):
                s = t[split]
                print(f"| {n} | {SPLIT_NAMES.get(split, split)} ({s['frames']}) | {t['x_rt_cpu_median']:,.0f} | "
                      f"{s['GPE']:.2f} | {s['VDE']:.2f} | {s['FFE']:.2f} | {s['GPE_all']:.2f} | {t['lag']['best']} |")
        if "yin_over_praat75_speed" in res:
            q = res["yin_over_praat75_speed"]
            print(f"\nyin / Praat 75-600 speed: {q['median']:.2f}x (rounds {q['min']:.2f}-{q['max']:.2f})")
        if "yin" in names and "praat 75-600" in names:
            print("\n| source | split | clips | frames | yin GPE / VDE / FFE / GPE_all % | Praat 75-600 GPE / VDE / FFE / "
                  "GPE_all % |")
            print("|---|---|---:|---:|---|---|")
            for k, v in res["sources"]["per_source"].items():
                y, q = v["yin"], v["praat 75-600"]
                print(f"| {k} | {v['split']} | {v['clips']} | {y['frames']} | "
                      + " / ".join(f"{y[x]:.2f}" for x in METRICS) + " | "
                      + " / ".join(f"{q[x]:.2f}" for x in METRICS) + " |")
            for split, g in res.get("goal", {}).items():
                w = ", ".join(f"{x} {v['source']} ({v['yin']:.2f} vs {v['praat 75-600']:.2f})"
                              for x, v in g["worst_source"].items())
                print(f"\n{m} {split}: yin - Praat 75-600 = " + ", ".join(f"{x} {v:+.2f}" for x, v in
                                                                          g["yin_minus_praat75"].items())
                      + f"; holds: {g['holds']}; leave-one-source-out holds: {g['loso_holds']} {g['loso_fails']}"
                      + f"\n  worst source per measure (yin vs Praat): {w}"
                      + f"\n  sources where yin is worse on some measure: {g['sources_where_yin_is_worse']}"
                      + (f"\n  reference rules: {g['rules_checked']} checked, fails {g['rule_fails']}"
                         if "rules_checked" in g else ""))
        if "sensitivity" in res:
            print("\n| CREPE voiced at | agreement | split | frames | " + " | ".join(f"{n} FFE / GPE_all %"
                                                                               for n in names) + " |")
            print("|---:|---:|---|---:|" + "---:|" * len(names))
            for row in res["sensitivity"]:
                print(f"| {row['crepe_voiced']} | {row['agree']:.0%} | {row['split']} | {row['frames']} | "
                      + " | ".join(f"{row[n]['FFE']:.2f} / {row[n]['GPE_all']:.2f}" for n in names) + " |")


def plot(results: dict, names: list[str], info: dict, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(len(results), 2, figsize=(10, 4 * len(results)), squeeze=False)
    for row, (m, res) in zip(axes, results.items()):
        for ax, metric in zip(row, ("FFE", "GPE_all")):
            for n in names:
                x = res["trackers"][n]["x_rt_cpu_median"]
                for split, marker in zip(SPLITS[m], ("o", "s")):
                    y = res["trackers"][n][split][metric]
                    ax.scatter(x, y, marker=marker, color="C0" if n == "yin" else "C1" if n.startswith("praat")
                               else "C2")
                    ax.annotate(f"{n} ({split})", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_xlabel("x real time per core (CPU time, 1 thread)")
            ax.set_ylabel(f"{metric} % vs consensus reference")
            ax.set_title(f"{m} set ({res['clips']} clips, {res['audio_s']:.0f} s): circles {SPLITS[m][0]}, "
                         f"squares {SPLITS[m][1]}", fontsize=8)
            ax.axvline(500, color="grey", lw=0.5, ls="--")
            ax.grid(alpha=0.3)
    fig.suptitle(f"F0 error against speed\n{info['machine']}; {info['note']}", fontsize=8)
    save(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
