"""Exports of audiopipe shards into other projects' own on-disk layouts: f5 (SWivid/F5-TTS's prepared data),
lhotse (a CutSet in lhotse Shar), hf (a Hugging Face `save_to_disk` folder), nemo (a NeMo JSON-lines manifest and
its audio). docs/export.md describes each.

May import: `audiopipe.reader.arrow_dataset` (reading the shards), `audiopipe.shard.manifest`,
`audiopipe.shard.keys` and `audiopipe.shard.writer` (a shard folder's layout), `audiopipe.features.mel`
(F5-TTS's mel), `audiopipe.text.f5_pinyin` (F5-TTS's tokenisation), `audiopipe.storage.atomic` and
`audiopipe.storage.paths` (durable writes), `audiopipe.features.names` (feature names and their aliases).
"""
