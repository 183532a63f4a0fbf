"""Chinese text normalisation for GPT-SoVITS phones: numbers read out (cn2an) and punctuation folded.

Rules (those of GPT-SoVITS's Chinese cleaner):
1. Arabic numbers become Chinese numerals with cn2an's `an2cn` transform, which also reads the common patterns:
   years digit by digit (2024年 -> 二零二四年), percentages (50% -> 百分之五十), fractions (1/2 -> 二分之一),
   decimals (3.14 -> 三点一四), temperatures (25℃ -> 二十五摄氏度).
2. 嗯 is written 恩 and 呣 母 (pypinyin reads them with no vowel, which has no phone).
3. Punctuation folds into the six marks the symbol table has: ：；，·、/ -> `,`  。$ -> `.`  ！ -> `!`
   ？ -> `?`  ... ~ ～ -> `…`  — -> `-`, and a newline ends a sentence (`.`).
4. Everything that is neither a Chinese character (U+4E00..U+9FA5) nor one of ! ? … , . - is dropped (English
   letters too, unless `keep_latin`: mixed lines keep them for the English front end).
5. A run of punctuation keeps its first mark.

GPT-SoVITS's newer releases read numbers with a port of PaddleSpeech's normaliser instead of cn2an; the two agree
on the patterns above and differ on others (phone numbers, times, ranges), where this one reads plain numbers.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache

from audiopipe.text.symbols import PUNCTUATION

_FOLD = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",",
         "...": "\u2026", "$": ".", "/": ",", "—": "-", "~": "\u2026", "～": "\u2026"}
_FOLD_RE = re.compile("|".join(re.escape(k) for k in sorted(_FOLD, key=len, reverse=True)))
_PUNCT = "".join(re.escape(p) for p in PUNCTUATION)
_DROP = re.compile(rf"[^\u4e00-\u9fa5{_PUNCT}]+")
_DROP_KEEP_LATIN = re.compile(rf"[^\u4e00-\u9fa5A-Za-z{_PUNCT}]+")
_REPEATED_PUNCT = re.compile(rf"([{_PUNCT}])[{_PUNCT}]+")


@lru_cache(maxsize=1)
def _an2cn():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import cn2an
    except ImportError as exc:
        raise ImportError("Chinese number reading needs cn2an: pip install 'audiopipe[text]'") from exc
    return cn2an.transform


def read_numbers(text: str) -> str:
    """Arabic numbers -> Chinese numerals (rule 1)."""
    if not any(c.isdigit() for c in text):
        return text
    return _an2cn()(text, "an2cn")


def fold_punctuation(text: str, keep_latin: bool = False) -> str:
    """Rules 2-5 on text whose numbers are already read."""
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _FOLD_RE.sub(lambda m: _FOLD[m.group()], text)
    text = (_DROP_KEEP_LATIN if keep_latin else _DROP).sub("", text)
    return _REPEATED_PUNCT.sub(r"\1", text)


def normalize_zh(text: str, keep_latin: bool = False) -> str:
    """The text GPT-SoVITS turns into Chinese phones."""
    return fold_punctuation(read_numbers(text), keep_latin)
