"""F5-TTS's `pinyin` tokenisation, rule for rule, and its vocab.txt mapping with unknown symbols counted.

The rules F5-TTS applies to a transcript before looking tokens up in its vocab.txt (its data preparation and its
inference both do this; the released Emilia zh+en checkpoints were trained on it):

1. `;` becomes `,`; curly quotes become straight ones (“ ” -> ", ‘ ’ -> ').
2. jieba cuts the line into words (accurate mode).
3. A word made only of 1-byte UTF-8 characters (ASCII) is kept character by character; when it is longer than
   one character and something precedes it, a space token goes first unless the previous token is one of
   space, `:`, `'` or `"`.
4. A word made only of 3-byte characters (Chinese characters, full-width punctuation) goes to pypinyin as a
   whole (style TONE3: tone digit after the syllable, none for the neutral tone, ü written v; with pypinyin's
   tone sandhi), so the phrase dictionary picks polyphone readings. Each character in U+3100..U+9FFF is
   preceded by a space token and replaced by its syllable; other characters are kept.
5. Any other word (mixed scripts, accented Latin, 4-byte characters) is taken character by character: Latin-1
   characters kept, characters in U+3100..U+9FFF become a space token plus their syllable read alone, the rest
   kept.

Tokens are then ids by vocab.txt line number; F5 maps an unknown token to id 0 (the space). Here the lookup is
the same, and the unknown tokens are counted (`PinyinVocab.unknown`) so a mismatch with a checkpoint's vocab is
reported rather than trained on silently.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from audiopipe.errors import InvalidValue
from audiopipe.text.segment import cut

_F5_TRANSLATION = str.maketrans({";": ",", "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_NO_SPACE_AFTER = frozenset(" :'\"")


def _is_f5_chinese(c: str) -> bool:
    # F5's own range: bopomofo through the CJK unified ideographs (it includes CJK symbols like 〇 and ㄅ).
    return "\u3100" <= c <= "\u9fff"


@lru_cache(maxsize=1)
def _pinyin():
    from pypinyin import Style, lazy_pinyin

    def tone3(text: str) -> list[str]:
        return lazy_pinyin(text, style=Style.TONE3, tone_sandhi=True)
    return tone3


def f5_pinyin_tokens(text: str) -> list[str]:
    """The token list F5-TTS's pinyin preparation makes of one transcript (rules in the module docstring)."""
    tone3 = _pinyin()
    tokens: list[str] = []
    for word in cut(text.translate(_F5_TRANSLATION)):
        nbytes = len(word.encode("utf-8"))
        if nbytes == len(word):
            if tokens and len(word) > 1 and tokens[-1] not in _NO_SPACE_AFTER:
                tokens.append(" ")
            tokens.extend(word)
            continue
        if nbytes == 3 * len(word):
            syllables = tone3(word)
            # pypinyin gives one item per Chinese character but one item for a run of other characters; F5
            # indexes the result by character position and fails (IndexError) when a word mixes them so. Such
            # words, which F5 cannot prepare at all, are read character by character (rule 5) instead.
            if len(syllables) == len(word):
                for c, s in zip(word, syllables):
                    if _is_f5_chinese(c):
                        tokens.append(" ")
                    tokens.append(s)
                continue
        for c in word:
            if ord(c) < 256:
                tokens.append(c)
            elif _is_f5_chinese(c):
                tokens.append(" ")
                tokens.extend(tone3(c))
            else:
                tokens.append(c)
    return tokens


def read_vocab(path: str | Path) -> list[str]:
    """An F5 vocab.txt: one symbol per line, the line number is the id (F5 strips only the newline)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidValue(f"cannot read vocab {path}: {e}") from None
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InvalidValue(f"vocab {path} is empty")
    if lines[0] != " ":
        raise InvalidValue(f"vocab {path}: line 1 must be a single space (F5 uses id 0 for space and for unknown "
                           f"symbols), got {lines[0]!r}")
    dup = sorted({s for s in lines if lines.count(s) > 1}) if len(set(lines)) != len(lines) else []
    if dup:
        raise InvalidValue(f"vocab {path} lists {dup[:5]} more than once")
    return lines


def build_vocab(token_lists: Iterable[list[str]]) -> list[str]:
    """The vocab F5's preparation writes for a corpus: every token seen, sorted (the space sorts first)."""
    seen: set[str] = {" "}
    for tokens in token_lists:
        seen.update(tokens)
    return sorted(seen, key=lambda s: (s != " ", s))


class PinyinVocab:
    """Token -> id through an F5 vocab, counting what it does not know (F5 would map it to 0 and say nothing)."""

    def __init__(self, vocab: list[str]):
        if not vocab or vocab[0] != " ":
            raise InvalidValue("an F5 vocab starts with the space symbol (id 0)")
        self.vocab = list(vocab)
        self.map = {s: i for i, s in enumerate(self.vocab)}
        self.unknown: Counter[str] = Counter()
        self.tokens_seen = 0

    @property
    def size(self) -> int:
        return len(self.vocab)

    def ids(self, tokens: list[str]) -> list[int]:
        out = []
        for t in tokens:
            i = self.map.get(t)
            if i is None:
                self.unknown[t] += 1
                i = 0
            out.append(i)
        self.tokens_seen += len(tokens)
        return out

    def encode(self, text: str) -> list[int]:
        return self.ids(f5_pinyin_tokens(text))

    def diagnostics(self) -> dict[str, object]:
        return {"vocab_size": self.size, "tokens": self.tokens_seen,
                "unknown_tokens": sum(self.unknown.values()), "unknown_symbols": dict(self.unknown.most_common())}

    def report(self, limit: int = 10) -> str:
        """One line: how many tokens were unknown (all mapped to id 0, as F5 does), and the most frequent."""
        n = sum(self.unknown.values())
        if not n:
            return f"pinyin vocab {self.size}: all {self.tokens_seen} tokens known"
        top = ", ".join(f"{s!r} x{c}" for s, c in self.unknown.most_common(limit))
        return (f"pinyin vocab {self.size}: {n} of {self.tokens_seen} tokens are not in the vocab and map to id 0 "
                f"({len(self.unknown)} symbols; most frequent: {top})")

    def state_dict(self) -> dict[str, object]:
        return {"unknown": dict(self.unknown), "tokens_seen": self.tokens_seen}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.unknown = Counter(state.get("unknown", {}))  # type: ignore[arg-type]
        self.tokens_seen = int(state.get("tokens_seen", 0))  # type: ignore[arg-type]
