"""Chinese text normalisation for GPT-SoVITS phones: numbers read out (cn2an) and punctuation folded.

Rules (those of GPT-SoVITS's Chinese cleaner, which reads numbers with a port of PaddleSpeech's normaliser; this
module implements the same rules with cn2an and its own tables):
0. Latin unit abbreviations become Chinese units, inside English words too, before letters are dropped: 5kg ->
   五千克, 20ml -> 二十毫升, 30m² -> 三十平方米, Zoom -> Zoo米 (-> 米). `=` between two operands reads 等于.
1a. Then the patterns cn2an would read as arithmetic: dates written 2024-03-05 (or / .) -> 二零二四年三月五日;
   clock times 12:30 -> 十二点半, 8:05 -> 八点零五分, 8:00-9:30 -> 八点至九点三十分; temperatures -5℃ -> 零下五度 (度, or
   摄氏度 when so written); a hyphen between two numbers is a minus (1-2 -> 一减二, 100-200元 -> 幺零零减二百元),
   ~ between them a range (3~5天 -> 三到五天); mobile numbers digit by digit with 一 as 幺; a bare number of 3 or
   more digits that no classifier or unit follows is a code, read digit by digit with 一 as 幺 (110 -> 幺幺零,
   1200公里 -> 幺二零零公里; 300多人 -> 三百多人).
1. Then Arabic numbers become Chinese numerals with cn2an's `an2cn` transform, which also reads the common
   patterns: years digit by digit (2024年 -> 二零二四年), percentages (50% -> 百分之五十), fractions (1/2 ->
   二分之一), decimals (3.14 -> 三点一四). A lone 2 before a measure word or 万/千/亿 counts something and is read
   两 (两个, 两万, 两斤), as GPT-SoVITS reads it.
1b. Signs left over are read as words: + 加, - 减 (Wi-Fi -> 减), × 乘, ÷ 除, = 等, / 每 (3.5元/斤 -> 三点五元每斤);
   the dash —— is dropped.
2. 嗯 is written 恩 and 呣 母 (pypinyin reads them with no vowel, which has no phone).
3. Punctuation folds into the six marks the symbol table has: ：；，·、 -> `,`  。$ -> `.`  ！ -> `!`  ？ -> `?`
   ... ~ ～ -> `…`, and a newline ends a sentence (`.`).
4. Everything that is neither a Chinese character (U+4E00..U+9FA5) nor one of ! ? … , . is dropped (English
   letters too, unless `keep_latin`: mixed lines keep them for the English front end, and skip rules 0 and 1b).
5. A run of punctuation keeps its first mark.

The two still differ on rarer forms: landline numbers with a classifier after them, numbers of 5+ digits before
年, traditional characters (GPT-SoVITS converts them to simplified first) and Greek letters (which it spells).
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
_CLOCK = r"([01]?\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?"
_TIME = re.compile(rf"(?<!\d){_CLOCK}(?:[~-]{_CLOCK})?(?!\d)")
_TEMPERATURE = re.compile(r"(-?)(\d+(?:\.\d+)?)(°C|℃|摄氏度|度)")
_MOBILE = re.compile(r"(?<!\d)((?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
# Unit abbreviations written in Latin letters, read as the Chinese unit (cm 厘米, km 千米, kg 千克, ml 毫升, db 分贝,
# m 米, s 秒; a 2 or 3 after cm / m makes it square / cubic). Lower case only, anywhere in the text, inside English
# words too (Zoom's m reads 米, "ms" 米秒), the leftmost abbreviation first: GPT-SoVITS's normaliser reads them so
# before it drops letters. Two of its readings are kept for the same sequences although they are not the units'
# names: mm is two metres (米米), and ds reads 毫秒.
_UNIT_LETTERS = re.compile(r"cm[23²³]?|d[bs]|k[gm]|m[23²³l]?|s")
_POWER = {"2": "平方", "²": "平方", "3": "立方", "³": "立方"}
_UNIT_BASE = {"cm": "厘米", "db": "分贝", "ds": "毫秒", "kg": "千克", "km": "千米", "m": "米", "ml": "毫升", "s": "秒"}


def _unit(m: re.Match) -> str:
    sym = m.group()
    return _POWER[sym[-1]] + _UNIT_BASE[sym[:-1]] if sym[-1] in _POWER else _UNIT_BASE[sym]


# What makes a number a quantity rather than a code: a nominal classifier or a unit right after it (possibly after
# 多 / 余 / 几 / +: 300多人). Our own list, by kind: general classifiers, containers, time, money, length, weight,
# volume and area, and the large-number words. A number of 3 or more digits followed by none of them is a code or
# a label and is read digit by digit with 一 as 幺 (110 -> 幺幺零, 303路 -> 三零三路), as GPT-SoVITS reads it. Not in
# the list, because GPT-SoVITS reads the number before them digit by digit: verbal classifiers (次, 遍), 倍, 号, and
# the 公- units 公里 / 公斤 / 公顷 (1200公里 -> 幺二零零公里); 公分 is in.
_COUNT_WORDS = (
    "个 位 名 人 口 户 家 只 头 匹 条 根 支 枝 棵 株 朵 颗 粒 片 张 本 册 页 篇 首 部 台 架 辆 艘 座 栋 幢 间 层 所 件 套 "
    "双 对 场 项 批 例 段 把 门 封 堆 群 队 道 面 "
    "杯 碗 盘 瓶 壶 桶 箱 袋 盒 罐 盆 锅 盏 "
    "年 月 日 天 周 季 小时 分 秒 刻 岁 代 世 "
    "元 块 角 毛 钱 美元 "
    "百 千 万 亿 "
    "米 里 尺 寸 丈 厘 毫 微 克 斤 两 吨 升 斗 亩 平 方 公分").split()
_COUNT_ALT = "|".join(sorted(_COUNT_WORDS, key=len, reverse=True))
_CODE_NUMBER = re.compile(rf"(?<![\d.\-~/:])(\d{{3,}})(?![\d.%/:\-~])(?![多余几+]?(?:{_COUNT_ALT}))")
# A hyphen between two numbers (after dates and clock times are read) is a minus, not a range; a negative number
# with nothing before it stays negative (-5 -> 负五).
_MINUS = re.compile(r"(?<=[\dA-Za-z])-(?=-?\.?\d)")
# 3~5天 is a range like 3-5天 (三到五天), which cn2an reads.
_TILDE_RANGE = re.compile(r"(?<=\d)[~～](?=-?\d)")
# A lone 2 counting something is 两, not 二 (两个, 两万, 两斤): before a measure word or a large-number unit. Ordinal
# and clock uses (2号, 2楼, 第2个, 2点) and 2 inside longer numbers (12斤, 2.5万) stay 二, as GPT-SoVITS reads them.
# Where the two lists part, this one follows speech: a month stays 二月 (GPT-SoVITS: 两月), and 两公斤, 两种, 两星期
# (GPT-SoVITS: 二).
_COUNTED_TWO = re.compile(r"(?<![\d.第~-])2(?![\d.])(?=(?:万|千|亿|个|只|本|张|条|件|位|辆|家|杯|层|岁|天|年(?!\d)|"
                          r"斤|元|块|人|种|句|双|对|把|台|部|首|篇|份|节|门|片|棵|朵|匹|头|口|间|所|座|架|艘|"
                          r"小时|分钟|周|星期|米|公斤))")


def _digits(s: str, alt_one: bool = False) -> str:
    out = "".join(_DIGITS[int(c)] for c in s if c.isdigit())
    return out.replace("一", "幺") if alt_one else out


def _clock_part(s: str, unit: str) -> str:
    # "05" -> 零五: a leading zero is read, as on a clock.
    n = _an2cn()(str(int(s)), "an2cn") if int(s) else ""
    return (("零" if s.startswith("0") else "") + n + unit) if n else ""


def _clock(hour: str, minute: str, second: str | None, half: bool = True) -> str:
    out = _an2cn()(str(int(hour)), "an2cn") + "点"
    out += "半" if half and minute == "30" else _clock_part(minute, "分")
    return out + (_clock_part(second, "秒") if second else "")


def _time(m: re.Match) -> str:
    # a range reads 至, and its end's minutes in full (8:00-9:30 -> 八点至九点三十分), as GPT-SoVITS reads it
    out = _clock(*m.group(1, 2, 3))
    return out + ("至" + _clock(*m.group(4, 5, 6), half=False) if m.group(4) else "")


def read_patterns(text: str) -> str:
    """Dates written 2024-03-05, clock times, temperatures, minus signs, ~ ranges, mobile numbers and codes, read
    the way GPT-SoVITS's normaliser reads them (rule 1a): 二零二四年三月五日, 十二点半 / 十二点零五分, 零下五度,
    一减二, 三-五 (for cn2an: 三到五), 幺三八... and 幺幺零 (digits, 一 as 幺)."""
    text = _ISO_DATE.sub(lambda m: f"{_digits(m.group(1))}年{_an2cn()(str(int(m.group(3))), 'an2cn')}月"
                                   f"{_an2cn()(str(int(m.group(4))), 'an2cn')}日", text)
    text = _TIME.sub(_time, text)
    text = _TEMPERATURE.sub(lambda m: ("零下" if m.group(1) else "") + _an2cn()(m.group(2), "an2cn")
                            + ("摄氏度" if m.group(3) == "摄氏度" else "度"), text)
    text = _MINUS.sub("减", text)
    text = _TILDE_RANGE.sub("-", text)
    text = _MOBILE.sub(lambda m: "，".join(_digits(p, alt_one=True) for p in m.group(1).lstrip("+").split()), text)
    text = _CODE_NUMBER.sub(lambda m: _digits(m.group(1), alt_one=True), text)
    return _COUNTED_TWO.sub("两", text)


def read_numbers(text: str) -> str:
    """Arabic numbers -> Chinese numerals (rules 1a and 1)."""
    if not any(c.isdigit() for c in text):
        return text
    return _an2cn()(read_patterns(text), "an2cn")


# Arithmetic signs. `=` between two operands (digits or a letter) reads 等于 (1+1=2 -> 一加一等于二); what is left of
# + - × ÷ = / once numbers, ranges, dates and phone numbers are read is read as a word: 加 减 乘 除 等, and / as 每
# (5km/h -> 五千米每, h dropped). A hyphen between letters is a minus too (Wi-Fi -> 减), and the Chinese dash ——
# is dropped, as GPT-SoVITS's normaliser reads them.
_EQUALS = re.compile(r"(?<=[\dA-Za-z])=(?=-?[\dA-Za-z.])")
_SIGNS = str.maketrans({"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等", "/": "每", "—": None})


def read_letters(text: str) -> str:
    """Latin unit abbreviations (5km, 3kg, 20ml, and the letters of English words that spell one) -> Chinese
    units, and `=` between operands -> 等于: what GPT-SoVITS reads before it drops letters and reads numbers."""
    return _EQUALS.sub("等于", _UNIT_LETTERS.sub(_unit, text))


def read_signs(text: str) -> str:
    """Arithmetic signs left after `read_numbers` -> 加 减 乘 除 等 每; the dash —— dropped."""
    return text.translate(_SIGNS)


def fold_punctuation(text: str, keep_latin: bool = False) -> str:
    """Rules 2-5 on text whose numbers are already read."""
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _FOLD_RE.sub(lambda m: _FOLD[m.group()], text)
    text = (_DROP_KEEP_LATIN if keep_latin else _DROP).sub("", text)
    return _REPEATED_PUNCT.sub(r"\1", text)


def normalize_zh(text: str, keep_latin: bool = False) -> str:
    """The text GPT-SoVITS turns into Chinese phones. With `keep_latin` (English words read by the English front
    end) letters are left as they are and signs keep their punctuation reading."""
    if keep_latin:
        return fold_punctuation(read_numbers(text), keep_latin)
    return fold_punctuation(read_signs(read_numbers(read_letters(text))))
