"""Chinese text front ends: F5-TTS pinyin tokens and GPT-SoVITS phones.

Every expected output below is written by hand from the rules the references document (F5-TTS's pinyin
preparation, GPT-SoVITS's Chinese cleaner, symbol table and tone-sandhi rules), not produced by running them.
"""

from __future__ import annotations

import json

import pytest

from audiopipe.text.f5_pinyin import PinyinVocab, build_vocab, f5_pinyin_tokens, read_vocab
from audiopipe.text.frontend import (detect_language, gpt_sovits_phones, resolve_language, split_by_script)
from audiopipe.text.symbols import gpt_sovits_symbols, load_symbol_table, symbols_to_ids
from audiopipe.text.zh_normalize import normalize_zh
from audiopipe.text.zh_phones import ZhG2PError, spell, syllable_phones, zh_g2p

S = " "  # F5's space token before every Chinese syllable


# ----------------------------------------------------------------------------- F5-TTS pinyin

@pytest.mark.parametrize("text, tokens", [
    # 3-3 sandhi inside a word (你好 -> ni2 hao3); each syllable after a space token.
    ("你好世界", [S, "ni2", S, "hao3", S, "shi4", S, "jie4"]),
    # polyphones resolved by the phrase dictionary: 银行 hang2, 行长 zhang3; neutral tone has no digit.
    ("银行行长来了", [S, "yin2", S, "hang2", S, "hang2", S, "zhang3", S, "lai2", S, "le"]),
    # 一 before a fourth tone is yi2, 不 before a fourth tone bu2; full-width punctuation is kept, no space.
    ("一个不错，好。", [S, "yi2", S, "ge4", S, "bu2", S, "cuo4", "，", S, "hao3", "。"]),
    # an ASCII word of several characters gets a space first; ';' becomes ','; digits are not read out.
    ("我买了iPhone 15;好的", [S, "wo3", S, "mai3", S, "le", S, "i", "P", "h", "o", "n", "e", " ", "1", "5", ",",
                              S, "hao3", S, "de"]),
    # curly quotes become straight ones, and no space goes after a quote.
    ("他说\u201c你好\u201d", [S, "ta1", S, "shuo1", '"', S, "ni2", S, "hao3", '"']),
    # ü is written v; 们 is neutral.
    ("我们女儿", [S, "wo3", S, "men", S, "nv3", S, "er2"]),
    # a number at the start: no space before it; 年 after it gets its own space token.
    ("2024年", ["2", "0", "2", "4", S, "nian2"]),
    # accented Latin (2-byte UTF-8) is kept character by character.
    ("好café", [S, "hao3", " ", "c", "a", "f", "é"]),
])
def test_f5_pinyin_tokens(text, tokens):
    assert f5_pinyin_tokens(text) == tokens


def test_f5_vocab_counts_unknown_symbols_instead_of_dropping_them(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text(" \nhao3\nni2\n", encoding="utf-8")
    v = PinyinVocab(read_vocab(p))
    assert v.encode("你好世界") == [0, 2, 0, 1, 0, 0, 0, 0]  # unknown -> 0, as F5
    assert v.unknown == {"shi4": 1, "jie4": 1}
    assert "2 of 8 tokens are not in the vocab" in v.report()
    state = v.state_dict()
    v2 = PinyinVocab(read_vocab(p))
    v2.load_state_dict(json.loads(json.dumps(state)))
    assert v2.diagnostics() == v.diagnostics()


def test_f5_vocab_file_rules(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 must be a single space"):
        read_vocab(bad)
    dup = tmp_path / "dup.txt"
    dup.write_text(" \na\na\n", encoding="utf-8")
    with pytest.raises(ValueError, match="more than once"):
        read_vocab(dup)
    # The vocab F5's preparation writes: every token, sorted, space first.
    assert build_vocab([[S, "ni2", S, "hao3"], ["!", S, "a1"]]) == [" ", "!", "a1", "hao3", "ni2"]


# ----------------------------------------------------------------------------- GPT-SoVITS symbol table

def test_symbol_table_rule():
    t = gpt_sovits_symbols()
    assert len(t) == 322  # v1's table; the first 322 ids of v2's
    assert list(t) == sorted(t) and len(set(t)) == len(t)
    assert t[:5] == ("!", ",", "-", ".", "?")  # ASCII punctuation sorts first
    assert t[-1] == "\u2026"  # … sorts after every ASCII symbol
    assert t.index("AA") == 5 and t.index("AA0") == 6
    assert {"_", "SP", "UNK", "i01", "ir5", "En3", "vn4", "ER", "IH", "ZH", "cl", "ts"} <= set(t)
    assert symbols_to_ids(["!", "AA"]) == [0, 5]
    with pytest.raises(ValueError, match=r"\['xx'\]"):
        symbols_to_ids(["xx"])


def test_user_symbol_table(tmp_path):
    p = tmp_path / "symbols.json"
    p.write_text(json.dumps(["_", "a1", "b"]), encoding="utf-8")
    table = load_symbol_table(p)
    assert symbols_to_ids(["b", "a1"], table) == [2, 1]
    txt = tmp_path / "symbols.txt"
    txt.write_text("_\nb\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="more than once"):
        load_symbol_table(txt)


# ----------------------------------------------------------------------------- GPT-SoVITS phones

@pytest.mark.parametrize("initial, final, syllable", [
    ("d", "uei", "dui"), ("l", "iou", "liu"), ("l", "uen", "lun"), ("", "iou", "you"), ("", "uei", "wei"),
    ("", "v", "yu"), ("", "van", "yuan"), ("", "i", "yi"), ("", "ing", "ying"), ("", "u", "wu"), ("", "uo", "wo"),
    ("", "ia", "ya"), ("", "er", "er"), ("j", "v", "jv"),
])
def test_spell_strict_pinyin(initial, final, syllable):
    assert spell(initial, final) == syllable


@pytest.mark.parametrize("syllable, phones", [
    ("zhi", ("zh", "ir")), ("ri", ("r", "ir")), ("zi", ("z", "i0")), ("si", ("s", "i0")), ("ju", ("j", "v")),
    ("jv", ("j", "v")), ("quan", ("q", "van")), ("xue", ("x", "ve")), ("yun", ("y", "vn")), ("yan", ("y", "En")),
    ("ye", ("y", "E")), ("you", ("y", "ou")), ("yi", ("y", "i")), ("wu", ("w", "u")), ("er", ("EE", "er")),
    ("ai", ("AA", "ai")), ("ou", ("OO", "ou")), ("lv", ("l", "v")), ("nve", ("n", "ve")), ("zhuang", ("zh", "uang")),
])
def test_syllable_to_initial_and_final(syllable, phones):
    assert syllable_phones(syllable) == phones


def test_non_pinyin_syllable_is_refused():
    with pytest.raises(ZhG2PError, match="xyz"):
        syllable_phones("xyz")


@pytest.mark.parametrize("text, normalized", [
    ("今天是2024年3月5日，涨了50%！", "今天是二零二四年三月五日,涨了百分之五十!"),  # year digit by digit, percent
    ("价格是3.5元/斤", "价格是三点五元每斤"),  # decimal; a slash left after numbers reads 每 (per)
    ("一共123个", "一共一百二十三个"),
    ("嗯……好的~", "恩…好的…"),  # 嗯 -> 恩; a run of punctuation keeps its first mark
    ("现在是12:30，8:05出发", "现在是十二点半,八点零五分出发"),  # clock times: 30 -> 半, a leading zero is read
    ("比分3:2", "比分三二"),  # not a clock time (one-digit minutes): plain numbers, the colon dropped
    ("气温-5℃，明天25℃", "气温零下五度,明天二十五度"),  # temperatures
    ("日期2024-03-05", "日期二零二四年三月五日"),  # an ISO date, not a subtraction
    ("电话13812345678", "电话幺三八幺二三四五六七八"),  # a mobile number: digit by digit, 一 as 幺
    ("你好，world。。", "你好,"),  # Latin letters leave; then ",.." is one run of punctuation: its first mark
])
def test_normalize_zh(text, normalized):
    assert normalize_zh(text) == normalized


@pytest.mark.parametrize("text, normalized", [
    # 3+ digits with no classifier or unit after them are a code: digit by digit, 一 as 幺
    ("请拨打110报警", "请拨打幺幺零报警"),
    ("坐303路公交", "坐三零三路公交"),
    ("跑了100次", "跑了幺零零次"),  # 次 counts events, not things: not in the list
    ("大约1200公里", "大约幺二零零公里"),  # 公里 is not in the list either
    # ... and a number when one follows, also after 多/余/几
    ("一共300多人", "一共三百多人"),
    ("花了1500元", "花了一千五百元"),
    ("长250厘米", "长二百五十厘米"),
    ("第100名", "第一百名"),
    # a decimal, a percentage or a negative number is never a code
    ("圆周率3.14159", "圆周率三点一四一五九"),
    ("增长120%", "增长百分之一百二十"),
    ("降到-100", "降到负一百"),
    # a hyphen between numbers is a minus (so the 100 before it is a code), ~ a range
    ("100-200元", "幺零零减二百元"),
    ("1-2天", "一减两天"),
    ("3~5天", "三到五天"),
    ("电话010-12345678", "电话零幺零减幺二三四五六七八"),
    ("8:00-9:30上课", "八点至九点三十分上课"),  # a clock-time range: 至, the end's minutes in full
    # years of 2 or more digits digit by digit
    ("工作了10年", "工作了一零年"),
    ("有300年历史", "有三零零年历史"),
    # unit letters become Chinese units, inside English words too; the rest of the letters is dropped
    ("重5kg，长20cm", "重五千克,长二十厘米"),
    ("面积30m²", "面积三十平方米"),
    ("喝了500ml水", "喝了五百毫升水"),
    ("时速60km/h", "时速六十千米每"),
    ("开个Zoom会", "开个米会"),
    ("发email给我", "发米给我"),
    ("打开GPU", "打开"),  # upper-case letters are never units
    # arithmetic signs
    ("1+1=2", "一加一等于二"),
    # deliberately as spoken, where GPT-SoVITS writes 两月 and 二公斤
    ("2月3日开学", "二月三日开学"),
    ("买了2公斤", "买了两公斤"),
    ("连上Wi-Fi", "连上减"),  # a hyphen left between letters is a minus
    ("他说——算了", "他说算了"),  # the Chinese dash is dropped
])
def test_normalize_zh_reads_numbers_units_and_signs_as_gpt_sovits(text, normalized):
    assert normalize_zh(text) == normalized


def test_keep_latin_leaves_letters_and_signs_alone():
    # the English front end reads these words: no unit letters, the hyphen stays punctuation
    assert normalize_zh("开个Zoom会,Wi-Fi", keep_latin=True) == "开个Zoom会,Wi-Fi"


@pytest.mark.parametrize("text, phones", [
    ("你好，世界！", "n i2 h ao3 , sh ir4 j ie4 !"),  # 3-3: ni3 -> ni2; full-width marks fold
    ("老虎", "l ao2 h u3"),  # two third tones
    ("展览馆", "zh an2 l an2 g uan3"),  # 2+1 all third: the first two rise
    ("一个不错的选择。", "y i2 g e5 b u2 c uo4 d e5 x van3 z e2 ."),  # 一/不 before tone 4; 个 and 的 neutral
    ("我不要看一看。", "w o3 b u2 y ao4 k an4 y i5 k an4 ."),  # X一X: yi5
    ("一天", "y i4 t ian1"),  # 一 before a non-fourth tone: yi4
    ("第一", "d i4 y i1"),  # ordinal: yi1
    ("好的吧", "h ao3 d e5 b a5"),  # modal particle and 的 neutral
    ("银行", "y in2 h ang2"),  # polyphone 行 from the phrase dictionary
    ("长城", "ch ang2 ch eng2"),
    ("女儿们", "n v3 EE er2 m en5"),  # ü -> v; zero-initial er -> EE; 们 neutral
    ("2024年3月5日", "EE er4 l ing2 EE er4 s i04 n ian2 s an1 y ve4 w u3 r ir4"),  # date
    ("涨了50%", "zh ang3 l e5 b ai3 f en1 zh ir1 w u3 sh ir2"),  # percentage; 了 neutral
    ("好！？", "h ao3 !"),  # consecutive full-width punctuation keeps the first
    ("一点儿", "y i4 d ian3 EE er3"),  # erhua: a word-final 儿 takes the tone before it
    ("这儿", "zh e4 EE er4"),
    ("女儿", "n v3 EE er2"),  # 儿 as 'daughter' keeps its own tone
    ("买了2斤", "m ai3 l e5 l iang3 j in1"),  # a lone 2 counting something is 两
    ("第2个", "d i4 EE er4 g e5"),  # an ordinal 2 stays 二 (个 after a number is neutral)
    ("故事", "g u4 sh ir5"),  # neutral by usage
    ("是多少", "sh ir4 d uo1 sh ao5"),  # neutral by usage
    ("鸟儿", "n iao3 EE er2"),  # the lyrical diminutive of a small creature: 儿 keeps its syllable and tone
    ("马儿", "m a3 EE er2"),
    ("请拨打110", "q ing3 b o1 d a3 y ao1 y ao1 l ing2"),  # a doubled digit keeps its tone: 幺幺 is two digits
])
def test_gpt_sovits_chinese_phones(text, phones):
    assert " ".join(zh_g2p(text)) == phones
    symbols_to_ids(zh_g2p(text))  # every phone is in the table


def test_mixed_chinese_english_is_split_by_script():
    assert split_by_script("你好Hello world世界") == [("zh", "你好"), ("en", "Hello world"), ("zh", "世界")]
    # English through the CMU dictionary (hello: HH AH0 L OW1), Chinese around it.
    # mixed: English words read as English phones; zh (GPT-SoVITS's own data preparation): Latin letters dropped.
    assert " ".join(gpt_sovits_phones("你好Hello世界", "mixed")) == "n i2 h ao3 HH AH0 L OW1 sh ir4 j ie4"
    assert " ".join(gpt_sovits_phones("你好Hello世界", "zh")) == "n i2 h ao3 sh ir4 j ie4"
    assert " ".join(gpt_sovits_phones("我们用GPU训练。", "zh")) == "w o3 m en5 y ong4 x vn4 l ian4 ."
    assert gpt_sovits_phones("你好Hello世界", "auto") == gpt_sovits_phones("你好Hello世界", "zh")
    assert gpt_sovits_phones("Hello; world.", "en") == ["HH", "AH0", "L", "OW1", ",", "W", "ER1", "L", "D", "."]


def test_language_per_corpus_or_line():
    assert detect_language("你好") == "zh" and detect_language("hello") == "en"
    assert resolve_language("hello", "auto") == "en"
    assert resolve_language("hello", "auto", line_language="zh") == "zh"  # a per-line tag wins over auto
    assert resolve_language("你好", "en", line_language="zh") == "en"  # an explicit corpus language wins
    with pytest.raises(ValueError, match="language must be one of"):
        gpt_sovits_phones("x", "fr")
