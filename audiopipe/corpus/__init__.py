"""What a corpus holds: the audio files of a folder or a manifest, each read from its header (nothing decoded),
with its transcript and speaker, as an `Utterance`, or as a `Reject` that says why it will not be written
(docs/corpus.md).

Where to look: `discover.py` walks a folder or reads a manifest and is the one entry point; `records.py` holds
`Utterance`, `Reject` and the id rules every reader shares; `layouts/` reads corpora with their own index files
(Kaldi, AISHELL-3, LibriTTS, VCTK, Emilia); `manifests/` reads manifests (audiopipe's own, lhotse, NeMo, Common
Voice, Hugging Face); `listings.py` opens the files that list audio; `entries.py` turns listed rows into
utterances with one header read per audio; `transcripts.py` finds sidecar and metadata.csv transcripts;
`hints.py` adds notes about likely mistakes; `wavheader.py`, `tarmembers.py` and `textgrid.py` read WAV headers,
tar members and TextGrids.

May import: `audiopipe.decode` (headers of audio files and tar members), `audiopipe.storage` (the guarded opening
of every input file).
"""
