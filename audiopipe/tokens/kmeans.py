"""A self-contained semantic-token source: k-means units over a speech feature already in the shards.

These are NOT GPT-SoVITS semantic tokens (those come from the pretrained SoVITS quantizer over HuBERT features,
which cannot be downloaded here). They are named `kmeans-<feature>-<k>` everywhere (manifest kind, report,
summary) so nobody mistakes one for the other. They give stage 1 a learnable target of the same shape: a
discrete sequence at about 25 tokens per second.

Recipe (seeded end to end; same shards + same arguments -> same tokens):
  1. per utterance: subtract the utterance's mean per channel (CMN: removes channel/speaker offsets), then stack
     `stack` consecutive frames into one vector (fbank at 100 Hz, stack 4 -> 25 Hz like SoVITS's tokens); a
     trailing remainder of fewer than `stack` frames is dropped.
  2. fit sample: whole utterances in a seeded random order until `fit_vectors` vectors; every dimension is
     standardised with the sample's mean and std (kept in the codebook).
  3. k-means++ seeding on a subsample, then mini-batch k-means (Sculley 2010): each step assigns a random batch
     to the nearest centers and moves every center to the running mean of all vectors it was ever given; during
     the first half, centers that stay almost empty are re-seeded on batch points (as scikit-learn does).
  4. every utterance: nearest center per stacked vector -> int16 tokens.
The codebook is saved as `kmeans.npz` in the token folder; `--codebook` reuses it for another split/corpus.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audiopipe.errors import InvalidValue, NotFound
from audiopipe.features.base import FeatureSpec
from audiopipe.storage.atomic import write_bytes_atomic
from audiopipe.tokens import TokenSet, phones_note, prepare_out, write_token_set
from audiopipe.features.names import column_name

CODEBOOK_NAME = "kmeans.npz"
TARGET_RATE = 25.0  # tokens per second, as SoVITS v1/v2 semantic tokens


# ----------------------------------------------------------------------------- features -> vectors

def stack_frames(feat: np.ndarray, stack: int) -> np.ndarray:
    """[C, T] float -> [T // stack, C * stack] float32 after per-utterance mean removal (CMN)."""
    if feat.ndim != 2:
        raise InvalidValue(f"k-means needs a [channels, T] feature, got shape {feat.shape}")
    c, t = feat.shape
    n = t // stack
    x = feat.astype(np.float32, copy=False)
    x = x - x.mean(axis=1, keepdims=True)
    # [C, n*stack] -> [n, stack, C] -> [n, stack*C]: one vector is `stack` consecutive frames, frame-major.
    return np.ascontiguousarray(x[:, :n * stack].reshape(c, n, stack).transpose(1, 2, 0).reshape(n, stack * c))


def auto_stack(frame_rate: float) -> int:
    return max(1, int(round(frame_rate / TARGET_RATE)))


# ----------------------------------------------------------------------------- k-means

def _nearest(x: torch.Tensor, centers: torch.Tensor, chunk: int = 16384) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of and squared distance to the nearest center, in chunks so [n, k] never gets large."""
    c2 = (centers * centers).sum(1)
    labels, dists = [], []
    for i in range(0, len(x), chunk):
        xb = x[i:i + chunk]
        d = (xb * xb).sum(1, keepdim=True) - 2 * xb @ centers.T + c2
        v, j = d.min(1)
        labels.append(j)
        dists.append(v.clamp_min_(0))
    return torch.cat(labels), torch.cat(dists)


def _kmeans_pp(x: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """k-means++ seeding: each new center drawn with probability proportional to its squared distance."""
    centers = torch.empty(k, x.shape[1])
    centers[0] = x[torch.randint(len(x), (1,), generator=g)]
    d2 = ((x - centers[0]) ** 2).sum(1)
    for j in range(1, k):
        total = d2.sum()
        i = torch.multinomial(d2 / total, 1, generator=g) if total > 0 else torch.randint(len(x), (1,), generator=g)
        centers[j] = x[i]
        d2 = torch.minimum(d2, ((x - centers[j]) ** 2).sum(1))
    return centers


def kmeans_fit(x: np.ndarray, k: int, *, seed: int = 0, steps: int = 200, batch_size: int = 4096,
               reassign_ratio: float = 0.01) -> tuple[np.ndarray, float]:
    """Mini-batch k-means of x [N, D] -> (centers [k, D] float32, inertia = mean squared distance over x)."""
    n = len(x)
    if n < k:
        raise InvalidValue(f"{n} vectors cannot make {k} clusters; use fewer clusters or more data")
    g = torch.Generator().manual_seed(seed)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    b = min(batch_size, n)
    sub = xt[torch.randperm(n, generator=g)[:min(n, max(3 * b, 3 * k))]]
    centers = _kmeans_pp(sub, k, g)
    counts = torch.zeros(k)
    for step in range(steps):
        xb = xt[torch.randint(n, (b,), generator=g)]
        lab, _ = _nearest(xb, centers)
        nb = torch.bincount(lab, minlength=k).to(torch.float32)
        sums = torch.zeros_like(centers).index_add_(0, lab, xb)
        hit = nb > 0
        # Running mean of everything a center was given: per-center learning rate 1 / count (Sculley 2010).
        centers[hit] = (centers[hit] * counts[hit, None] + sums[hit]) / (counts[hit] + nb[hit])[:, None]
        counts += nb
        if step < steps // 2 and (step + 1) % 10 == 0:
            dead = (counts < reassign_ratio * counts.max()).nonzero().flatten()[: b // 2]
            if len(dead):
                centers[dead] = xb[torch.randperm(b, generator=g)[:len(dead)]]
                counts[dead] = counts[counts >= reassign_ratio * counts.max()].min()
    _, d = _nearest(xt, centers)
    return centers.numpy(), float(d.mean())


def inertia(x: np.ndarray, centers: np.ndarray) -> float:
    """Mean squared distance of x to the nearest of `centers`."""
    _, d = _nearest(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(centers))
    return float(d.mean())


# ----------------------------------------------------------------------------- codebook

@dataclass
class Codebook:
    centers: np.ndarray  # [k, D] float32, in standardised units
    mean: np.ndarray  # [D] of the fit sample (after CMN and stacking)
    std: np.ndarray  # [D]
    feature: str  # shard column the units were fitted on
    feature_hash: str  # its config hash: tokens from another fbank config would be meaningless
    stack: int
    seed: int
    fit_vectors: int
    inertia: float

    @property
    def k(self) -> int:
        return len(self.centers)

    @property
    def name(self) -> str:
        return f"kmeans-{self.feature}-{self.k}"

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "feature": self.feature, "feature_hash": self.feature_hash, "stack": self.stack,
                "seed": self.seed, "fit_vectors": self.fit_vectors, "inertia": self.inertia, "k": self.k}

    def digest(self) -> str:
        h = hashlib.sha256()
        for a in (self.centers, self.mean, self.std):
            h.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
        h.update(json.dumps({k: v for k, v in self.meta().items() if k != "inertia"}, sort_keys=True).encode())
        return h.hexdigest()[:16]

    def encode(self, feat: np.ndarray) -> np.ndarray:
        """[C, T] feature -> int16 tokens [T // stack]."""
        v = (stack_frames(feat, self.stack) - self.mean) / self.std
        lab, _ = _nearest(torch.from_numpy(v), torch.from_numpy(self.centers))
        return lab.numpy().astype(np.int16)

    def save(self, path: str | Path) -> None:
        buf = io.BytesIO()  # written whole and durably renamed: a half codebook never carries the final name
        np.savez(buf, centers=self.centers, mean=self.mean, std=self.std, meta=np.array(json.dumps(self.meta())))
        write_bytes_atomic(path, buf.getvalue())

    @staticmethod
    def load(path: str | Path) -> "Codebook":
        path = Path(path)
        if not path.is_file():
            raise NotFound(f"codebook not found: {path}")
        try:
            with np.load(path, allow_pickle=False) as z:
                m = json.loads(str(z["meta"]))
                return Codebook(z["centers"], z["mean"], z["std"], m["feature"], m["feature_hash"], m["stack"],
                                m["seed"], m["fit_vectors"], m["inertia"])
        except (KeyError, ValueError, OSError) as e:
            raise InvalidValue(f"{path} is not a codebook saved by `audiopipe tokens --kmeans` ({e})") from e


# `--feature auto`: the first kind of these the shards hold (filterbanks, as speech units are usually fitted on,
# then mels), else any float [channels, T] feature.
AUTO_ORDER = ("kaldi_fbank", "fbank", "vocos_mel", "slaney_mel", "mel")


def _floats(specs: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in specs.values()
            if s["channels"] > 0 and np.issubdtype(np.dtype(s["dtype"]), np.floating)]


def resolve_feature(manifest: dict[str, Any], feature: str, root: Path) -> dict[str, Any]:
    """The spec of the column to cluster, given its column name, its kind (fbank / kaldi_fbank), or "auto"."""
    specs = manifest["features"]
    if feature == "auto":
        usable = _floats(specs)
        ranked = sorted(usable, key=lambda s: (AUTO_ORDER.index(s["kind"]) if s["kind"] in AUTO_ORDER
                                               else len(AUTO_ORDER), s["name"]))
        if not ranked:
            raise InvalidValue(f"{root} has no float [channels, T] feature to cluster (it has {sorted(specs)}); "
                               f"shard with a filterbank or a mel, e.g. `audiopipe shard --preset eres2net`")
        return ranked[0]
    column = column_name(feature)  # kaldi_fbank -> fbank, with a note
    hits = [s for s in specs.values() if column == s["name"] or feature == s["kind"]]
    if not hits:
        arrays = sorted(n for n, s in specs.items() if s["channels"] > 0)
        raise InvalidValue(f"{root} has no feature {feature!r} to cluster (it has {sorted(specs)}; usable: {arrays}); "
                           f"shard with it too, e.g. `audiopipe shard --preset gpt_sovits,eres2net` adds the Kaldi "
                           f"fbank, or pass --feature <column>")
    s = hits[0]
    if s["channels"] == 0 or not np.issubdtype(np.dtype(s["dtype"]), np.floating):
        raise InvalidValue(f"feature {s['name']!r} is {s['dtype']} with {s['channels']} channels; k-means needs a "
                           f"float [channels, T] feature such as fbank or mel")
    return s


def fit_codebook(shards: str | Path, k: int, *, feature: str = "auto", stack: int = 0, seed: int = 0,
                 fit_vectors: int = 200_000, steps: int = 200, batch_size: int = 4096) -> Codebook:
    """Fit k units on a seeded sample of the shards' `feature` (see the module docstring for the recipe)."""
    from audiopipe.reader.arrow_dataset import ShardDataset
    from audiopipe.shard.manifest import read_manifest

    if k < 2 or k > 32767:
        raise InvalidValue(f"k must be in 2..32767 (tokens are stored as int16), got {k}")
    root = Path(shards)
    spec = resolve_feature(read_manifest(root), feature, root)
    stack = stack or auto_stack(spec["sample_rate"] / spec["hop_length"])
    ds = ShardDataset(root, [spec["name"]])
    order = np.random.default_rng(seed).permutation(len(ds))
    parts, total = [], 0
    for i in order:
        v = stack_frames(ds[int(i)][spec["name"]], stack)
        parts.append(v)
        total += len(v)
        if total >= fit_vectors:
            break
    x = np.concatenate(parts)[:fit_vectors]
    mean = x.mean(0)
    std = np.maximum(x.std(0), 1e-5).astype(np.float32)  # a constant dimension must not divide by zero
    x = (x - mean) / std
    centers, fit_inertia = kmeans_fit(x, k, seed=seed, steps=steps, batch_size=batch_size)
    return Codebook(centers, mean.astype(np.float32), std, spec["name"], spec["hash"], stack, seed, len(x),
                    fit_inertia)


def kmeans_tokens(shards: str | Path, out: str | Path, *, k: int | None = None, feature: str = "auto",
                  stack: int = 0, seed: int = 0, fit_vectors: int = 200_000, steps: int = 200,
                  batch_size: int = 4096, codebook: str | Path | None = None, force: bool = False,
                  progress: bool = False) -> list[str]:
    """Fit (or load) a codebook, tokenise every row of `shards`, write the token folder `out`; summary lines.
    progress=True shows a bar of the fit and of the rows tokenised on stderr."""
    from tqdm import tqdm

    from audiopipe.reader.arrow_dataset import ShardDataset
    from audiopipe.shard.manifest import read_manifest

    shards, out = Path(shards), Path(out)
    prepare_out(shards, out, force)
    manifest = read_manifest(shards)
    t0 = time.perf_counter()
    if codebook is not None:
        cb = Codebook.load(codebook)
        spec = resolve_feature(manifest, cb.feature, shards)
        if spec["hash"] != cb.feature_hash:
            raise InvalidValue(f"codebook {codebook} was fitted on {cb.feature} config {cb.feature_hash}, but "
                               f"{shards} has config {spec['hash']}; its units would not mean the same here")
        how = f"loaded from {codebook}"
    else:
        if k is None:
            raise InvalidValue("give --kmeans K to fit a codebook, or --codebook FILE to reuse one")
        with tqdm(total=1, desc=f"k-means fit ({k} units)", bar_format="{desc}: {elapsed}", disable=not progress,
                  file=sys.stderr) as bar:
            cb = fit_codebook(shards, k, feature=feature, stack=stack, seed=seed, fit_vectors=fit_vectors,
                              steps=steps, batch_size=batch_size)
            bar.update(1)
        spec = resolve_feature(manifest, cb.feature, shards)
        how = f"fitted on {cb.fit_vectors} vectors in {time.perf_counter() - t0:.1f} s"
    cb.save(out / CODEBOOK_NAME)
    ds = ShardDataset(shards, [spec["name"]])
    tokens: dict[int, np.ndarray] = {}
    rejects: dict[int, tuple[str, str]] = {}
    used = np.zeros(cb.k, dtype=np.int64)
    for i in tqdm(range(len(ds)), desc="tokens", unit="utt", disable=not progress, file=sys.stderr):
        item = ds[i]
        feat = item[spec["name"]]
        if feat.shape[-1] < cb.stack:
            rejects[i] = ("too_short_for_tokens", f"{feat.shape[-1]} {spec['name']} frames < stack {cb.stack}")
            continue
        tokens[i] = cb.encode(feat)
        used += np.bincount(tokens[i], minlength=cb.k)
    rate = spec["sample_rate"] / (spec["hop_length"] * cb.stack)
    tspec = FeatureSpec(name="semantic", kind=cb.name, sample_rate=spec["sample_rate"], dtype="int16", channels=0,
                        hop_length=spec["hop_length"] * cb.stack,
                        params={"source": "kmeans", "feature": cb.feature, "feature_hash": cb.feature_hash,
                                "codebook_size": cb.k, "stack": cb.stack, "seed": cb.seed, "cmn": "utterance",
                                "codebook_sha256": cb.digest()})
    job = {"kind": "tokens", "source": "kmeans", "name": cb.name, "parent": str(shards.resolve()),
           "parent_index_sha256": manifest["index"]["sha256"], "codebook": CODEBOOK_NAME}
    report = {"source": "kmeans", "name": cb.name, "not_sovits_tokens": True, **cb.meta(),
              "tokens_per_second": rate, "units_used": int((used > 0).sum()), "rows": len(ds),
              "tokenised": len(tokens), "seconds": round(time.perf_counter() - t0, 3)}
    write_token_set(shards, out, TokenSet(tspec, tokens, rejects, job, report))
    lines = [f"{cb.name}: k-means units, NOT GPT-SoVITS semantic tokens; codebook {how} "
             f"({cb.centers.shape[1]}-dim vectors = {cb.stack} x {cb.feature} frames, {rate:g} tokens/s)",
             f"fit inertia {cb.inertia:.3f} (standardised units); {report['units_used']}/{cb.k} units in use",
             f"tokenised {len(tokens)} of {len(ds)} rows -> {out}"]
    if rejects:
        lines.append(f"{len(rejects)} rows too short for one token (listed in rejects.jsonl)")
    note = phones_note(shards)
    return lines + ([note] if note else [])
