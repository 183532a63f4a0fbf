"""One quiet, lazily initialised jieba (word segmentation and part-of-speech tags) for the text front ends.

jieba logs to stderr while it builds its prefix dictionary and imports pkg_resources (a deprecation warning);
both are noise for a data pipeline, so they are silenced here once.
"""

from __future__ import annotations

import logging
import warnings
from functools import lru_cache
from typing import Any

from audiopipe.errors import MissingExtra



@lru_cache(maxsize=1)
def _jieba() -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import jieba
            import jieba.posseg  # noqa: F401  (loaded here so later calls find it initialised)
    except ImportError as exc:
        raise MissingExtra("the Chinese front ends need jieba, pypinyin and cn2an: "
                          "pip install 'audiopipe[text]'") from exc
    jieba.setLogLevel(logging.ERROR)
    jieba.initialize()
    return jieba


def cut(text: str) -> list[str]:
    """jieba's default (accurate mode, HMM on) segmentation, the one F5-TTS uses."""
    return list(_jieba().cut(text))


def cut_tagged(text: str) -> list[tuple[str, str]]:
    """(word, part of speech) pairs, as GPT-SoVITS gets them from jieba's posseg."""
    return [(p.word, p.flag) for p in _jieba().posseg.lcut(text)]


def cut_for_search(word: str) -> list[str]:
    """Search-mode segmentation: also yields the sub-words of a long word (used to split 3-character words)."""
    return list(_jieba().cut_for_search(word))
