"""What is computed from a waveform: mel, fbank, F0, energy, PCM, silence trimming and EnCodec codec codes,
each an extractor with one contract (docs/extraction.md). Features know nothing of Ray, storage or readers.

Where to look: `base.py` is the contract; `kinds.py` names the kinds and `names.py` the public name of each (both
cheap to import) and `registry.py` builds one from its parameters or from a manifest; `mel.py`, `fbank.py`,
`f0.py`, `energy.py`, `pcm.py`, `trim.py` and `codec.py` are the extractors; `spectral.py` holds the compiled STFT
kernels.

May import: `audiopipe.checkpoints.files` (safe reading of the codec's weights).
"""
