"""GPT-SoVITS Chinese phones: an initial and a toned final per syllable, in GPT-SoVITS's symbol table.

The path GPT-SoVITS takes when its neural polyphone model (G2PW) is not there: pypinyin reads each jieba word
(its phrase dictionary resolves most polyphones), the tone-sandhi rules of `audiopipe.text.tone_sandhi` adjust
the tones, and each syllable becomes two phones by these rules:

- pypinyin's strict initials/finals are first spelled back as a pinyin syllable: with an initial, the finals
  uei, iou, uen are written ui, iu, un (dui, liu, lun); without one, i/in/ing/u become yi/yin/ying/wu, a
  leading i becomes y, u becomes w and ü (v) becomes yu (ya, wo, yue); others stay (a, e, o, er, ai, ...);
- the syllable is then split into the symbol table's initial and final: the initial is its leading consonant
  (zh ch sh first), or y / w; a syllable with no initial starting with a, e or o gets the stand-in initial AA,
  EE or OO and keeps the whole syllable as its final;
- the final is what follows, except: ü spellings after j q x y (ju, quan, xue, yun) are v, van, ve, vn; the i
  of zi ci si is i0 and that of zhi chi shi ri is ir; after y, an is En and e is E (yan, ye), and yi yin ying
  keep i in ing; wu's final is u;
- the tone digit (1-4, 5 neutral) goes on the final. Punctuation (! ? … , . -) is its own phone.

Text first goes through `audiopipe.text.zh_normalize`. Latin letters are removed from Chinese text here; mixed
lines are split by script before (`audiopipe.text.frontend`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from audiopipe.errors import AudiopipeError
from audiopipe.text import tone_sandhi
from audiopipe.text.segment import cut_tagged
from audiopipe.text.symbols import FINALS, INITIALS, PUNCTUATION

_CONSONANTS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
               "c", "s", "y", "w")
_FINAL_SET = frozenset(FINALS)
_INITIAL_SET = frozenset(INITIALS)
_SENTENCE_END = re.compile("(?<=[{}])\\s*".format("".join(re.escape(p) for p in PUNCTUATION)))
_LATIN = re.compile("[a-zA-Z]+")


class ZhG2PError(AudiopipeError, ValueError):
    """A syllable the symbol table cannot spell (not standard Mandarin pinyin)."""


def spell(initial: str, final: str) -> str:
    """pypinyin strict (initial, final without tone) -> the syllable as written in pinyin."""
    if initial:
        return initial + {"uei": "ui", "iou": "iu", "uen": "un"}.get(final, final)
    whole = {"i": "yi", "in": "yin", "ing": "ying", "u": "wu"}.get(final)
    if whole:
        return whole
    head = {"v": "yu", "i": "y", "u": "w"}.get(final[:1])
    return head + final[1:] if head else final


@lru_cache(maxsize=2048)
def syllable_phones(syllable: str) -> tuple[str, str]:
    """A pinyin syllable without tone ("zhong", "yue", "er") -> (initial, final) symbols."""
    s = syllable.replace("ü", "v").replace("u:", "v")
    if not s or not s.isascii() or not s.isalpha():
        raise ZhG2PError(f"not a pinyin syllable: {syllable!r}")
    initial = next((c for c in _CONSONANTS if s.startswith(c) and len(s) > len(c)), "")
    rest = s[len(initial):]
    if not initial:
        stand_in = {"a": "AA", "e": "EE", "o": "OO"}.get(s[0])
        if stand_in is None:
            raise ZhG2PError(f"pinyin syllable {syllable!r} has no initial and does not start with a, e or o")
        initial, final = stand_in, s
    elif initial in ("j", "q", "x", "y") and rest[0] in "uv":
        final = "v" + rest[1:]
    elif initial in ("z", "c", "s") and rest == "i":
        final = "i0"
    elif initial in ("zh", "ch", "sh", "r") and rest == "i":
        final = "ir"
    elif initial == "y":
        final = {"an": "En", "e": "E", "i": "i"}.get(rest, rest)
    else:
        final = rest
    if initial not in _INITIAL_SET or final not in _FINAL_SET:
        raise ZhG2PError(f"pinyin syllable {syllable!r} has no phones in the symbol table "
                         f"(initial {initial!r}, final {final!r})")
    return initial, final


@lru_cache(maxsize=65536)
def _strict(word: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from pypinyin import Style, lazy_pinyin

    return (tuple(lazy_pinyin(word, neutral_tone_with_five=True, style=Style.INITIALS)),
            tuple(lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3)))


def g2p_normalized(text: str) -> list[str]:
    """Phones of normalised Chinese text (see `zh_normalize.normalize_zh`)."""
    phones: list[str] = []
    for sentence in (s for s in _SENTENCE_END.split(text) if s.strip()):
        sentence = _LATIN.sub("", sentence)
        for word, pos in tone_sandhi.regroup(cut_tagged(sentence)):
            if pos == "eng":
                continue
            initials, finals = _strict(word)
            finals = tone_sandhi.erhua(word, pos, tone_sandhi.apply(word, pos, list(finals)))
            for c, v in zip(initials, finals):
                phones.extend(_syllable_or_mark(c, v, word))
    return phones


def _syllable_or_mark(c: str, v: str, word: str) -> list[str]:
    if c == v:  # pypinyin hands back what it cannot read as both initial and final
        marks = [ch for ch in c if ch in PUNCTUATION]
        if len(marks) != len(c):
            raise ZhG2PError(f"{c!r} in {word!r} is neither a Chinese character pypinyin reads nor punctuation")
        return marks
    tone = v[-1:]
    if tone not in ("1", "2", "3", "4", "5"):
        raise ZhG2PError(f"pypinyin gave {c + v!r} for {word!r}, which has no tone")
    initial, final = syllable_phones(spell(c, v[:-1]))
    return [initial, final + tone]


def zh_g2p(text: str) -> list[str]:
    """Normalise Chinese text (numbers read, punctuation folded) and return its GPT-SoVITS phones."""
    from audiopipe.text.zh_normalize import normalize_zh

    return g2p_normalized(normalize_zh(text))
