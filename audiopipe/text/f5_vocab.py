"""The pinyin vocab an F5-TTS run uses for a corpus's transcripts: the user's vocab.txt (a released checkpoint's), or
the one F5's preparation would write for these transcripts; every transcript is tokenised once up front so
unknown symbols are counted and reported before training starts."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from audiopipe.text.f5_pinyin import PinyinVocab, build_vocab, f5_pinyin_tokens, read_vocab


def pinyin_vocab_for(texts: Iterable[str | None], vocab_path: str | Path | None = None) -> PinyinVocab:
    """A PinyinVocab whose `unknown` counts cover every transcript given (see `.report()`); a trainer passes
    `audiopipe.reader.texts.shard_texts(shards)`."""
    token_lists = [f5_pinyin_tokens(t or "") for t in texts]
    vocab = PinyinVocab(read_vocab(vocab_path) if vocab_path else build_vocab(token_lists))
    for tokens in token_lists:
        vocab.ids(tokens)
    return vocab
