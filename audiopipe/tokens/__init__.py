"""Semantic tokens for GPT-SoVITS stage 1, stored as a sidecar shard folder that the loader reads mmap'd.

Two sources, both written the same way:
    audiopipe tokens --shards ./shards --out ./tokens --name2semantic 6-name2semantic.tsv   # real SoVITS tokens
    audiopipe tokens --shards ./shards --out ./tokens --kmeans 512 --feature fbank          # k-means units

Storage: `--out` is an ordinary shard folder (docs/format.md), Arrow only (no tars):
    manifest.json  features = {"semantic": spec}; spec["kind"] says what the tokens ARE
                   ("sovits_semantic", or "kmeans-fbank-512"); job = how they were made, from which folder
    index.arrow    id, speaker, duration, semantic_frames, phones_frames, shard, row
    rejects.jsonl  every parent row that got no tokens, with the reason (nothing is dropped silently)
    report.json    the source's own report (tsv names that matched no row; k-means fit statistics)
    arrow/<parent shard name>.arrow   id, speaker, text, source, duration, semantic int16 [T], phones int16 [P]
So `make_loader("./tokens", ["semantic", "phones"])` works as for any shard folder. One token shard per parent
shard, rows in parent order; tokens are small (25 per second), so the copy of `phones` costs nothing.

    store.py    TokenSet and write_token_set: the folder above, from any source
    semantic.py GPT-SoVITS 6-name2semantic.tsv;  kmeans.py k-means units of a shard feature
    cli.py      the `audiopipe tokens` command
"""

from audiopipe.tokens.store import (REPORT_NAME, TOKEN_COLUMN, TokenSet, parent_ids, phones_note, prepare_out,
                                    read_report, token_spec, write_token_set)

__all__ = ["REPORT_NAME", "TOKEN_COLUMN", "TokenSet", "parent_ids", "phones_note", "prepare_out", "read_report",
           "token_spec", "write_token_set"]
