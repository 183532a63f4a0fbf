"""Exports of audiopipe shards into other projects' own on-disk layouts (f5: SWivid/F5-TTS's prepared data)."""
