"""Which front end a transcript goes to, and GPT-SoVITS phones for Chinese, English or mixed lines.

Languages:
- `zh`: GPT-SoVITS v2's own Chinese path, the one its data preparation takes for a `zh` line: Latin letters are
  dropped ("我们用GPU训练" reads 我们用训练), so a model fine-tuned from released GPT-SoVITS weights sees the
  sequence it was trained on.
- `mixed`: Chinese lines whose English words are read as English phones: the line is cut into runs by script,
  Latin runs (letters, inner apostrophes and spaces) go to the English G2P (`audiopipe.text.en_phones`: CMU
  dictionary, espeak-ng fallback) and the rest (digits included, read as Chinese numbers) to the Chinese one, as
  GPT-SoVITS's language segmenter does at inference.
- `en`: English only.
- `auto`: per line, a line with a CJK ideograph (or a Chinese per-line tag) takes the `zh` rule, else `en`.
English phones are ARPAbet with stress, which GPT-SoVITS's table holds; word boundaries are dropped and ; : fold
into `,` as in its English cleaner.
"""

from __future__ import annotations

import re

from audiopipe.errors import InvalidValue

LANGUAGES = ("zh", "mixed", "en", "auto")
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_RUN = re.compile(r"[A-Za-z]+(?:['\u2019][A-Za-z]+)*(?:[ \t]+[A-Za-z]+(?:['\u2019][A-Za-z]+)*)*")
_EN_FOLD = {";": ",", ":": ","}


def check_language(language: str) -> str:
    if language not in LANGUAGES:
        raise InvalidValue(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    return language


def detect_language(text: str) -> str:
    """'zh' when the line holds a Chinese character, else 'en'."""
    return "zh" if _CJK.search(text) else "en"


def resolve_language(text: str, language: str, line_language: str | None = None) -> str:
    """The language of one line: a per-line tag (e.g. Emilia's `language` field) wins over `auto`."""
    if language == "auto" and line_language:
        tag = line_language.lower()
        if tag.startswith("zh") or tag in ("cmn", "chinese", "mandarin"):
            return "zh"
        if tag.startswith("en") or tag == "english":
            return "en"
    return detect_language(text) if language == "auto" else language


def split_by_script(text: str) -> list[tuple[str, str]]:
    """[(language, chunk)] in order: Latin runs are 'en', everything between them 'zh'."""
    parts: list[tuple[str, str]] = []
    pos = 0
    for m in _LATIN_RUN.finditer(text):
        if m.start() > pos:
            parts.append(("zh", text[pos:m.start()]))
        parts.append(("en", m.group()))
        pos = m.end()
    if pos < len(text):
        parts.append(("zh", text[pos:]))
    return parts


def english_phones(text: str) -> list[str]:
    """ARPAbet (with stress) and punctuation, without word boundaries: GPT-SoVITS's English phone stream."""
    from audiopipe.text.en_phones import WORD_BOUNDARY, g2p

    return [_EN_FOLD.get(p, p) for p in g2p(text) if p != WORD_BOUNDARY]


def gpt_sovits_segments(text: str, language: str = "zh",
                        line_language: str | None = None) -> list[tuple[str, list[str], str]]:
    """[(language, phones, normalised text)] of one line, segment by segment: what per-phone BERT features are
    computed over (the normalised text of each Chinese segment; "" for English ones)."""
    from audiopipe.text.zh_normalize import normalize_zh
    from audiopipe.text.zh_phones import g2p_normalized

    lang = resolve_language(text, check_language(language), line_language)
    if lang == "en":
        return [("en", english_phones(text), "")]
    if lang == "zh":  # Latin letters are dropped by the normaliser and the G2P, as GPT-SoVITS's Chinese path does
        norm = normalize_zh(text)
        return [("zh", g2p_normalized(norm), norm)]
    out = []
    for part_lang, chunk in split_by_script(text):
        if part_lang == "en":
            out.append(("en", english_phones(chunk), ""))
        else:
            norm = normalize_zh(chunk)
            out.append(("zh", g2p_normalized(norm), norm))
    return out


def gpt_sovits_phones(text: str, language: str = "zh", line_language: str | None = None) -> list[str]:
    """Phones of one line in GPT-SoVITS's symbol table, for language 'zh', 'mixed', 'en' or 'auto'."""
    return [ph for _, phones, _ in gpt_sovits_segments(text, language, line_language) for ph in phones]
