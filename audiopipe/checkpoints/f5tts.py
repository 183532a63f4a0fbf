"""F5-TTS weights between audiopipe's trainer (trainers/train_f5tts.py) and the files SWivid/F5-TTS reads and writes.

The network is F5's DiT tensor for tensor; only the names differ, plus one buffer F5 stores and audiopipe derives
(the rotary frequencies `transformer.rotary_embed.inv_freq`, a constant of the head size). Upstream's files:

  model_<N>.pt          its Trainer's checkpoint: {"model_state_dict": the online weights (CFM names),
                        "ema_model_state_dict": {"ema_model.<CFM name>": ..., "initted": bool, "step": int},
                        "optimizer_state_dict", "scheduler_state_dict", "update" (older ones: "step")}
  model_<N>.safetensors the released files: the EMA state dict alone (with the `ema_model.` prefix, `initted`
                        and `step`), which both its inference (`load_checkpoint(use_ema=True)`) and its fine-tuning
                        (`Trainer.load_checkpoint` of a `pretrained_*` file) read
  vocab.txt             one symbol per line, line number = token id

Released weights are the EMA copy, so reading takes the EMA weights by default, as F5's inference does. Writing
gives the EMA weights in the EMA slot (what F5's inference loads) and the online weights in `model_state_dict`.
An exported `.pt` carries no optimizer or scheduler state and no top-level step: F5's Trainer then starts it as
a pretrained checkpoint (fresh optimizer and schedule), as it does with its own pruned checkpoints.

Everything here is state-dict arithmetic on tensors: no model code, no trainers/ import.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from audiopipe.checkpoints.files import CheckpointError, read_weights, tensors_only, write_safetensors, write_torch
from audiopipe.storage.atomic import write_text_atomic

EMA_PREFIX = "ema_model."
EMA_COUNTERS = ("initted", "step")  # ema_pytorch's buffers beside the EMA weights
ROTARY = "transformer.rotary_embed.inv_freq"
ROTARY_BASE = 10000.0
# Old F5 checkpoints stored the mel front end's constants; F5 deletes them on load, and so does this module.
LEGACY_MEL_KEYS = ("mel_spec.mel_stft.mel_scale.fb", "mel_spec.mel_stft.spectrogram.window")
EMBEDDING = "transformer.text_embed.embed.weight"  # [vocabulary + 1 (the filler id 0), text_dim]
EMA_HOOK = "ema"  # the trainer's EMA hook name in ckpt["hooks"]: {"step", "initted", "weights" (audiopipe names)}

# (audiopipe prefix, F5 prefix); "{i}" is a layer index. Every name is prefix + a parameter name (weight, bias,
# gamma, beta).
_PAIRS = (
    ("transformer.time_embed.mlp.{i}.", "transformer.time_embed.time_mlp.{i}."),
    ("transformer.text_embed.embed.", "transformer.text_embed.text_embed."),
    ("transformer.text_embed.blocks.{i}.dwconv.", "transformer.text_embed.text_blocks.{i}.dwconv."),
    ("transformer.text_embed.blocks.{i}.norm.", "transformer.text_embed.text_blocks.{i}.norm."),
    ("transformer.text_embed.blocks.{i}.pw1.", "transformer.text_embed.text_blocks.{i}.pwconv1."),
    ("transformer.text_embed.blocks.{i}.grn.", "transformer.text_embed.text_blocks.{i}.grn."),
    ("transformer.text_embed.blocks.{i}.pw2.", "transformer.text_embed.text_blocks.{i}.pwconv2."),
    ("transformer.input_embed.proj.", "transformer.input_embed.proj."),
    ("transformer.input_embed.conv_pos.conv1.", "transformer.input_embed.conv_pos_embed.conv1d.0."),
    ("transformer.input_embed.conv_pos.conv2.", "transformer.input_embed.conv_pos_embed.conv1d.2."),
    ("transformer.blocks.{i}.ada.", "transformer.transformer_blocks.{i}.attn_norm.linear."),
    ("transformer.blocks.{i}.attn.to_q.", "transformer.transformer_blocks.{i}.attn.to_q."),
    ("transformer.blocks.{i}.attn.to_k.", "transformer.transformer_blocks.{i}.attn.to_k."),
    ("transformer.blocks.{i}.attn.to_v.", "transformer.transformer_blocks.{i}.attn.to_v."),
    ("transformer.blocks.{i}.attn.to_out.", "transformer.transformer_blocks.{i}.attn.to_out.0."),
    ("transformer.blocks.{i}.ff.0.", "transformer.transformer_blocks.{i}.ff.ff.0.0."),
    ("transformer.blocks.{i}.ff.3.", "transformer.transformer_blocks.{i}.ff.ff.2."),
    ("transformer.ada_out.", "transformer.norm_out.linear."),
    ("transformer.proj_out.", "transformer.proj_out."),
)


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)") + r"(?P<leaf>[A-Za-z_]+)$")


_OURS = [(_pattern(a), b) for a, b in _PAIRS]
_THEIRS = [(_pattern(b), a) for a, b in _PAIRS]


def _rename(name: str, table: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pat, template in table:
        m = pat.match(name)
        if m:
            return template.replace("{i}", m.groupdict().get("i") or "") + m.group("leaf")
    return None


def rotary_inv_freq(dim_head: int) -> torch.Tensor:
    """F5's rotary buffer for a head size (x-transformers' RotaryEmbedding with its defaults)."""
    return 1.0 / (ROTARY_BASE ** (torch.arange(0, dim_head, 2).float() / dim_head))


def to_upstream(state: Mapping[str, torch.Tensor], *, dim_head: int) -> dict[str, torch.Tensor]:
    """audiopipe F5TTS state dict -> F5's CFM state dict (what `CFM.load_state_dict` takes), with the rotary
    buffer. A name this module does not know is refused rather than left behind."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        theirs = _rename(name, _OURS)
        if theirs is None:
            raise CheckpointError(f"tensor {name!r} has no place in F5-TTS's CFM/DiT")
        out[theirs] = value
    out[ROTARY] = rotary_inv_freq(dim_head)
    return out


def from_upstream(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int | None]:
    """F5's CFM state dict (without the `ema_model.` prefix) -> (audiopipe names, head size from the rotary buffer
    or None when the file has none). Refuses a tensor with no place in audiopipe's DiT (qk_norm, a long skip
    connection, E2-TTS's UNetT) and rotary frequencies other than the standard ones."""
    out: dict[str, torch.Tensor] = {}
    dim_head = None
    for name, value in state.items():
        if name in LEGACY_MEL_KEYS:
            continue
        if name == ROTARY:
            dim_head = 2 * value.numel()
            if not torch.allclose(value.float(), rotary_inv_freq(dim_head), rtol=1e-5, atol=0):
                raise CheckpointError(f"{ROTARY} is not base-{ROTARY_BASE:g} rotary frequencies; audiopipe's "
                                      f"DiT only has those")
            continue
        ours = _rename(name, _THEIRS)
        if ours is None:
            raise CheckpointError(f"tensor {name!r} has no place in audiopipe's F5 DiT (qk_norm, a long skip "
                                  f"connection or another backbone such as E2-TTS's UNetT are not supported)")
        out[ours] = value
    if not out:
        raise CheckpointError("no F5-TTS weights in it")
    return out, dim_head


def is_upstream_names(state: Mapping[str, Any]) -> bool:
    return any(k.startswith(("transformer.transformer_blocks.", EMA_PREFIX + "transformer.")) for k in state)


def is_audiopipe_names(state: Mapping[str, Any]) -> bool:
    return any(k.startswith("transformer.blocks.") for k in state)


def ema_state_dict(upstream: Mapping[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """An ema_pytorch EMA state dict as F5's Trainer saves it (`include_online_model=False`)."""
    out = {"initted": torch.tensor(True), "step": torch.tensor(int(step))}
    out.update({EMA_PREFIX + k: v for k, v in upstream.items()})
    return out


def split_ema(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], int | None, bool]:
    """(weights without the `ema_model.` prefix, ema step or None, initted) of an EMA state dict, or of a plain
    state dict (then step None and initted True: the weights are what they are)."""
    step = state.get("step")
    initted = state.get("initted")
    weights = {k[len(EMA_PREFIX):] if k.startswith(EMA_PREFIX) else k: v for k, v in state.items()
               if k not in EMA_COUNTERS}
    return (tensors_only(weights, "EMA state dict"), int(step) if torch.is_tensor(step) else None,
            bool(initted) if torch.is_tensor(initted) else True)


# ----------------------------------------------------------------------------- reading

@dataclass
class F5Checkpoint:
    """What --init-from and export read from a file: weights in audiopipe names and where they came from."""

    path: Path
    origin: str  # "upstream" (an F5-TTS file) or "audiopipe" (one of ours)
    kind: str  # human words: "F5-TTS training checkpoint, EMA weights", ...
    weights: dict[str, torch.Tensor]  # what a model starts from (the EMA weights of an upstream file)
    ema_weights: dict[str, torch.Tensor] | None = None  # the EMA copy, when the file keeps one
    ema_step: int | None = None
    ema_initted: bool = False
    online_weights: dict[str, torch.Tensor] | None = None
    dim_head: int | None = None  # from the rotary buffer (upstream files)
    step: int | None = None  # training step of our checkpoints
    run_config: dict[str, Any] | None = None  # model_config.json of our run folder
    vocab_file: Path | None = None  # vocab.txt beside the file (or in our run folder)
    notes: list[str] = field(default_factory=list)


def latest_run_checkpoint(folder: Path) -> Path | None:
    cks = sorted(folder.glob("ckpt-*.pt"))
    return cks[-1] if cks else None


def _our_ema(hooks: Any) -> tuple[dict[str, torch.Tensor] | None, int | None, bool]:
    ema = hooks.get(EMA_HOOK) if isinstance(hooks, Mapping) else None
    if not isinstance(ema, Mapping) or not isinstance(ema.get("weights"), Mapping) or not ema.get("initted"):
        return None, None, False
    return tensors_only(ema["weights"], "EMA weights"), int(ema.get("step", 0)), True


def read_f5_checkpoint(path: str | Path, use_ema: bool = True) -> F5Checkpoint:
    """Read F5 weights from any of: F5's model_*.pt, a released or exported .safetensors, one of our ckpt-*.pt,
    our run folder (its latest checkpoint), or a plain state dict in either naming. Raises CheckpointError (one
    line). use_ema: start from the EMA copy when the file keeps one (F5's files; ours keep the online weights as
    the model's, and the EMA copy beside them)."""
    p = Path(path)
    if p.is_dir():
        ck = latest_run_checkpoint(p)
        if ck is None:
            raise CheckpointError(f"{p} is a folder without ckpt-*.pt; give the checkpoint file "
                                  f"(model_*.pt or *.safetensors)")
        p = ck
    raw = read_weights(p)
    beside = p.parent / "vocab.txt"
    vocab = beside if beside.is_file() else None
    # one of ours: trainers/core's checkpoint
    if isinstance(raw.get("model"), Mapping) and "step" in raw:
        online = tensors_only(raw["model"], f"{p} (model)")
        ema, ema_step, initted = _our_ema(raw.get("hooks"))
        cfg_file = p.parent / "model_config.json"
        run_config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else None
        return F5Checkpoint(p, "audiopipe", f"audiopipe checkpoint (step {int(raw['step'])})", online, ema,
                            ema_step, initted, online, step=int(raw["step"]), run_config=run_config,
                            vocab_file=vocab)
    # F5's Trainer checkpoint
    if "ema_model_state_dict" in raw or "model_state_dict" in raw:
        ema_raw, online_raw = raw.get("ema_model_state_dict"), raw.get("model_state_dict")
        for what, d in (("ema_model_state_dict", ema_raw), ("model_state_dict", online_raw)):
            if d is not None and not isinstance(d, Mapping):
                raise CheckpointError(f"{p}: {what} is a {type(d).__name__}, not a state dict")
        ema = online = None
        ema_step, initted, dim_head = None, False, None
        if ema_raw:
            w, ema_step, initted = split_ema(ema_raw)
            ema, dim_head = from_upstream(w)
        if online_raw:
            online, dh = from_upstream(tensors_only(online_raw, f"{p} (model_state_dict)"))
            dim_head = dim_head or dh
        take_ema = ema is not None and (use_ema or online is None)
        if not take_ema and online is None:
            raise CheckpointError(f"{p}: holds no weights")
        return F5Checkpoint(p, "upstream", f"F5-TTS training checkpoint, {'EMA' if take_ema else 'online'} weights",
                            ema if take_ema else online, ema, ema_step, initted, online, dim_head,
                            vocab_file=vocab)
    # a bare state dict: released .safetensors (EMA, usually with the prefix and counters), or a plain one
    if is_upstream_names(raw) or any(k.startswith("transformer.transformer_blocks.") for k in raw):
        w, ema_step, initted = split_ema(raw)
        weights, dim_head = from_upstream(w)
        return F5Checkpoint(p, "upstream", "F5-TTS weights (EMA, as released)", weights, weights, ema_step,
                            initted and ema_step is not None, None, dim_head, vocab_file=vocab)
    if is_audiopipe_names(raw):
        weights = tensors_only(raw, str(p))
        return F5Checkpoint(p, "audiopipe", "audiopipe F5 state dict", weights, online_weights=weights,
                            vocab_file=vocab)
    raise CheckpointError(f"{p}: not an F5-TTS checkpoint (no DiT weights in it)")


def architecture(state: Mapping[str, torch.Tensor], dim_head: int | None = None) -> dict[str, int]:
    """The model size a state dict in audiopipe names has (the fields of the trainer's ModelConfig it fixes)."""
    try:
        emb = state[EMBEDDING]
        q = state["transformer.blocks.0.attn.to_q.weight"]
        arch = {
            "dim": int(state["transformer.input_embed.proj.weight"].shape[0]),
            "depth": len({k.split(".")[2] for k in state if k.startswith("transformer.blocks.")}),
            "text_dim": int(emb.shape[1]),
            "text_num_embeds": int(emb.shape[0]) - 1,
            "conv_layers": len({k.split(".")[3] for k in state if k.startswith("transformer.text_embed.blocks.")}),
            "ff_mult": int(state["transformer.blocks.0.ff.0.weight"].shape[0]) // int(q.shape[1]),
            "mel_dim": int(state["transformer.proj_out.weight"].shape[0]),
            "conv_pos_kernel": int(state["transformer.input_embed.conv_pos.conv1.weight"].shape[-1]),
        }
    except KeyError as e:
        raise CheckpointError(f"not a complete F5 DiT: {e.args[0]!r} is missing") from None
    if dim_head:
        arch["dim_head"] = dim_head
        arch["heads"] = int(q.shape[0]) // dim_head
    return arch


# ----------------------------------------------------------------------------- writing

def write_upstream_pt(path: str | Path, *, online: Mapping[str, torch.Tensor], ema: Mapping[str, torch.Tensor],
                      ema_step: int, dim_head: int) -> Path:
    """F5's model_<N>.pt layout: online weights and the EMA state dict (no optimizer, scheduler or step: F5's
    Trainer starts it as a pretrained checkpoint, its inference reads the EMA slot)."""
    return write_torch({"model_state_dict": to_upstream(online, dim_head=dim_head),
                        "ema_model_state_dict": ema_state_dict(to_upstream(ema, dim_head=dim_head), ema_step)},
                       path)


def write_upstream_safetensors(path: str | Path, *, weights: Mapping[str, torch.Tensor], ema_step: int,
                               dim_head: int) -> Path:
    """The released layout: the EMA state dict alone (prefix and counters included, so F5's Trainer can
    fine-tune from it as `pretrained_*.safetensors` and its inference loads it with use_ema=True)."""
    return write_safetensors(ema_state_dict(to_upstream(weights, dim_head=dim_head), ema_step), path)


def f5_model_yaml(model: Mapping[str, Any], vocab_file: str | None) -> str:
    """An F5 model config (what `f5-tts_infer-cli --model_cfg` and its training read) for our model config."""
    arch = {"dim": model["dim"], "depth": model["depth"], "heads": model["heads"], "dim_head": model["dim_head"],
            "ff_mult": model["ff_mult"], "text_dim": model["text_dim"],
            "text_mask_padding": model.get("text_mask_padding", True), "qk_norm": None,
            "conv_layers": model["conv_layers"], "pe_attn_head": model.get("pe_attn_head"),
            "attn_backend": "torch",
            # a model trained with padded keys masked runs best with F5's mask on (it matters for batches only)
            "attn_mask_enabled": not model.get("upstream_forward", False),
            "checkpoint_activations": False}

    def scalar(v: Any) -> str:
        if v is None:
            return "null"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)  # a JSON string is a YAML string
        return str(v)

    lines = ["model:", "  name: F5TTS_audiopipe", "  tokenizer: custom",
             f"  tokenizer_path: {scalar(vocab_file)}", "  backbone: DiT", "  arch:"]
    lines += [f"    {k}: {scalar(v)}" for k, v in arch.items()]
    lines += ["  mel_spec:", "    target_sample_rate: 24000", "    n_mel_channels: 100", "    hop_length: 256",
              "    win_length: 1024", "    n_fft: 1024", "    mel_spec_type: vocos",
              "  vocoder:", "    is_local: true", "    local_path: null"]
    return "\n".join(lines) + "\n"


FORMATS = ("safetensors", "pt", "both")


def export_run(source: str | Path, out: str | Path, *, weights: str | None = None, fmt: str = "safetensors",
               overwrite: bool = False) -> dict[str, Any]:
    """Write one of our F5 runs (a run folder for its latest checkpoint, or a ckpt-*.pt) as F5-TTS files in
    `out`: model_<step>.safetensors and/or model_<step>.pt, vocab.txt, and model_cfg.yaml (F5's model config for
    `--model_cfg`). weights: "ema" (default where the run kept one: what F5's inference reads) or "online"."""
    if fmt not in FORMATS:
        raise CheckpointError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    ck = read_f5_checkpoint(source)
    if ck.origin != "audiopipe" or ck.step is None:
        raise CheckpointError(f"{ck.path}: not a checkpoint of audiopipe's F5 trainer (a ckpt-*.pt or its run "
                              f"folder); it is already in F5-TTS's format" if ck.origin == "upstream" else
                              f"{ck.path}: not a checkpoint of audiopipe's F5 trainer")
    if ck.run_config is None or "model" not in ck.run_config:
        raise CheckpointError(f"{ck.path.parent}/model_config.json is missing: export reads the model size there")
    model = ck.run_config["model"]
    fixed = {"conv_pos_kernel": 31, "conv_pos_groups": 16, "mel_dim": 100}  # not settings of F5's DiT
    if bad := [f"{k} {model.get(k)}" for k, v in fixed.items() if model.get(k, v) != v]:
        raise CheckpointError(f"{ck.path}: a model with {', '.join(bad)} has no F5-TTS counterpart (F5's DiT has "
                              f"{', '.join(f'{k} {v}' for k, v in fixed.items())})")
    weights = weights or ("ema" if ck.ema_weights is not None else "online")
    if weights not in ("ema", "online"):
        raise CheckpointError(f"--weights {weights!r}: use ema or online")
    if weights == "ema" and ck.ema_weights is None:
        raise CheckpointError(f"{ck.path}: this run kept no EMA weights (trained with --ema off, or stopped before "
                              f"its first step); export its online weights with --weights online")
    chosen = ck.ema_weights if weights == "ema" else ck.online_weights
    assert chosen is not None and ck.online_weights is not None
    tokenizer = ck.run_config.get("tokenizer")
    vocab = ck.path.parent / "vocab.txt"
    if tokenizer != "byte" and not vocab.is_file():
        raise CheckpointError(f"{vocab} is missing: the run used a vocabulary, and F5 needs it to read the model")
    out = Path(out)
    names = {"safetensors": [f"model_{ck.step}.safetensors"], "pt": [f"model_{ck.step}.pt"],
             "both": [f"model_{ck.step}.safetensors", f"model_{ck.step}.pt"]}[fmt]
    targets = [out / n for n in names] + [out / "model_cfg.yaml"] + ([out / "vocab.txt"] if tokenizer != "byte" else [])
    if not overwrite and (existing := [t.name for t in targets if t.exists()]):
        raise CheckpointError(f"{out} already holds {', '.join(existing)}; pass --overwrite to replace")
    out.mkdir(parents=True, exist_ok=True)
    ema_step = ck.ema_step if (weights == "ema" and ck.ema_step is not None) else ck.step
    dim_head = int(model["dim_head"])
    files = []
    for n in names:
        if n.endswith(".safetensors"):
            write_upstream_safetensors(out / n, weights=chosen, ema_step=ema_step, dim_head=dim_head)
        else:
            write_upstream_pt(out / n, online=ck.online_weights, ema=chosen, ema_step=ema_step, dim_head=dim_head)
        files.append(str(out / n))
    vocab_out = None
    if tokenizer != "byte":
        vocab_out = out / "vocab.txt"
        if vocab.resolve() != vocab_out.resolve():
            shutil.copyfile(vocab, vocab_out)
        files.append(str(vocab_out))
    write_text_atomic(out / "model_cfg.yaml", f5_model_yaml(model, str(vocab_out) if vocab_out else None))
    files.append(str(out / "model_cfg.yaml"))
    notes = []
    if tokenizer == "byte":
        notes.append("the run tokenized UTF-8 bytes: F5's inference CLI reads text through a vocab.txt, so use "
                     "F5's Python API with tokenizer 'byte' (train with --vocab or --tokenizer pinyin for the CLI)")
    if not model.get("upstream_forward", False):
        notes.append("trained with audiopipe's masked forward: F5's inference lets filler frames into the text "
                     "GRN statistics, which this model never saw (docs/trainers/f5tts.md)")
    ckpt_name = Path(files[0]).name
    cmd = (f"f5-tts_infer-cli --model_cfg {out / 'model_cfg.yaml'} --ckpt_file {out / ckpt_name}"
           + (f" --vocab_file {vocab_out}" if vocab_out else "")
           + " --load_vocoder_from_local --ref_audio REF.wav --ref_text \"...\" --gen_text \"...\"")
    return {"model": "f5tts", "source": str(ck.path), "step": ck.step, "weights": weights, "ema_step": ema_step,
            "files": files, "notes": notes, "next": cmd}
