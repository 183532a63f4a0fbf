"""Audio in: decode a file, a tar member, a table cell or a segment of a recording into float32 mono, resample
it, and refuse bad input with a reason (docs/corpus.md).

Where to look: `audio.py` decodes and resamples a file; `members.py` reads audio inside an uncompressed tar;
`cells.py` audio stored as bytes in a Parquet or Arrow cell; `segments.py` utterances cut out of longer
recordings; `declared.py` how much audio a header says a file holds.

May import: `audiopipe.storage.guard` (the guarded opening of every input file).
"""
