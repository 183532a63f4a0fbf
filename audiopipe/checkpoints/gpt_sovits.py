"""GPT-SoVITS stage 1 (the AR text-to-semantic model) checkpoints: our state dict <-> GPT-SoVITS's `.ckpt`.

GPT-SoVITS's WebUI writes its s1 weights (`GPT_weights*/<name>-e<N>.ckpt`, and the released
`s1bert25hz-*.ckpt`) as one torch file:

    {"weight": {"model.<name>": tensor, ...},   # the Lightning module's state dict, fp16 as the WebUI saves it
     "config": {"train": ..., "optimizer": ..., "data": {"max_sec": ...}, "model": {...}, "inference": ...},
     "info": "GPT-e<epoch>"}

Its inference (the WebUI's `change_gpt_weights`, `TTS.init_t2s_weights`) builds `Text2SemanticLightningModule`
from `config` and calls `load_state_dict(weight)` (strict). `config["model"]` sets the sizes: `phoneme_vocab_size`
is 512 rows in v1 checkpoints (a 322-symbol table) and 732 in v2 and later (the same 322 symbols first, then
Japanese pitch marks, Korean and Cantonese), so phone ids of `audiopipe.text.symbols` index both unchanged.

Names, ours -> upstream (every tensor maps one to one, 12 per layer + 7):

    phone_emb.weight            ar_text_embedding.word_embeddings.weight
    phone_pos.alpha             ar_text_position.alpha
    bert_proj.{weight,bias}     bert_proj.{weight,bias}
    token_emb.weight            ar_audio_embedding.word_embeddings.weight
    token_pos.alpha             ar_audio_position.alpha
    blocks.i.qkv                h.layers.i.self_attn.in_proj_{weight,bias}   (q, k, v stacked in the same order)
    blocks.i.proj               h.layers.i.self_attn.out_proj
    blocks.i.norm1 / norm2      h.layers.i.norm1 / norm2
    blocks.i.mlp.0 / mlp.3      h.layers.i.linear1 / linear2
    head.weight                 ar_predict_layer.weight

This module is the mapping and the file format only; the model is trainers/train_gpt_sovits.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from audiopipe.checkpoints.files import CheckpointError, read_weights, run_checkpoint, write_torch

PREFIX = "model."
V1_PHONE_ROWS = 512  # configs/s1longer.yaml: the 322-symbol table in a 512-row embedding
V2_PHONE_ROWS = 732  # configs/s1longer-v2.yaml: symbols2.py, 732 symbols
FORMATS = ("fp16", "fp32")  # fp16 is what the WebUI writes

_FIXED = {
    "phone_emb.weight": "ar_text_embedding.word_embeddings.weight",
    "phone_pos.alpha": "ar_text_position.alpha",
    "bert_proj.weight": "bert_proj.weight",
    "bert_proj.bias": "bert_proj.bias",
    "token_emb.weight": "ar_audio_embedding.word_embeddings.weight",
    "token_pos.alpha": "ar_audio_position.alpha",
    "head.weight": "ar_predict_layer.weight",
}
_LAYER = {
    "qkv.weight": "self_attn.in_proj_weight", "qkv.bias": "self_attn.in_proj_bias",
    "proj.weight": "self_attn.out_proj.weight", "proj.bias": "self_attn.out_proj.bias",
    "norm1.weight": "norm1.weight", "norm1.bias": "norm1.bias",
    "norm2.weight": "norm2.weight", "norm2.bias": "norm2.bias",
    "mlp.0.weight": "linear1.weight", "mlp.0.bias": "linear1.bias",
    "mlp.3.weight": "linear2.weight", "mlp.3.bias": "linear2.bias",
}
_FIXED_BACK = {v: k for k, v in _FIXED.items()}
_LAYER_BACK = {v: k for k, v in _LAYER.items()}
_OURS_LAYER = re.compile(r"blocks\.(\d+)\.(.+)")
_THEIRS_LAYER = re.compile(r"h\.layers\.(\d+)\.(.+)")


def upstream_name(ours: str) -> str | None:
    """The upstream name (without the `model.` prefix) of one of our tensors, or None if it has none."""
    if ours in _FIXED:
        return _FIXED[ours]
    m = _OURS_LAYER.fullmatch(ours)
    if m and m.group(2) in _LAYER:
        return f"h.layers.{m.group(1)}.{_LAYER[m.group(2)]}"
    return None


def our_name(theirs: str) -> str | None:
    """Our name of an upstream tensor (given without the `model.` prefix), or None if we have no such tensor."""
    if theirs in _FIXED_BACK:
        return _FIXED_BACK[theirs]
    m = _THEIRS_LAYER.fullmatch(theirs)
    if m and m.group(2) in _LAYER_BACK:
        return f"blocks.{m.group(1)}.{_LAYER_BACK[m.group(2)]}"
    return None


def to_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> the `weight` dict of an upstream `.ckpt` (`model.`-prefixed names). Every tensor must
    map: a tensor upstream has no place for is an error, never silently left out."""
    out, unknown = {}, []
    for k, v in state.items():
        name = upstream_name(k)
        if name is None:
            unknown.append(k)
        else:
            out[PREFIX + name] = v
    if unknown:
        raise CheckpointError(f"{len(unknown)} tensors have no place in GPT-SoVITS's s1 model (e.g. {unknown[0]!r})")
    return out


def from_upstream(weight: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The `weight` dict of an upstream `.ckpt` -> our names. Tensors we have no name for keep their upstream
    name, so loading reports them as dropped rather than losing them silently."""
    out = {}
    for k, v in weight.items():
        if not torch.is_tensor(v):
            raise CheckpointError(f"checkpoint entry {k!r} is a {type(v).__name__}, not a tensor")
        bare = k[len(PREFIX):] if k.startswith(PREFIX) else k
        out[our_name(bare) or k] = v
    return out


# ----------------------------------------------------------------------------- config

def sizes_from_config(config: Mapping[str, Any], where: str = "checkpoint") -> dict[str, Any]:
    """Our model sizes (the fields of train_gpt_sovits.ModelConfig) from an upstream config's `model` section."""
    m = config.get("model") if isinstance(config, Mapping) else None
    if not isinstance(m, Mapping):
        raise CheckpointError(f"{where}: its config has no 'model' section (not a GPT-SoVITS s1 checkpoint?)")
    try:
        dim, hidden = int(m["embedding_dim"]), int(m["hidden_dim"])
        vocab, eos = int(m["vocab_size"]), int(m["EOS"])
        sizes = {"dim": hidden, "heads": int(m["head"]), "layers": int(m["n_layer"]), "ff": 4 * hidden,
                 "vocab_size": vocab, "phone_vocab": int(m["phoneme_vocab_size"]),
                 "emb_dropout": float(m.get("dropout", 0.0))}
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: its config's model section lacks or garbles {e}") from None
    if dim != hidden:
        raise CheckpointError(f"{where}: embedding_dim {dim} != hidden_dim {hidden}, which this model does not build")
    if eos != vocab - 1:
        raise CheckpointError(f"{where}: EOS {eos} is not the last token id ({vocab - 1})")
    return sizes


def upstream_config(sizes: Mapping[str, Any], max_sec: float = 54.0,
                    base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `config` of an upstream `.ckpt` for a model of these sizes: `base` (the config of the checkpoint the
    run started from) with its model section and max_sec replaced, else GPT-SoVITS's configs/s1longer(-v2).yaml
    values (v2's when the phone table has more rows than v1's 512)."""
    if int(sizes["ff"]) != 4 * int(sizes["dim"]):
        raise CheckpointError(f"GPT-SoVITS's layers are 4 x dim wide; this model has ff {sizes['ff']} with dim "
                              f"{sizes['dim']}, which its code cannot build")
    v2 = int(sizes["phone_vocab"]) > V1_PHONE_ROWS
    cfg = copy.deepcopy(dict(base)) if base else {
        "train": {"seed": 1234, "epochs": 20, "batch_size": 8, "save_every_n_epoch": 1, "precision": "16-mixed",
                  "gradient_clip": 1.0},
        "optimizer": {"lr": 0.01, "lr_init": 0.00001, "lr_end": 0.0001, "warmup_steps": 2000, "decay_steps": 40000},
        "data": {"max_eval_sample": 8, "max_sec": 54, "num_workers": 4, "pad_val": 1024},
        "inference": {"top_k": 15 if v2 else 5},
    }
    vocab = int(sizes["vocab_size"])
    cfg["model"] = {**dict(cfg.get("model") or {}),
                    "vocab_size": vocab, "phoneme_vocab_size": int(sizes["phone_vocab"]),
                    "embedding_dim": int(sizes["dim"]), "hidden_dim": int(sizes["dim"]), "head": int(sizes["heads"]),
                    "linear_units": int(sizes["ff"]), "n_layer": int(sizes["layers"]),
                    "dropout": float(sizes.get("emb_dropout", 0.0)), "EOS": vocab - 1}
    cfg["model"].setdefault("random_bert", 0)
    cfg["data"] = {**dict(cfg.get("data") or {}), "max_sec": max_sec, "pad_val": vocab - 1}
    return cfg


# ----------------------------------------------------------------------------- files

def is_upstream(obj: Mapping[str, Any]) -> bool:
    """A dict read from a file is a GPT-SoVITS s1 checkpoint: a `weight` dict of `model.`-prefixed tensors."""
    w = obj.get("weight")
    return isinstance(w, Mapping) and any(isinstance(k, str) and k.startswith(PREFIX + "ar_") for k in w)


def read_upstream(path: str | Path, obj: Mapping[str, Any] | None = None
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any], str]:
    """(our state dict in float32, the checkpoint's config, its info) of a GPT-SoVITS s1 `.ckpt`.
    Read without unpickling code; a file that is something else is refused in one line that says what it is."""
    obj = read_weights(path) if obj is None else obj
    if not is_upstream(obj):
        hint = ""
        w = obj.get("weight")
        if isinstance(w, Mapping) and any(str(k).startswith(("enc_p.", "dec.", "ssl_proj")) for k in w):
            hint = ": it is a SoVITS (stage 2) model; stage 1 is the GPT `.ckpt` (GPT_weights*/ or s1bert*.ckpt)"
        elif "state_dict" in obj:
            hint = (": a Lightning training checkpoint (logs_s1/ckpt); use the half-weights file the WebUI writes "
                    "to GPT_weights*/")
        raise CheckpointError(f"{path}: not a GPT-SoVITS s1 checkpoint (no 'weight' dict of 'model.ar_*' "
                              f"tensors){hint}")
    config = obj.get("config")
    if not isinstance(config, Mapping):
        raise CheckpointError(f"{path}: the checkpoint has no 'config' dict, which holds the model's sizes")
    state = {k: v.float() for k, v in from_upstream(obj["weight"]).items()}
    return state, dict(config), str(obj.get("info", ""))


def write_upstream(state: Mapping[str, torch.Tensor], path: str | Path, config: Mapping[str, Any],
                   info: str, fmt: str = "fp16") -> Path:
    """Write our state dict as a GPT-SoVITS s1 `.ckpt` ({"weight", "config", "info"}); fp16 as the WebUI does,
    or fp32. Loads with upstream's `torch.load` + `Text2SemanticLightningModule.load_state_dict`."""
    if fmt not in FORMATS:
        raise CheckpointError(f"format {fmt!r}: use one of {', '.join(FORMATS)}")
    dtype = torch.float16 if fmt == "fp16" else torch.float32
    weight = {k: v.detach().to("cpu", dtype) for k, v in to_upstream(state).items()}
    return write_torch({"weight": weight, "config": json.loads(json.dumps(config)), "info": info}, path)


def export_run(source: str | Path, out: str | Path, *, weights: str | None = None, fmt: str = "fp16",
               overwrite: bool = False) -> dict[str, Any]:
    """Write one of our GPT-SoVITS s1 runs (a run folder for its latest ckpt-*.pt, or one ckpt-*.pt) as
    `out/gpt_sovits_s1-step<N>.ckpt`. The model's sizes and the config to write come from the run's
    `model_config.json` (written by trainers/train_gpt_sovits.py)."""
    if weights not in (None, "online"):
        raise CheckpointError(f"--weights {weights}: the GPT-SoVITS s1 trainer keeps no EMA copy; its weights are "
                              f"the online ones")
    src = Path(source)
    ck = run_checkpoint(src, "a run folder of the gpt_sovits trainer")
    obj = read_weights(ck)
    if not (isinstance(obj.get("model"), Mapping) and "step" in obj):
        raise CheckpointError(f"{ck}: not a checkpoint of audiopipe's trainers (a ckpt-*.pt)"
                              + ("; it is already a GPT-SoVITS .ckpt" if is_upstream(obj) else ""))
    run_cfg_path = ck.parent / "model_config.json"
    if not run_cfg_path.is_file():
        raise CheckpointError(f"{run_cfg_path} is missing: export reads the model's sizes there")
    run_cfg = json.loads(run_cfg_path.read_text())
    if run_cfg.get("trainer") != "gpt_sovits":
        raise CheckpointError(f"{run_cfg_path}: made by {run_cfg.get('trainer')!r}, not the gpt_sovits trainer")
    step = int(obj["step"])
    target = Path(out) / f"gpt_sovits_s1-step{step}.ckpt"
    if target.exists() and not overwrite:
        raise CheckpointError(f"{target} exists; pass --overwrite to replace it")
    Path(out).mkdir(parents=True, exist_ok=True)
    config = upstream_config(run_cfg["model"], run_cfg.get("max_sec", 54.0), run_cfg.get("upstream_config"))
    write_upstream(obj["model"], target, config, f"GPT-audiopipe-step{step}", fmt)
    notes = []
    if run_cfg.get("phones_table") != "gpt_sovits":
        notes.append("the run's phones are not ids of GPT-SoVITS's symbol table, so GPT-SoVITS's text front end "
                     "feeds this model other ids than it was trained on; shard with --language zh or auto")
    return {"files": [str(target)], "step": step, "weights": "online", "source": str(ck), "notes": notes,
            "next": f"GPT-SoVITS WebUI: copy {target.name} into GPT_weights_v2/ (GPT_weights/ for a v1 model) and "
                    f"pick it in the GPT model list; or TTS_infer_pack: tts.init_t2s_weights('{target}')"}
