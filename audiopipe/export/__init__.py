"""Exports of audiopipe shards into other projects' own on-disk layouts: f5 (SWivid/F5-TTS's prepared data),
lhotse (a CutSet in lhotse Shar), hf (a Hugging Face `save_to_disk` folder), nemo (a NeMo JSON-lines manifest and
its audio). docs/export.md describes each."""
