"""Shard sets in, padded batches out: the mmap and object-storage datasets, the loader that joins them to a
sampler and a collator, and the WebDataset stream (docs/loader.md).

Where to look: `loader.py` holds `make_loader` and `Loader`; `open_dataset.py` turns shard sets into one dataset
(`mixture.py` when there are several); `arrow_dataset.py` is the local mmap dataset, built on `mapped_shard.py`
(one mapped shard), `open_shards.py` (the shards kept open) and `ipc_layout.py` (where an Arrow file's buffers
lie); `remote_dataset.py`, `blocks.py` and `shard_cache.py` read s3:// shard sets; `integrity.py` and
`skipped.py` decide which shards can be read and what happens to the others; `read_ahead.py` and `prefetch.py`
work ahead of the training step; `reading.py` is the option group for how rows come off storage; `texts.py`
lists the transcripts; `errors.py` the errors; `wds/` streams the WebDataset tars.

May import: `audiopipe.collate` (padding batches), `audiopipe.sampler` (planning them), `audiopipe.index`
(the length index), `audiopipe.shard.checksum`, `audiopipe.shard.columns`, `audiopipe.shard.manifest` and
`audiopipe.shard.writer` (the shard format it reads), `audiopipe.storage` (s3:// and atomic files) and
`audiopipe.after_fork` (resetting state in forked workers), `audiopipe.features.names` (feature names and
their aliases).
"""
