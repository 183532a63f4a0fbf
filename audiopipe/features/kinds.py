"""The feature kinds by name, with one line each: what a command line checks before it imports any feature code
(torch & co.), so that a typo costs milliseconds. audiopipe.features.registry builds them."""

FEATURE_KINDS: dict[str, str] = {
    "vocos_mel": "mel: log mel [100, T], 24 kHz hop 256, HTK, no norm (F5-TTS / vocos)",
    "slaney_mel": "mel: log mel [80, T], 22.05 kHz hop 256, slaney scale+norm (HiFi-GAN / BigVGAN)",
    "f0": "f0 [T] Hz + voiced [T] uint8, frames at t*hop; backends yin (fast, default), dio, harvest, praat",
    "energy": "energy [T]: L2 norm of the magnitude spectrum per frame (vocos framing by default)",
    "kaldi_fbank": "fbank: Kaldi log mel [80, T], 16 kHz 25/10 ms (3D-Speaker / WeSpeaker)",
    "pcm": "pcm: the waveform as int16 [N] at sample_rate",
}
