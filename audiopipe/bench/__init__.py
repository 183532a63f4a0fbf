"""`audiopipe bench-loader`: times audiopipe's loader against the way other projects load the same data (WebDataset
tars, one .npy per utterance, mel computed on the fly, lhotse Shar), on local shards or on object storage
(docs/bench-loader.md).

Where to look: `loader_bench.py` is the command and its report; `loaders.py` builds each loader compared;
`s3_loader.py` times the loader on `s3://` shards; `synthetic_lengths.py` makes seeded length arrays for the
batching benchmark; `files_dataset.py` is the one-.npy-per-utterance baseline (its export, dataset and loader,
also the trainers' `--reader files`); `guard.py` is the loader's regression guard (its small synthetic corpus and
the ratio to a plain copy loop that the test suite checks).

May import: `audiopipe.reader` (the loaders timed), `audiopipe.sampler` and `audiopipe.collate` (the same batches
for every loader), `audiopipe.features.mel` (the mel the baselines compute), `audiopipe.index.lengths` and
`audiopipe.shard.manifest` (what a shard folder holds), `audiopipe.shard.writer` and
`audiopipe.features.registry` (the guard's synthetic shards, written as `audiopipe shard` writes them), `audiopipe.storage.s3` (object storage),
`audiopipe.storage.atomic` (the baseline's export, written atomically), `audiopipe.features.names` (feature names).
"""
