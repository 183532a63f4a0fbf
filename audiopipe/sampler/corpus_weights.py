"""Which items of each corpus an epoch plans, from per-corpus weights in hours per epoch.

Definition (docs/loader.md, "Mixing corpora"): a weight is the factor each corpus's audio hours are multiplied
by in one epoch. A corpus of H hours with weight w contributes w * H hours to every epoch:

- w = 1: each of its utterances once (the corpus as it is);
- w = 3: each utterance three times;
- w = 0.5: a random half of its hours, a different half every epoch (each utterance at most once);
- w = 2.5: every utterance twice, plus a random half of its hours a third time;
- w = 0: left out.

The fractional part f of w is drawn by hours, not by utterance count: the corpus's utterances in a random order
(seeded by (seed, epoch, corpus)), cut where their cumulative duration comes nearest to f * H. So a corpus of
long utterances is not over-represented by a draw of "half its items"; the realised hours are within half an
utterance of w * H. Everything is a pure function of (seed, epoch, weights, durations): identical on every rank,
re-derived on resume, never stored.

The sampler (BucketBatchSampler(epoch_items=...)) plans the returned items like any other: one global plan over
the union, equal batches per rank, exact mid-epoch resume and re-dealing under a new world size. A repeated
utterance is an index that occurs more than once in the epoch's item list; the sampler packs the first copies,
the second copies, ... as separate rounds (copy_rounds), so a batch never holds one utterance twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from audiopipe.errors import InvalidValue

_MIX_STREAM = 3  # keeps these draws independent of the sampler's own streams (pools 0, plan 1, deal 2)


def copy_rounds(items: np.ndarray) -> list[np.ndarray]:
    """Split an item list with repeats into rounds without any: round r holds the items seen more than r times
    (in index order).

    The sampler packs each round on its own, so no batch holds one utterance twice: packed together, the copies
    of an item (same length) would sit side by side in its sorted pool and land in the same batch. One counting
    pass, O(items + largest index), no sort: an epoch of 50M occurrences is split in about a second.
    """
    items = np.asarray(items, dtype=np.int64)
    if items.size == 0:
        return [items]
    counts = np.bincount(items)
    return [np.flatnonzero(counts > r) for r in range(int(counts.max()))]


def check_weights(weights: Sequence[float] | None, names: Sequence[str]) -> list[float]:
    """Weights as floats, one per corpus (default: all 1), or a one-line ValueError saying what is wrong."""
    twice = sorted({str(n) for n in names if list(names).count(n) > 1})
    if twice:
        raise InvalidValue(f"corpus {twice[0]} is listed twice: list it once and give it the sum of the weights")
    if weights is None:
        return [1.0] * len(names)
    w = list(weights)
    if len(w) != len(names):
        raise InvalidValue(f"{len(w)} weights for {len(names)} corpora ({', '.join(map(str, names))}): "
                           f"give one weight per corpus, in the same order")
    out = []
    for name, x in zip(names, w):
        try:
            v = float(x)
        except (TypeError, ValueError):
            raise InvalidValue(f"weight {x!r} of corpus {name} is not a number") from None
        if not math.isfinite(v) or v < 0:
            raise InvalidValue(f"weight {x!r} of corpus {name} must be a finite number >= 0 (a factor on its hours "
                               f"per epoch)")
        out.append(v)
    if not any(out):
        raise InvalidValue(f"all weights are 0 ({', '.join(map(str, names))}): an epoch would hold nothing")
    return out


@dataclass(frozen=True)
class CorpusShare:
    """One corpus in one epoch: what it has, what the epoch takes of it."""

    name: str
    weight: float
    items: int  # plannable utterances (not empty, not too long for the budget, not in a skipped shard)
    hours: float  # their audio hours
    full_repeats: int  # every item this many times ...
    extra_items: int  # ... and this many items once more (the fractional part of the weight)
    occurrences: int  # item occurrences the epoch plans: full_repeats * items + extra_items
    epoch_hours: float  # audio hours the epoch plans from this corpus
    share: float  # of the epoch's planned hours (realised)
    target_share: float  # what the weights ask: weight * hours / sum(weight * hours)

    def line(self) -> str:
        how = ("left out" if self.occurrences == 0 else
               f"x{self.full_repeats}" + (f" + {self.extra_items} more" if self.extra_items else "")
               if self.full_repeats else f"{self.extra_items} of {self.items} drawn")
        return (f"{self.name}: weight {self.weight:g}, {self.items} items / {self.hours:.4g} h -> {how} = "
                f"{self.epoch_hours:.4g} h ({self.share:.2%} of the epoch, target {self.target_share:.2%})")


class CorpusWeights:
    """epoch -> the epoch's items (positions the sampler plans; an item repeats as often as its weight says).

    corpus: corpus number of every position; seconds: its audio duration; usable: positions the sampler can
    plan (empty and too-long items, which it would drop anyway, are not counted as the corpus's hours).
    """

    def __init__(self, corpus: np.ndarray, seconds: np.ndarray, weights: Sequence[float], names: Sequence[str],
                 *, usable: np.ndarray | None = None, seed: int = 0):
        self.names = [str(n) for n in names]
        self.weights = check_weights(weights, self.names)
        corpus = np.asarray(corpus, dtype=np.int64)
        seconds = np.asarray(seconds, dtype=np.float64)
        if corpus.shape != seconds.shape or corpus.ndim != 1:
            raise InvalidValue(f"corpus and seconds must be 1-D of one length, got {corpus.shape} and {seconds.shape}")
        if corpus.size and (corpus.min() < 0 or corpus.max() >= len(self.names)):
            raise InvalidValue(f"corpus numbers must be in 0..{len(self.names) - 1}")
        ok = np.ones(corpus.size, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
        self.seed = int(seed)
        self.seconds = seconds
        self.members = [np.flatnonzero((corpus == k) & ok) for k in range(len(self.names))]
        for name, w, m in zip(self.names, self.weights, self.members):
            if w > 0 and m.size == 0:
                raise InvalidValue(f"corpus {name} has weight {w:g} but no utterance to train on (empty, skipped as "
                                   f"corrupt, or every one too long for the batch budget); give it weight 0 or drop it")
        self.hours = [float(seconds[m].sum()) / 3600 for m in self.members]
        self._memo: dict[tuple[int, int], np.ndarray] = {}

    def config(self) -> dict[str, Any]:
        """What a checkpoint records: resuming under other weights would plan other epochs."""
        # Not the names: the same corpora moved to another path (or to s3://) resume; the lengths' fingerprint
        # in the sampler state already tells other corpora apart.
        return {"weights": self.weights, "items": [int(m.size) for m in self.members]}

    def _extra(self, k: int, epoch: int) -> np.ndarray:
        """Corpus k's items drawn once more in this epoch (the fractional part of its weight). The last two
        epochs' draws are kept: the sampler's plan and the trainer's per-epoch summary ask for the same one, and
        a draw costs ~2 s for 10M items."""
        key = (k, epoch)
        if key not in self._memo:
            if len(self._memo) >= 2 * len(self.names):
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = self._draw(k, epoch)
        return self._memo[key]

    def _draw(self, k: int, epoch: int) -> np.ndarray:
        w, m = self.weights[k], self.members[k]
        frac = w - math.floor(w)
        if frac == 0 or m.size == 0:
            return m[:0]
        rng = np.random.default_rng([self.seed, _MIX_STREAM, epoch, k])
        order = m[rng.permutation(m.size)]
        cum = np.cumsum(self.seconds[order])
        target = frac * cum[-1]
        # The prefix whose hours come nearest the target (within half an utterance of it): the first j+1 items
        # reach it, the first j fall short.
        j = int(np.searchsorted(cum, target))
        if j >= cum.size:
            return order
        short = cum[j - 1] if j else 0.0
        return order[: j if target - short <= cum[j] - target else j + 1]

    def __call__(self, epoch: int) -> np.ndarray:
        parts = [np.concatenate([np.tile(m, int(math.floor(w))), self._extra(k, epoch)])
                 for k, (w, m) in enumerate(zip(self.weights, self.members))]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def shares(self, epoch: int) -> list[CorpusShare]:
        """Per corpus: items, hours, repeats or subsample, realised and target share of the epoch's hours."""
        rows = []
        for k, (w, m) in enumerate(zip(self.weights, self.members)):
            full, extra = int(math.floor(w)), self._extra(k, epoch)
            hours = full * self.hours[k] + float(self.seconds[extra].sum()) / 3600
            rows.append((k, full, extra, full * m.size + extra.size, hours))
        total = sum(r[4] for r in rows) or 1.0
        want = [w * h for w, h in zip(self.weights, self.hours)]
        return [CorpusShare(self.names[k], self.weights[k], int(self.members[k].size), self.hours[k], full,
                            int(extra.size), int(n), hours, hours / total, want[k] / (sum(want) or 1.0))
                for k, full, extra, n, hours in rows]

    def summary(self, epoch: int) -> str:
        return f"epoch {epoch} mix: " + "; ".join(s.line() for s in self.shares(epoch))
