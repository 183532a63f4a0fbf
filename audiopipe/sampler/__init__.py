"""Which utterances go together: length-bucketed, padded-budget batch samplers for data-parallel training, each
with `__iter__`, `state_dict` / `load_state_dict` and its diagnostics (docs/sampler.md).

Where to look: `bucket.py` holds `BucketBatchSampler`; `plan.py` the pieces of an epoch plan and `pools.py`
their assembly; `bucket_budget.py` per-length budgets; `deal.py` hands batches to ranks and `dist.py` says
which rank this is; `corpus_weights.py` mixes corpora; `block_window.py` plans batches from a few large blocks
at a time; `passes.py` the epoch and resume positions both samplers share; `counting.py` is the compiled
counting sort; `repeat.py` plans a small corpus's epoch as several passes cut into full batches; `shapes.py`
pads every batch to one of K shapes.

May import: `audiopipe.storage.atomic` (saving a budget table).
"""
