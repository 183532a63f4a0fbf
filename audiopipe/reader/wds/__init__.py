"""Stream the WebDataset tars of a shard folder with the batching rules and samples of the mmap loader.

    plan.py    the epoch planned for every (rank, worker) stream from the index alone (StreamPlan)
    tar.py     one tar read sample by sample, checked against the index (plain tarfile + webdataset.gopen)
    stream.py  WdsStream, the IterableDataset that plays a stream's plan and pads its batches
    loader.py  make_wds_loader: the stream in a DataLoader, with make_loader's interface

Tars are opened with webdataset's `gopen`, so `tar_url="pipe:aws s3 cp s3://bucket/shards/{path} -"` or
`"https://host/shards/{path}"` stream from object storage; manifest.json and index.arrow are read locally.
docs/loader.md explains the plan.

May import: `audiopipe.reader` (the mmap dataset's index and shard checks and errors), `audiopipe.sampler` (the
batch budget and the rank), `audiopipe.collate.pad`, `audiopipe.shard.checksum` and `audiopipe.shard.writer`.
"""

from audiopipe.reader.wds.loader import WdsLoader, make_wds_loader
from audiopipe.reader.wds.plan import StreamBatches, StreamPlan, round_robin_taken, water_fill
from audiopipe.reader.wds.stream import STATE_FORMAT, WdsStream

__all__ = ["STATE_FORMAT", "StreamBatches", "StreamPlan", "WdsLoader", "WdsStream", "make_wds_loader",
           "round_robin_taken", "water_fill"]
