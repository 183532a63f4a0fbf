"""Peak memory of reading one short segment of a long recording (a Kaldi `segments` line, a NeMo offset, a lhotse
supervision), the way the shard builder reads it (RecordingCache.load).

    python benchmarks/bench_segment_rss.py --hours 2 --code . --code /path/to/checkout/before \
        --json benchmarks/results/segment_rss.json

Builds (once, under --dir) a WAV recording of --hours at 16 kHz mono (low noise, 230 MB for 2 h) and a Kaldi
data dir with one --seconds segment in its middle, then in a fresh child process discovers it, reads the
segment and reports the child's peak resident memory (VmHWM) and its baseline (after imports, before the
read), and checks the samples against a direct soundfile read of those frames.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

from results_io import write_results  # noqa: E402  (benchmarks/: the script's own folder is on sys.path)

SR = 16000
CHILD = r"""
import json, sys
def hwm(key="VmHWM:"):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
import numpy as np, soundfile as sf
import audiopipe
from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits
from audiopipe.decode.segments import RecordingCache
root = sys.argv[1]
d = discover(root)
base = hwm("VmRSS:")
u = d.utterances[0]
wav, sr = RecordingCache(d.utterances).load(u, DecodeLimits(max_duration=60))
peak = hwm()
with sf.SoundFile(u.path) as f:
    f.seek(u.extra["start_frame"])
    ok = bool(np.array_equal(wav, f.read(u.extra["end_frame"] - u.extra["start_frame"], dtype="float32")))
print(json.dumps({"code": audiopipe.__file__, "baseline_mb": round(base, 1), "peak_mb": round(peak, 1),
                  "segment_s": len(wav) / sr, "samples_equal": ok}))
"""


def build(folder: Path, hours: float, seconds: float) -> Path:
    import numpy as np
    import soundfile as sf

    root = folder / f"kaldi_{hours:g}h"
    rec = root / "long.wav"
    if not rec.exists():
        root.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        tmp = rec.with_suffix(".part")
        with sf.SoundFile(tmp, "w", SR, 1, "PCM_16", format="WAV") as f:
            for _ in range(int(hours * 60)):
                f.write((0.1 * rng.standard_normal(60 * SR)).astype(np.float32))
        tmp.rename(rec)
    start = hours * 1800.0
    (root / "wav.scp").write_text(f"rec {rec}\n")
    (root / "segments").write_text(f"rec-seg rec {start:.2f} {start + seconds:.2f}\n")
    return root


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--dir", type=Path, default=Path("/tmp/segment_rss"))
    p.add_argument("--code", type=Path, action="append", help="a checkout whose audiopipe is measured (repeat to "
                                                            "compare; default: this one)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    root = build(a.dir, a.hours, a.seconds)
    runs = []
    for code in a.code or [ROOT]:
        code = code.resolve()
        env = {**os.environ, "PYTHONPATH": str(code)}
        out = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True, text=True, env=env,
                             cwd=str(code))
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]))
    result = {"hours": a.hours, "segment_s": a.seconds, "sample_rate": SR,
              "recording_mb": round((root / "long.wav").stat().st_size / 2**20, 1), "runs": runs,
              "load_avg": round(os.getloadavg()[0], 1), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])}
    write_results(result, a.json, lambda path: None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
