"""Semantic tokens for GPT-SoVITS stage 1, stored as a sidecar shard folder that the loader reads mmap'd.

Two sources, both written the same way:
    audiopipe tokens --shards ./shards --out ./tokens --name2semantic 6-name2semantic.tsv   # real SoVITS tokens
    audiopipe tokens --shards ./shards --out ./tokens --kmeans 512 --feature fbank          # k-means units

The folder they write is an ordinary shard folder (Arrow only), described in store.py; so
`make_loader("./tokens", ["semantic", "phones"])` works as for any shard folder.

    store.py    TokenSet and write_token_set: the folder, its layout, from any source
    semantic.py GPT-SoVITS 6-name2semantic.tsv;  kmeans.py k-means units of a shard feature
    cli.py      the `audiopipe tokens` command

May import: `audiopipe.shard.manifest`, `audiopipe.shard.columns` and `audiopipe.shard.writer` (the token folder
is a shard folder), `audiopipe.features.base` (the feature contract), `audiopipe.index.lengths` (its length
index), `audiopipe.reader.arrow_dataset` (reading the feature k-means clusters), `audiopipe.storage.atomic`
(durable writes), `audiopipe.features.names` (feature names).
"""

from audiopipe.tokens.store import (REPORT_NAME, TOKEN_COLUMN, TokenSet, parent_ids, phones_note, prepare_out,
                                    read_report, token_spec, write_token_set)

__all__ = ["REPORT_NAME", "TOKEN_COLUMN", "TokenSet", "parent_ids", "phones_note", "prepare_out", "read_report",
           "token_spec", "write_token_set"]
