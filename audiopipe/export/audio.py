"""Where an exported row's audio comes from: the shards' `pcm` feature, or the corpus file it was decoded from.

`pcm` is the waveform every other feature of the row was computed from (after resampling and any trimming),
stored losslessly as int16: exporting it gives consumers exactly the shards' audio, whatever the corpus was
(segments of long recordings, tar members, bytes inside Parquet files). `source` points at the corpus audio
instead, without copying it, and is only possible where that file *is* the row's audio: the whole file, one
channel, untrimmed shards, and the file still where the shard job read it. Anything else is refused in one line
rather than paired with the wrong audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from audiopipe.export.errors import ExportError

AUDIO_MODES = ("auto", "pcm", "source", "none")
_WHOLE_FILE_S = 0.01  # a row within 10 ms of its file's length is that whole file (rounding), as NeMo input is read
_PCM_HINT = "shards that hold the pcm feature (the eres2net, campplus or gpt_sovits preset, or the pcm feature)"


def resolve_mode(mode: str, has_pcm: bool, *, allow_none: bool = True) -> str:
    """auto -> pcm when the shards hold it, else source; pcm without it, or none where audio is required, refused."""
    if mode not in AUDIO_MODES:
        raise ExportError(f"audio={mode!r}: use one of {', '.join(AUDIO_MODES)}")
    if mode == "auto":
        return "pcm" if has_pcm else "source"
    if mode == "pcm" and not has_pcm:
        raise ExportError(f"audio='pcm' needs {_PCM_HINT}; these hold none (or use audio='source')")
    if mode == "none" and not allow_none:
        raise ExportError("audio='none': this export needs audio (use audio='pcm' or 'source')")
    return mode


@dataclass(frozen=True)
class RowAudio:
    """A row's audio: int16 samples (pcm) or a file (source), with its exact length."""

    sample_rate: int
    num_samples: int
    pcm: np.ndarray | None = None
    path: str | None = None

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


def from_pcm(row: dict[str, Any], sample_rate: int) -> RowAudio:
    pcm = np.asarray(row["pcm"])
    return RowAudio(sample_rate, int(pcm.shape[-1]), pcm=pcm)


class SourceAudio:
    """Rows -> their corpus files, checked to be the same audio as the row (see the module docstring)."""

    def __init__(self, corpus: str | None, trimmed: bool, root: Path):
        if trimmed:
            raise ExportError(f"audio='source': {root} was trimmed, so the corpus files hold more audio than the "
                              f"features describe; use audio='pcm' with {_PCM_HINT}")
        if not corpus:
            raise ExportError(f"audio='source': the manifest of {root} does not say which corpus folder it was "
                              f"made from; use audio='pcm' with {_PCM_HINT}")
        self.corpus = Path(corpus)

    def locate(self, row: dict[str, Any]) -> RowAudio:
        path = self.corpus / row["source"]  # an absolute source (a manifest entry outside the root) stays as it is
        why = None
        try:
            info = sf.info(str(path))
        except (OSError, RuntimeError, sf.LibsndfileError) as e:
            why = "no such file" if not path.exists() else f"not an audio file libsndfile reads ({str(e).strip()})"
        else:
            if info.channels != 1:
                why = f"it has {info.channels} channels (the features are of their mono mix)"
            elif abs(info.frames / info.samplerate - float(row["duration"])) > _WHOLE_FILE_S:
                why = (f"the row is {float(row['duration']):.3f} s of a {info.frames / info.samplerate:.3f} s file "
                       f"(a segment of a longer recording)")
        if why:
            raise ExportError(f"audio='source': utterance {row['id']!r} cannot point at {path}: {why}; use audio='pcm' "
                              f"with {_PCM_HINT}, or audio='none'")
        return RowAudio(int(info.samplerate), int(info.frames), path=str(path.absolute()))
