"""Batches into tensors: pad a batch's rows into reused torch buffers, one copy per item (docs/loader.md).

Where to look: `pad.py` holds `PadCollator`; `rows.py` the column-wise batch the mmap reader hands over;
`kernels.py` the compiled copy-and-pad loop.

May import: nothing else of audiopipe.
"""
