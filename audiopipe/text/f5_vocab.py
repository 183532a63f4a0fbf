"""The pinyin vocab an F5-TTS run uses for a shard folder: the user's vocab.txt (a released checkpoint's), or
the one F5's preparation would write for these transcripts; every transcript is tokenised once up front so
unknown symbols are counted and reported before training starts."""

from __future__ import annotations

from pathlib import Path

from audiopipe.text.f5_pinyin import PinyinVocab, build_vocab, f5_pinyin_tokens, read_vocab


def shard_texts(shards_dir: str | Path) -> list[str]:
    """Every transcript of a shard folder, in index order (reads the `text` column only)."""
    import pyarrow as pa

    from audiopipe.shard.manifest import read_manifest

    root = Path(shards_dir)
    texts: list[str] = []
    for entry in read_manifest(root)["shards"]:
        with pa.memory_map(str(root / entry["arrow"]["path"])) as src:
            texts.extend(pa.ipc.open_file(src).read_all().column("text").to_pylist())
    return texts


def pinyin_vocab_for(shards_dir: str | Path, vocab_path: str | Path | None = None) -> PinyinVocab:
    """A PinyinVocab whose `unknown` counts cover every transcript of the folder (see `.report()`)."""
    token_lists = [f5_pinyin_tokens(t or "") for t in shard_texts(shards_dir)]
    vocab = PinyinVocab(read_vocab(vocab_path) if vocab_path else build_vocab(token_lists))
    for tokens in token_lists:
        vocab.ids(tokens)
    return vocab
