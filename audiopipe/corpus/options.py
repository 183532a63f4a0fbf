"""What a user may tell discovery beyond the root, the manifest and the speaker rule (the `shard` flags of
docs/corpus.md): which table columns hold text, speaker, audio and id, which VCTK microphone to take, which
metadata columns will be written, and whether utterances without a transcript are refused."""

from __future__ import annotations

from dataclasses import dataclass

from audiopipe.errors import InvalidValue

VCTK_MICS = ("mic1", "mic2")


@dataclass(frozen=True)
class CorpusOptions:
    # Table manifests (Hugging Face parquet/Arrow, CSV/TSV/JSONL, NeMo, Common Voice): the column of each field;
    # None takes the kind's usual name (docs/corpus.md). Ignored by lhotse manifests, whose fields are typed.
    text_column: str | None = None
    speaker_column: str | None = None
    audio_column: str | None = None
    id_column: str | None = None
    vctk_mic: str = "mic1"
    # Metadata columns the shards will hold (Job.keep_columns); discovery only uses them to say which columns
    # are NOT written, and to keep those values on the utterances of readers that drop unknown columns.
    keep_columns: tuple[str, ...] = ()
    # Refuse (`no_text`) every utterance whose transcript is empty.
    require_text: bool = False
    # The preset(s) that train on transcripts, for the note that counts utterances without one (None: no note).
    text_for: str | None = None

    def __post_init__(self) -> None:
        if self.vctk_mic not in VCTK_MICS:
            raise InvalidValue(f"the VCTK microphone must be one of {', '.join(VCTK_MICS)}, got {self.vctk_mic!r}")
