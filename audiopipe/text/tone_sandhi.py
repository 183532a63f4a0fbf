"""Mandarin tone sandhi on jieba words, following the rules GPT-SoVITS applies (from PaddleSpeech's front end).

Finals carry their tone as a last digit (1-4, 5 = neutral). Words are first regrouped so a rule sees its context
(`regroup`), then each word's finals are changed (`apply`):

Regrouping, in order:
  - a lone 不 joins the word after it (a 不 that ends the line stays alone);
  - verb 一 verb with the same verb (看 一 看) becomes one word, and a lone 一 joins the word after it;
  - a word repeated right after itself joins it (看 看 -> 看看);
  - two neighbours whose syllables are all third tone join (at most three characters, never after a joined
    pair, never when the first is a reduplication like 奶奶); then the same for a third-tone boundary (the last
    syllable of one and the first of the next);
  - 儿 joins the word before it.
Tone changes, in order:
  - 不: in X不Y (three characters) it is neutral; elsewhere it is rising (2) before a falling (4) tone;
  - 一: unchanged in a number (一零一); neutral in X一X; first tone in 第一; else rising before a fourth tone and
    falling (4) before any other syllable (not before punctuation);
  - neutral tone: the second of a doubled character in a noun, verb or adjective (奶奶, 看看; not a doubled digit,
    幺幺零); modal particles at the end (吧 呢 啊 ...); 的 地 得 at the end; the aspect particles 了 着 过;
    plural/noun suffixes 们 子 on pronouns and nouns; 上 下 里 after a place noun; directional 来 去 after 上 下 进 出 回 过 起 开; the measure
    word 个 after a number or 几 有 两 半 多 各 整 每 做 是; and words that are neutral by usage (a short list
    here: the reference carries a longer one);
  - third tone: two third tones in a row -> the first becomes rising; in three-character words the word is split
    (jieba search mode) into 2+1 or 1+2 and the rule applies inside and across the split; four-character words
    are two pairs;
  - erhua (GPT-SoVITS v2's cleaner): a word-final 儿 takes the tone of the syllable before it (`erhua`).
"""

from __future__ import annotations

from functools import lru_cache

from audiopipe.text.segment import cut_for_search

# Words read with a neutral last syllable although the dictionary gives a full tone (a short, common subset).
NEUTRAL_BY_USAGE = frozenset("""
东西 事情 地方 时候 朋友 衣服 明白 意思 知识 先生 学生 关系 消息 休息 告诉 喜欢 认识 清楚 漂亮 舒服 热闹 麻烦 客气
什么 怎么 这么 那么 多么 这个 那个 名字 脑袋 眼睛 耳朵 头发 窗户 豆腐 萝卜 葡萄 玻璃 便宜 商量 打算 打听 收拾
师傅 姑娘 媳妇 丈夫 兄弟 亲戚 买卖 生意 部分 功夫 力气 算盘 石头 木头 骨头 舌头 指头 枕头 馒头 月亮 太阳
故事 笑话 主意 聪明 实在 粮食 意识 计划 多少
""".split())
# Words whose doubled characters or 们/子 endings keep their tone.
KEEP_TONE = frozenset("男子 女子 分子 原子 电子 量子 瓜子 莲子 学子 人人 哈哈 想想 整整 家家户户".split())

_DIGIT_CHARS = set("零一二三四五六七八九幺两")
_MODAL = set("吧呢哈啊呐噻嘛吖嗨哦哒额滴哩哟喽啰耶喔诶")
_AFTER_DIRECTION = set("上下进出回过起开")
_BEFORE_GE = set("几有两半多各整每做是")
_PUNCT = set("：，；。？！“”‘’':,;.?!…-")


def _tone(final: str) -> str:
    return final[-1]


def _set(final: str, tone: str) -> str:
    return final[:-1] + tone


def _all_third(finals: list[str]) -> bool:
    return all(f[-1] == "3" for f in finals)


def _reduplicated(word: str) -> bool:
    return len(word) == 2 and word[0] == word[1]


def split_word(word: str) -> list[str]:
    """Two parts: the shortest search-mode sub-word, and the rest on whichever side it is missing from."""
    first = sorted(cut_for_search(word), key=len)[0]
    if word.startswith(first):
        return [first, word[len(first):]]
    return [word[:-len(first)], first]


# ---------------------------------------------------------------------------------------------- regrouping

def _join_bu(seg: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    pending = False
    for word, pos in seg:
        if pending:
            word = "不" + word
            pending = False
        if word == "不":
            pending = True
            continue
        out.append([word, pos])
    if pending:
        out.append(["不", "d"])
    return out


def _join_yi(seg: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    for i, (word, pos) in enumerate(seg):
        # X 一 X with a verb X: the 一 and the second X join the first (the second is dropped when it is a verb).
        if word == "一" and out and 0 < i < len(seg) - 1 and seg[i - 1][0] == seg[i + 1][0] and seg[i - 1][1] == "v":
            out[-1][0] = out[-1][0] + "一" + out[-1][0]
            continue
        if i >= 2 and seg[i - 1][0] == "一" and seg[i - 2][0] == word and pos == "v":
            continue
        out.append([word, pos])
    joined: list[list[str]] = []
    for word, pos in out:
        if joined and joined[-1][0] == "一":
            joined[-1][0] += word
        else:
            joined.append([word, pos])
    return joined


def _join_repeats(seg: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    for word, pos in seg:
        if out and out[-1][0] == word:
            out[-1][0] += word
        else:
            out.append([word, pos])
    return out


def _join_third_tones(seg: list[list[str]], whole: bool) -> list[list[str]]:
    finals = [finals_tone3(w) for w, _ in seg]
    out: list[list[str]] = []
    joined_prev = False
    for i, (word, pos) in enumerate(seg):
        joined = False
        if i and not joined_prev and finals[i - 1] and finals[i]:
            meets = (_all_third(finals[i - 1]) and _all_third(finals[i])) if whole else \
                (_tone(finals[i - 1][-1]) == "3" and _tone(finals[i][0]) == "3")
            if meets and not _reduplicated(seg[i - 1][0]) and len(seg[i - 1][0]) + len(word) <= 3:
                out[-1][0] += word
                joined = True
        if not joined:
            out.append([word, pos])
        joined_prev = joined
    return out


def _join_er(seg: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    for word, pos in seg:
        if word == "儿" and out and out[-1][0] != "#":
            out[-1][0] += word
        else:
            out.append([word, pos])
    return out


def regroup(seg: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """jieba (word, pos) pairs regrouped so the tone rules see whole units (see the module docstring)."""
    s = [[w, p] for w, p in seg]
    for step in (_join_bu, _join_yi, _join_repeats):
        s = step(s)
    s = _join_third_tones(s, whole=True)
    s = _join_third_tones(s, whole=False)
    s = _join_er(s)
    return [(w, p) for w, p in s]


@lru_cache(maxsize=65536)
def _finals_cached(word: str) -> tuple[str, ...]:
    from pypinyin import Style, lazy_pinyin

    return tuple(lazy_pinyin(word, neutral_tone_with_five=True, style=Style.FINALS_TONE3))


def finals_tone3(word: str) -> list[str]:
    return list(_finals_cached(word))


# ---------------------------------------------------------------------------------------------- tone changes

def _bu(word: str, finals: list[str]) -> list[str]:
    if len(word) == 3 and word[1] == "不":
        finals[1] = _set(finals[1], "5")
        return finals
    for i, c in enumerate(word[:-1]):
        if c == "不" and _tone(finals[i + 1]) == "4":
            finals[i] = _set(finals[i], "2")
    return finals


def _yi(word: str, finals: list[str]) -> list[str]:
    if "一" in word and all(c.isnumeric() for c in word if c != "一"):
        return finals
    if len(word) == 3 and word[1] == "一" and word[0] == word[2]:
        finals[1] = _set(finals[1], "5")
    elif word.startswith("第一"):
        finals[1] = _set(finals[1], "1")
    else:
        for i, c in enumerate(word[:-1]):
            if c != "一":
                continue
            if _tone(finals[i + 1]) == "4":
                finals[i] = _set(finals[i], "2")
            elif word[i + 1] not in _PUNCT:
                finals[i] = _set(finals[i], "4")
    return finals


def _neutral(word: str, pos: str, finals: list[str]) -> list[str]:
    # a doubled digit is two digits read one by one (幺幺零, a code), not a reduplicated word
    if pos[:1] in ("n", "v", "a") and word not in KEEP_TONE and not set(word) <= _DIGIT_CHARS:
        for j in range(1, len(word)):
            if word[j] == word[j - 1]:
                finals[j] = _set(finals[j], "5")
    last = word[-1]
    ge = word.find("个")
    if last in _MODAL or last in "的地得":
        finals[-1] = _set(finals[-1], "5")
    elif len(word) == 1 and word in "了着过" and pos in ("ul", "uz", "ug"):
        finals[-1] = _set(finals[-1], "5")
    elif len(word) > 1 and last in "们子" and pos in ("r", "n") and word not in KEEP_TONE:
        finals[-1] = _set(finals[-1], "5")
    elif len(word) > 1 and last in "上下里" and pos in ("s", "l", "f"):
        finals[-1] = _set(finals[-1], "5")
    elif len(word) > 1 and last in "来去" and word[-2] in _AFTER_DIRECTION:
        finals[-1] = _set(finals[-1], "5")
    elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in _BEFORE_GE)) or word == "个":
        finals[ge] = _set(finals[ge], "5")
    elif word in NEUTRAL_BY_USAGE or word[-2:] in NEUTRAL_BY_USAGE:
        finals[-1] = _set(finals[-1], "5")
    # The two parts of a longer word are checked for usage too (e.g. a compound ending in 东西).
    parts = split_word(word)
    cut = len(parts[0])
    for part, (lo, hi) in zip(parts, ((0, cut), (cut, len(word)))):
        if hi > lo and (part in NEUTRAL_BY_USAGE or part[-2:] in NEUTRAL_BY_USAGE):
            finals[hi - 1] = _set(finals[hi - 1], "5")
    return finals


def _third(word: str, finals: list[str]) -> list[str]:
    if len(word) == 2 and _all_third(finals):
        finals[0] = _set(finals[0], "2")
    elif len(word) == 3:
        parts = split_word(word)
        cut = len(parts[0])
        if _all_third(finals):
            if cut == 2:  # 2 + 1, e.g. 展览/馆
                finals[0], finals[1] = _set(finals[0], "2"), _set(finals[1], "2")
            elif cut == 1:  # 1 + 2, e.g. 纸/老虎
                finals[1] = _set(finals[1], "2")
        else:
            first, second = finals[:cut], finals[cut:]
            for i, sub in enumerate((first, second)):
                if len(sub) == 2 and _all_third(sub):
                    sub[0] = _set(sub[0], "2")
                elif i == 1 and sub and not _all_third(sub) and _tone(sub[0]) == "3" and first \
                        and _tone(first[-1]) == "3":
                    first[-1] = _set(first[-1], "2")
            finals = first + second
    elif len(word) == 4:
        halves = [finals[:2], finals[2:]]
        for half in halves:
            if _all_third(half):
                half[0] = _set(half[0], "2")
        finals = halves[0] + halves[1]
    return finals


# 儿 read as a syllable of its own (a child, a son) rather than as the r-colouring of the syllable before it.
# Two kinds: 儿 meaning a child or a son (女儿, 婴幼儿, 妻儿), and the lyrical diminutive of small creatures, where
# 儿 keeps a syllable and its second tone (鸟儿, 马儿, 虫儿), as GPT-SoVITS's cleaner reads them.
ER_SYLLABLE = frozenset("女儿 男儿 花儿 婴儿 幼儿 婴幼儿 孤儿 患儿 少儿 儿童 孙儿 侄儿 侄孙儿 健儿 宠儿 混血儿 流浪儿 妻儿 "
                        "鸟儿 马儿 虫儿 猫儿 狗儿 猪儿".split())
ER_SUFFIX = frozenset("小院儿 胡同儿 媳妇儿".split())  # r-coloured although their part of speech says otherwise


def erhua(word: str, pos: str, finals: list[str]) -> list[str]:
    """儿 at the end of a word: er2 at least, and in an r-coloured word (玩儿, 一点儿) the tone of the syllable
    before it. Not in names, adjectives and abbreviations (pos nr, a, j), nor where 儿 is a word of its own."""
    finals = list(finals)
    if not finals or len(finals) != len(word) or word[-1] != "儿":
        return finals
    if finals[-1] == "er1":
        finals[-1] = "er2"
    if word not in ER_SUFFIX and (word in ER_SYLLABLE or pos in ("a", "j", "nr")):
        return finals
    if len(word) > 1 and finals[-1] in ("er2", "er5") and word[-2:] not in ER_SYLLABLE:
        finals[-1] = "er" + _tone(finals[-2])
    return finals


def apply(word: str, pos: str, finals: list[str]) -> list[str]:
    """The finals of `word` (part of speech `pos`) after 不, 一, neutral-tone and third-tone sandhi."""
    finals = list(finals)
    if len(finals) != len(word):  # a run of punctuation comes back as one item: no syllables to change
        return finals
    for rule in (_bu, _yi):
        finals = rule(word, finals)
    finals = _neutral(word, pos, finals)
    return _third(word, finals)
