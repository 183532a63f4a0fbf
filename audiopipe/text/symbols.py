"""GPT-SoVITS's phone symbol table, rebuilt from the rule its `symbols.py` documents, and user tables.

The table is the sorted set of: the pad `_`; the initials (21 consonant initials plus y, w and the zero-initial
markers AA, EE, OO); every final with tones 1-5; the Japanese phones; the punctuation ! ? … , . - with SP, SP2,
SP3, UNK; and the ARPAbet phones (CMU's 24 consonants, 15 vowels with stress 0/1/2, plus bare ER and IH).
Sorting is Python's code-point order, so an id is the symbol's rank. That gives 322 symbols: the whole table of
v1 checkpoints, and the first 322 ids of v2 and later (they append Japanese pitch marks, Korean and Cantonese
after these). A checkpoint trained on another table can bring it with `load_symbol_table`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from audiopipe.errors import InvalidValue

PAD = "_"
PUNCTUATION = ("!", "?", "\u2026", ",", ".", "-")
SPECIAL = ("SP", "SP2", "SP3", "UNK")
ZERO_INITIALS = ("AA", "EE", "OO")  # stand-in initials of syllables that start with a, e, o
INITIALS = ZERO_INITIALS + ("b", "c", "ch", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "q", "r", "s", "sh",
                            "t", "w", "x", "y", "z", "zh")
# E: the e of ye/ie-less "ye"; En: the an of yan; i0: the apical vowel of zi/ci/si; ir: that of zhi/chi/shi/ri;
# v: ü (ju, yu, lü). The rest are spelled as in pinyin.
FINALS = ("E", "En", "a", "ai", "an", "ang", "ao", "e", "ei", "en", "eng", "er", "i", "i0", "ia", "ian", "iang",
          "iao", "ie", "in", "ing", "iong", "ir", "iu", "o", "ong", "ou", "u", "ua", "uai", "uan", "uang", "ui", "un",
          "uo", "v", "van", "ve", "vn")
TONES = ("1", "2", "3", "4", "5")
JAPANESE = ("I", "N", "U", "a", "b", "by", "ch", "cl", "d", "dy", "e", "f", "g", "gy", "h", "hy", "i", "j", "k", "ky",
            "m", "my", "n", "ny", "o", "p", "py", "r", "ry", "s", "sh", "t", "ts", "u", "v", "w", "y", "z")
ARPA_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T",
                   "TH", "V", "W", "Y", "Z", "ZH")
ARPA_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
ARPA = ARPA_CONSONANTS + tuple(v + s for v in ARPA_VOWELS for s in "012") + ("ER", "IH")


@lru_cache(maxsize=1)
def gpt_sovits_symbols() -> tuple[str, ...]:
    """The 322-symbol GPT-SoVITS table (ids = positions)."""
    every = {PAD, *INITIALS, *(f + t for f in FINALS for t in TONES), *JAPANESE, *PUNCTUATION, *SPECIAL, *ARPA}
    return tuple(sorted(every))


def load_symbol_table(path: str | Path) -> tuple[str, ...]:
    """A symbol table from a file: a JSON list, or one symbol per line (line number = id)."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidValue(f"cannot read symbol table {p}: {e}") from None
    if raw.lstrip().startswith("["):
        try:
            table = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InvalidValue(f"symbol table {p}: not valid JSON: {e}") from None
        if not all(isinstance(s, str) for s in table):
            raise InvalidValue(f"symbol table {p}: every entry must be a string")
    else:
        table = raw.split("\n")
        if table and table[-1] == "":
            table.pop()
    if not table:
        raise InvalidValue(f"symbol table {p} is empty")
    if len(set(table)) != len(table):
        raise InvalidValue(f"symbol table {p} lists a symbol more than once")
    return tuple(table)


def symbols_to_ids(symbols: list[str], table: tuple[str, ...] | None = None) -> list[int]:
    """Ids of `symbols` in `table` (default: GPT-SoVITS's). An unknown symbol is an error naming it."""
    table = table or gpt_sovits_symbols()
    index = _index(table)
    missing = sorted({s for s in symbols if s not in index})
    if missing:
        raise InvalidValue(f"phones not in the symbol table ({len(table)} symbols): {missing}")
    return [index[s] for s in symbols]


@lru_cache(maxsize=8)
def _index(table: tuple[str, ...]) -> dict[str, int]:
    return {s: i for i, s in enumerate(table)}
