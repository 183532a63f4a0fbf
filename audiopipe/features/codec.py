"""EnCodec 24 kHz codec codes (the NaturalSpeech 2 target): 16 codebooks x 1024 entries at 75 Hz.

Weights come only from a local folder written by ``EncodecModel.save_pretrained`` (never a hub download), or
from an explicit ``random_init=True`` for tests and demos. See docs/ns2-data.md for the data contract.

Batching: EnCodec 24 kHz is fully causal (causal convolutions, unidirectional LSTM), so a frame depends only on
samples before its end, but two things still make a padded batch differ from encoding one clip alone:
  1. the last, partial hop: alone, EnCodec pads it by *reflection* inside every strided conv; in a batch it sees
     the next item's padding instead. We therefore define the codes of a clip as EnCodec applied to the clip
     zero-padded to a whole number of hops (T = ceil(N / 320) either way). Alone or batched, every frame then
     sees exactly the same samples.
  2. every causal conv pads its *left* edge by reflection, which reads the first few positions of the sequence;
     the final conv (kernel 7) reads 6 frames ahead, so clips shorter than 7 frames (<= 80 ms) would see batch
     padding there. Such clips are encoded one at a time.
Within those rules batched and one-at-a-time codes are identical (tests/test_codec.py checks this).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audiopipe.errors import AudiopipeError, InvalidValue
from audiopipe.features.base import FeatureSpec

SAMPLE_RATE = 24000
HOP_LENGTH = 320  # 8 * 5 * 4 * 2, the product of the encoder strides
CODEBOOK_SIZE = 1024
DEFAULT_BANDWIDTH = 12.0  # kbps; 12000 / (75 Hz * 10 bits) = 16 codebooks
# The 24 kHz architecture, pinned here so a library default changing never changes the random-init model.
ENCODEC_24KHZ_CONFIG: dict[str, Any] = {
    "audio_channels": 1,
    "chunk_length_s": None,
    "codebook_dim": 128,
    "codebook_size": CODEBOOK_SIZE,
    "compress": 2,
    "dilation_growth_rate": 2,
    "hidden_size": 128,
    "kernel_size": 7,
    "last_kernel_size": 7,
    "normalize": False,
    "num_filters": 32,
    "num_lstm_layers": 2,
    "num_residual_layers": 1,
    "overlap": None,
    "pad_mode": "reflect",
    "residual_kernel_size": 3,
    "sampling_rate": SAMPLE_RATE,
    "target_bandwidths": [1.5, 3.0, 6.0, 12.0, 24.0],
    "trim_right_ratio": 1.0,
    "upsampling_ratios": [8, 5, 4, 2],
    "use_causal_conv": True,
    "use_conv_shortcut": True,
}
# Padded audio per forward pass (sum over the sub-batch of the longest clip); bounds activation memory
# (the first layers hold 32 float32 channels per sample: ~370 MB per activation at this size).
DEFAULT_MAX_BATCH_SAMPLES = 120 * SAMPLE_RATE
WEIGHT_SUFFIXES = (".safetensors", ".bin")


class CodecCheckpointError(AudiopipeError, ValueError):
    """A codec checkpoint path that is missing, incomplete or not the EnCodec 24 kHz model."""


def num_codebooks_for(bandwidth: float) -> int:
    """Codebooks EnCodec 24 kHz uses at `bandwidth` kbps (each is 10 bits at 75 Hz = 0.75 kbps)."""
    return max(1, int(math.floor(bandwidth * 1000 / (math.log2(CODEBOOK_SIZE) * SAMPLE_RATE / HOP_LENGTH))))


def checkpoint_identity(path: str | Path) -> str:
    """sha256 of the weight file (or of the sorted per-file hashes when sharded): the checkpoint's identity."""
    files = _weight_files(Path(path))
    digests = [(f.name, _sha256_file(f)) for f in files]
    if len(digests) == 1:
        return f"sha256:{digests[0][1]}"
    blob = "".join(f"{name}:{digest}\n" for name, digest in digests)
    return f"sha256:{hashlib.sha256(blob.encode()).hexdigest()}"


@dataclass
class EncodecEncoder:
    """EnCodec 24 kHz encoder: float32 mono at 24 kHz -> int16 codes [16, ceil(N / 320)].

    Exactly one of `checkpoint` (a save_pretrained folder) or `random_init=True` must be given.
    """

    checkpoint: str | Path | None = None
    random_init: bool = False
    seed: int = 0
    bandwidth: float = DEFAULT_BANDWIDTH
    device: str = "auto"  # "auto" picks cuda when available
    max_batch_samples: int = DEFAULT_MAX_BATCH_SAMPLES

    def __post_init__(self) -> None:
        import torch

        if (self.checkpoint is None) == (not self.random_init):
            raise InvalidValue("EncodecEncoder needs exactly one of checkpoint=<folder> or random_init=True")
        if self.bandwidth not in ENCODEC_24KHZ_CONFIG["target_bandwidths"]:
            raise InvalidValue(
                f"bandwidth {self.bandwidth} kbps is not one of EnCodec 24 kHz's "
                f"{ENCODEC_24KHZ_CONFIG['target_bandwidths']}"
            )
        if self.max_batch_samples < HOP_LENGTH:
            raise InvalidValue(f"max_batch_samples must be >= {HOP_LENGTH}, got {self.max_batch_samples}")
        if self.checkpoint is not None:
            self._model = _load_checkpoint(Path(self.checkpoint))
            identity = checkpoint_identity(self.checkpoint)
        else:
            self._model = _random_init_model(self.seed)
            identity = f"random-init:{self.seed}"
        self.num_codebooks = num_codebooks_for(self.bandwidth)
        self._device = torch.device(_pick_device(self.device))
        self._model.to(self._device).eval()
        # The left reflect-pad of the final conv reads last_kernel_size - 1 frames ahead (see module docstring).
        self.min_batch_frames = int(self._model.config.last_kernel_size)
        self.spec = FeatureSpec(
            name="codes",
            kind="encodec_24khz",
            sample_rate=SAMPLE_RATE,
            dtype="int16",
            channels=self.num_codebooks,
            hop_length=HOP_LENGTH,
            params={
                "bandwidth": self.bandwidth,
                "codebook_size": CODEBOOK_SIZE,
                "checkpoint": identity,
                "end_padding": "zeros to a whole hop",
            },
        )
        self.specs = (self.spec,)

    def num_frames(self, num_samples: int) -> int:
        return -(-int(num_samples) // HOP_LENGTH)

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        return {"codes": self.encode_batch([wav])[0]}

    def encode_batch(self, wavs: list[np.ndarray]) -> list[np.ndarray]:
        """Codes for each waveform, in input order; identical to encoding each one alone."""
        clean = [_check_wav(w, i) for i, w in enumerate(wavs)]
        out: list[np.ndarray | None] = [None] * len(clean)
        for group in self._plan(clean):
            for i, codes in zip(group, self._encode_padded([clean[i] for i in group])):
                out[i] = codes
        return out  # type: ignore[return-value]

    def _plan(self, wavs: list[np.ndarray]) -> list[list[int]]:
        """Sub-batches: longest first so padding is small, each within max_batch_samples; short clips alone."""
        order = sorted(range(len(wavs)), key=lambda i: -len(wavs[i]))
        groups: list[list[int]] = []
        current: list[int] = []
        for i in order:
            padded = self.num_frames(len(wavs[i])) * HOP_LENGTH
            if self.num_frames(len(wavs[i])) < self.min_batch_frames:
                groups.append([i])
                continue
            longest = self.num_frames(len(wavs[current[0]])) * HOP_LENGTH if current else padded
            if current and longest * (len(current) + 1) > self.max_batch_samples:
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
        return groups

    def _encode_padded(self, wavs: list[np.ndarray]) -> list[np.ndarray]:
        import torch
        from torch.nn.utils import parametrize

        frames = [self.num_frames(len(w)) for w in wavs]
        width = max(frames) * HOP_LENGTH
        batch = np.zeros((len(wavs), 1, width), dtype=np.float32)
        mask = np.zeros((len(wavs), 1, width), dtype=bool)
        for row, (w, t) in enumerate(zip(wavs, frames)):
            batch[row, 0, : len(w)] = w
            # The mask covers the zero tail up to the whole hop: that tail is part of the clip's definition.
            mask[row, 0, : t * HOP_LENGTH] = True
        # Full fp32 convolutions and LSTM: cuDNN's default TF32 (10-bit mantissa) moves the encoder's output by
        # ~1e-3, enough to flip the residual quantizer's nearest code, and each flip changes every later codebook's
        # residual. Measured on an H200 with TF32: 1.2 % of codes differed between a batch and one clip at a time.
        # Codes must not depend on the batch they were made in, nor on the device.
        with torch.inference_mode(), parametrize.cached(), \
                torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
            result = self._model.encode(
                torch.from_numpy(batch).to(self._device),
                torch.from_numpy(mask).to(self._device),
                bandwidth=self.bandwidth,
                return_dict=True,
            )
        codes = result.audio_codes[0].to("cpu", torch.int16).numpy()  # [B, n_q, T_max]
        return [np.ascontiguousarray(codes[row, :, :t]) for row, t in enumerate(frames)]


def quantizer_state(checkpoint: str | Path | None = None, random_init_seed: int | None = None) -> dict[str, Any]:
    """The residual quantizer's tensors (`layers.<i>.codebook.{inited,cluster_size,embed,embed_avg}`, all 32
    layers) of the codec a `codes` column was made with: read from a save_pretrained folder's weight file(s)
    without building the model (no transformers import), or taken from the seeded random-init model.
    A model that decodes codes (NS2's latent) needs exactly these, frozen."""
    if (checkpoint is None) == (random_init_seed is None):
        raise InvalidValue("quantizer_state needs exactly one of checkpoint=<folder> or random_init_seed=<int>")
    if random_init_seed is not None:
        model = _random_init_model(random_init_seed)
        return {k: v.detach().clone() for k, v in model.quantizer.state_dict().items()}
    from audiopipe.checkpoints.files import read_weights

    state: dict[str, Any] = {}
    for f in _weight_files(Path(checkpoint)):
        state.update((k.removeprefix("quantizer."), v) for k, v in read_weights(f).items()
                     if k.startswith("quantizer."))
    if not state:
        raise CodecCheckpointError(f"EnCodec checkpoint {checkpoint} has no quantizer tensors")
    return state


def _check_wav(wav: np.ndarray, index: int) -> np.ndarray:
    arr = np.asarray(wav)
    if arr.ndim != 1:
        raise InvalidValue(f"wav {index}: expected mono 1-D audio, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidValue(f"wav {index}: empty waveform, nothing to encode")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InvalidValue(f"wav {index}: expected float audio in [-1, 1], got dtype {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise InvalidValue(f"wav {index}: waveform contains NaN or inf")
    return arr


def _pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidValue(f"device {device!r} requested but CUDA is not available")
    return device


def _weight_files(path: Path) -> list[Path]:
    if not path.exists():
        raise CodecCheckpointError(f"EnCodec checkpoint folder does not exist: {path}")
    if not path.is_dir():
        raise CodecCheckpointError(
            f"EnCodec checkpoint must be a folder written by save_pretrained, got a file: {path}"
        )
    files = sorted(f for f in path.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise CodecCheckpointError(f"no weight file (*.safetensors or *.bin) in EnCodec checkpoint folder {path}")
    return files


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _load_checkpoint(path: Path):
    from transformers import EncodecModel

    _weight_files(path)
    if not (path / "config.json").is_file():
        raise CodecCheckpointError(f"no config.json in EnCodec checkpoint folder {path}")
    try:
        model, info = EncodecModel.from_pretrained(str(path), local_files_only=True, output_loading_info=True)
    except Exception as exc:  # transformers raises many types; the path is what the user needs
        raise CodecCheckpointError(f"could not load EnCodec checkpoint from {path}: {exc}") from exc
    _check_architecture(model.config, path)
    # from_pretrained only warns about absent or misshapen tensors and fills them with random values; for the
    # parts that make the codes (the decoder is unused here) that would be silently wrong codes.
    mismatched = [m[0] if isinstance(m, tuple) else m for m in info.get("mismatched_keys", [])]
    bad = [str(k) for k in [*info.get("missing_keys", []), *mismatched]
           if str(k).startswith(("encoder.", "quantizer."))]
    if bad:
        shown = ", ".join(sorted(map(str, bad))[:5]) + (" ..." if len(bad) > 5 else "")
        raise CodecCheckpointError(
            f"EnCodec checkpoint {path} lacks or misshapes {len(bad)} encoder/quantizer tensors: {shown}"
        )
    return model


def _check_architecture(config, path: Path) -> None:
    """Refuse checkpoints that are not EnCodec 24 kHz: the spec (rate, hop, batching rules) assumes it."""
    wrong = [
        f"{key}={getattr(config, key, None)!r} (expected {ENCODEC_24KHZ_CONFIG[key]!r})"
        for key in ("sampling_rate", "audio_channels", "codebook_size", "upsampling_ratios", "use_causal_conv",
                    "normalize", "chunk_length_s", "last_kernel_size", "target_bandwidths")
        if getattr(config, key, None) != ENCODEC_24KHZ_CONFIG[key]
    ]
    if wrong:
        raise CodecCheckpointError(f"checkpoint {path} is not EnCodec 24 kHz: " + ", ".join(wrong))


def _random_init_model(seed: int):
    """The facebook/encodec_24khz architecture with seeded random weights that still give informative codes.

    transformers' own init zeroes the codebooks and lets biases dominate the encoder output, so every frame
    would get the same code. Instead: Gaussian conv directions with unit weight-norm gain and zero bias, and
    each codebook drawn around the residual statistics of a seeded noise signal.
    """
    import torch
    from transformers import EncodecConfig, EncodecModel
    from transformers.models.encodec.modeling_encodec import EncodecConv1d

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = EncodecModel(EncodecConfig(**ENCODEC_24KHZ_CONFIG)).eval()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, EncodecConv1d):
                    conv = module.conv
                    if hasattr(conv, "parametrizations"):
                        direction, gain = conv.parametrizations.weight.original1, conv.parametrizations.weight.original0
                    else:  # older torch weight_norm hook
                        direction, gain = conv.weight_v, conv.weight_g
                    direction.copy_(torch.randn(direction.shape, generator=gen))
                    gain.fill_(1.0)
                    conv.bias.zero_()
            calibration = torch.randn(1, 1, SAMPLE_RATE, generator=gen) * 0.1
            residual = model.encoder(calibration)
            for layer in model.quantizer.layers:
                mean, std = residual.mean(dim=(0, 2)), residual.std(dim=(0, 2))
                codebook = layer.codebook
                codebook.embed.copy_(mean + std * 0.3 * torch.randn(codebook.embed.shape, generator=gen))
                codebook.embed_avg.copy_(codebook.embed)
                residual = residual - layer.decode(layer.encode(residual))
    return model
