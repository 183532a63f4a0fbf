"""The length index: one small row per written utterance, so samplers plan batches without opening payloads, and
zero-copy numpy views of Arrow columns.

Where to look: `lengths.py` writes and reads the index (local or `s3://`); `arrow_views.py` makes the views.

May import: `audiopipe.storage.atomic`, `audiopipe.storage.s3` and `audiopipe.storage.s3_ranges` (where the
index is written and read).
"""
