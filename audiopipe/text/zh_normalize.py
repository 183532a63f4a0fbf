"""Chinese text normalisation for GPT-SoVITS phones: numbers read out (cn2an) and punctuation folded.

Rules (those of GPT-SoVITS's Chinese cleaner):
1a. First the patterns cn2an would read as arithmetic, as GPT-SoVITS's normaliser reads them: dates written
   2024-03-05 (or / .) -> 二零二四年三月五日; clock times 12:30 -> 十二点半, 8:05 -> 八点零五分; temperatures
   -5℃ -> 零下五度 (度, or 摄氏度 when so written); mobile numbers digit by digit with 一 as 幺.
1. Then Arabic numbers become Chinese numerals with cn2an's `an2cn` transform, which also reads the common
   patterns: years digit by digit (2024年 -> 二零二四年), percentages (50% -> 百分之五十), fractions (1/2 ->
   二分之一), decimals (3.14 -> 三点一四), ranges (1-2天 -> 一到二天). A lone 2 before a measure word or 万/千/亿
   counts something and is read 两 (两个, 两万, 两斤), as GPT-SoVITS reads it.
2. 嗯 is written 恩 and 呣 母 (pypinyin reads them with no vowel, which has no phone).
3. Punctuation folds into the six marks the symbol table has: ：；，·、/ -> `,`  。$ -> `.`  ！ -> `!`
   ？ -> `?`  ... ~ ～ -> `…`  — -> `-`, and a newline ends a sentence (`.`).
4. Everything that is neither a Chinese character (U+4E00..U+9FA5) nor one of ! ? … , . - is dropped (English
   letters too, unless `keep_latin`: mixed lines keep them for the English front end).
5. A run of punctuation keeps its first mark.

GPT-SoVITS reads numbers with a port of PaddleSpeech's normaliser; with rule 1a the two agree on the patterns
above; they still differ on landline numbers, measure units (kg -> 千克) and other rarer forms, which this reads
as plain numbers (or drops, for Latin unit letters).
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache

from audiopipe.errors import MissingExtra
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
        raise MissingExtra("Chinese number reading needs cn2an: pip install 'audiopipe[text]'") from exc
    return cn2an.transform


_DIGITS = "零一二三四五六七八九"
# Patterns GPT-SoVITS's normaliser reads before plain numbers (cn2an reads them as arithmetic otherwise).
_ISO_DATE = re.compile(r"(\d{4})([-/.])(0[1-9]|1[012])\2(0[1-9]|[12]\d|3[01])")
_TIME = re.compile(r"(?<!\d)([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?(?!\d)")
_TEMPERATURE = re.compile(r"(-?)(\d+(?:\.\d+)?)(°C|℃|摄氏度|度)")
_MOBILE = re.compile(r"(?<!\d)((?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
# A lone 2 counting something is 两, not 二 (两个, 两万, 两斤): before a measure word or a large-number unit. Ordinal
# and clock uses (2号, 2楼, 第2个, 2点) and 2 inside longer numbers (12斤, 2.5万) stay 二, as GPT-SoVITS reads them.
_COUNTED_TWO = re.compile(r"(?<![\d.第])2(?![\d.])(?=(?:万|千|亿|个|只|本|张|条|件|位|辆|家|杯|层|岁|天|年(?!\d)|"
                          r"斤|元|块|人|种|句|双|对|把|台|部|首|篇|份|节|门|片|棵|朵|匹|头|口|间|所|座|架|艘|"
                          r"小时|分钟|周|星期|米|公斤))")


def _digits(s: str, alt_one: bool = False) -> str:
    out = "".join(_DIGITS[int(c)] for c in s if c.isdigit())
    return out.replace("一", "幺") if alt_one else out


def _clock_part(s: str, unit: str) -> str:
    # "05" -> 零五: a leading zero is read, as on a clock.
    n = _an2cn()(str(int(s)), "an2cn") if int(s) else ""
    return (("零" if s.startswith("0") else "") + n + unit) if n else ""


def _time(m: re.Match) -> str:
    hour, minute, second = m.group(1), m.group(2), m.group(3)
    out = _an2cn()(str(int(hour)), "an2cn") + "点"
    out += "半" if minute == "30" else _clock_part(minute, "分")
    return out + (_clock_part(second, "秒") if second else "")


def read_patterns(text: str) -> str:
    """Dates written 2024-03-05, clock times, temperatures and mobile numbers, read the way GPT-SoVITS's normaliser
    reads them (rule 1a): 二零二四年三月五日, 十二点半 / 十二点零五分, 零下五度, 幺三八... (digits, 一 as 幺)."""
    text = _ISO_DATE.sub(lambda m: f"{_digits(m.group(1))}年{_an2cn()(str(int(m.group(3))), 'an2cn')}月"
                                   f"{_an2cn()(str(int(m.group(4))), 'an2cn')}日", text)
    text = _TIME.sub(_time, text)
    text = _TEMPERATURE.sub(lambda m: ("零下" if m.group(1) else "") + _an2cn()(m.group(2), "an2cn")
                            + ("摄氏度" if m.group(3) == "摄氏度" else "度"), text)
    text = _MOBILE.sub(lambda m: "，".join(_digits(p, alt_one=True) for p in m.group(1).lstrip("+").split()), text)
    return _COUNTED_TWO.sub("两", text)


def read_numbers(text: str) -> str:
    """Arabic numbers -> Chinese numerals (rules 1a and 1)."""
    if not any(c.isdigit() for c in text):
        return text
    return _an2cn()(read_patterns(text), "an2cn")


def fold_punctuation(text: str, keep_latin: bool = False) -> str:
    """Rules 2-5 on text whose numbers are already read."""
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _FOLD_RE.sub(lambda m: _FOLD[m.group()], text)
    text = (_DROP_KEEP_LATIN if keep_latin else _DROP).sub("", text)
    return _REPEATED_PUNCT.sub(r"\1", text)


def normalize_zh(text: str, keep_latin: bool = False) -> str:
    """The text GPT-SoVITS turns into Chinese phones."""
    return fold_punctuation(read_numbers(text), keep_latin)
