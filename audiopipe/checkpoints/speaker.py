"""3D-Speaker's ERes2Net and CAM++ checkpoints, both ways: our trainers' state dicts and the files speakerlab reads.

The networks are 3D-Speaker's, parameter for parameter; only the tensor names differ. Two upstream layouts exist:

- the embedding model's plain state dict, as the released `pretrained_eres2net.ckpt` or `campplus_voxceleb.bin`
  (speakerlab builds `ERes2Net(**args)` / `CAMPPlus(**args)` and calls `load_state_dict(torch.load(file))`);
- an experiment folder, what speakerlab's trainer (`speakerlab/bin/train.py`) leaves and its embedding extraction
  (`speakerlab/bin/extract.py --exp_dir`) reads: `config.yaml` (which class with which arguments, the fbank, the
  epoch to load) and `models/CKPT-EPOCH-<n>-00/` holding `CKPT.yaml` (its epoch), `embedding_model.ckpt`,
  `classifier.ckpt` (the AAM-softmax class weights) and `epoch_counter.ckpt`.

Our side: a trainer's model is the embedding model under `encoder.` plus the AAM head's `head.weight` (and a step
counter); a bare embedding state dict without the prefix is accepted too. Nothing here builds a model: the
converters rename tensors, infer the constructor arguments upstream needs from their shapes, and refuse, in one
line, a configuration that speakerlab's classes cannot build.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from audiopipe.checkpoints.files import CheckpointError, read_weights, run_checkpoint, tensors_only, write_torch
from audiopipe.checkpoints.rules import Difference, settle
from audiopipe.storage.atomic import write_text_atomic

MODELS = ("eres2net", "campplus")
UPSTREAM_CLASS = {
    "eres2net": "speakerlab.models.eres2net.ERes2Net.ERes2Net",
    "campplus": "speakerlab.models.campplus.DTDNN.CAMPPlus",
}
CLASSIFIER_CLASS = "speakerlab.models.campplus.classifier.CosineClassifier"  # both recipes' AAM head
SAMPLE_RATE = 16000
ENCODER = "encoder."
HEAD = "head.weight"


# ----------------------------------------------------------------------------- our state dict, either form

def encoder_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The embedding model's tensors of one of our state dicts: a trainer's (encoder.* + head + counters) or a
    bare embedding model's."""
    if any(k.startswith(ENCODER) for k in state):
        return {k[len(ENCODER):]: v for k, v in state.items() if k.startswith(ENCODER)}
    return dict(state)


# ----------------------------------------------------------------------------- ERes2Net names

# Name pieces that differ (ours -> upstream, and back); everything else (stem, the blocks' convs and norms,
# shortcuts) is named alike.
_ERES2NET_TO_UPSTREAM = [
    (r"^(layer\d+\.\d+\.)fuse\.(\d+)\.att\.", r"\1fuse_models.\2.local_att."),
    (r"^down(\d)\.", r"layer\1_downsample."),
    (r"^fuse(12|123|1234)\.att\.", r"fuse_mode\1.local_att."),
    (r"^embed\.", r"seg_1."),
]
_ERES2NET_FROM_UPSTREAM = [
    (r"^(layer\d+\.\d+\.)fuse_models\.(\d+)\.local_att\.", r"\1fuse.\2.att."),
    (r"^layer(\d)_downsample\.", r"down\1."),
    (r"^fuse_mode(12|123|1234)\.local_att\.", r"fuse\1.att."),
    (r"^seg_1\.", r"embed."),
]


def _rename(state: Mapping[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        for pat, rep in rules:
            name, n = re.subn(pat, rep, name)
            if n:
                break
        out[name] = t
    return out


def eres2net_to_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ERes2Net (a trainer's state dict or the bare encoder's) -> speakerlab's ERes2Net state dict."""
    return _rename(encoder_state(state), _ERES2NET_TO_UPSTREAM)


def eres2net_from_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speakerlab's ERes2Net state dict -> our trainer's names (under `encoder.`)."""
    return {ENCODER + k: v for k, v in _rename(state, _ERES2NET_FROM_UPSTREAM).items()}


def eres2net_upstream_args(upstream: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The `ERes2Net(**args)` that has exactly these tensors, or CheckpointError naming what it cannot build.

    speakerlab's ERes2Net fixes the block width (base width 32, scale 2), the AFF reduction (4), the pooling (TSTP)
    and one embedding layer; it takes feat_dim, embedding_size, m_channels and num_blocks."""
    need = ["conv1.weight", "seg_1.weight", "layer1.0.convs.0.weight"]
    if any(k not in upstream for k in need):
        raise CheckpointError(f"not an ERes2Net state dict: {next(k for k in need if k not in upstream)!r} is missing")
    m = int(upstream["conv1.weight"].shape[0])
    blocks = [len({k.split(".")[1] for k in upstream if k.startswith(f"layer{s}.") and k.endswith(".conv1.weight")})
              for s in (1, 2, 3, 4)]
    scale = len({k.split(".")[3] for k in upstream if k.startswith("layer1.0.convs.")})
    width = int(upstream["layer1.0.convs.0.weight"].shape[0])
    if scale != 2 or width != m // 2:
        raise CheckpointError(f"ERes2Net blocks of scale {scale} and width {width} (m_channels {m}): speakerlab's "
                              f"ERes2Net builds only scale 2 and width m_channels/2 (base_width 32)")
    if "fuse_mode12.local_att.0.weight" in upstream and int(upstream["fuse_mode12.local_att.0.weight"].shape[0]) != m:
        raise CheckpointError(f"ERes2Net fusion with {upstream['fuse_mode12.local_att.0.weight'].shape[0]} inner "
                              f"channels for {4 * m}: speakerlab's AFF reduces by 4")
    if "seg_2.weight" in upstream or any(".pool." in k for k in upstream):
        raise CheckpointError("ERes2Net with a second embedding layer or a learnt pooling: only TSTP and one "
                              "embedding layer (speakerlab's defaults) are converted")
    rows, rem = divmod(int(upstream["seg_1.weight"].shape[1]), 2 * 2 * 8 * m)  # mean+std x expansion 2 x 8m ch.
    if rem:
        raise CheckpointError(f"ERes2Net embedding input of {upstream['seg_1.weight'].shape[1]} is not "
                              f"2 x 16 x m_channels ({m}) x frequency rows")
    return {"feat_dim": 8 * rows, "embedding_size": int(upstream["seg_1.weight"].shape[0]), "m_channels": m,
            "num_blocks": blocks}


# ----------------------------------------------------------------------------- CAM++ names

# Ours: xvector is a flat Sequential [tdnn conv, bn-relu, (dense block, bn-relu, transit conv) x n, bn-relu];
# upstream names the same modules (tdnn, block<i>, transit<i>, out_nonlinear) and keeps the embedding in
# xvector.dense. Inside a dense layer: bottleneck.0.0 / .1 / .2.0 are nonlinear1's BN / linear1 / nonlinear2's BN.
_CAM_LAYER = [("bottleneck.0.0.", "nonlinear1.batchnorm."), ("bottleneck.1.", "linear1."),
              ("bottleneck.2.0.", "nonlinear2.batchnorm."), ("cam.local.", "cam_layer.linear_local."),
              ("cam.linear1.", "cam_layer.linear1."), ("cam.linear2.", "cam_layer.linear2.")]


def _campplus_blocks(names: list[str], ours: bool) -> int:
    if ours:
        idx = {int(m.group(1)) for n in names if (m := re.match(r"xvector\.(\d+)\.\d+\.cam\.", n))}
        return len(idx)
    return len({m.group(1) for n in names if (m := re.match(r"xvector\.block(\d+)\.", n))})


def _campplus_name_to_upstream(name: str, n: int) -> str:
    if name.startswith("fcm."):
        return "head." + name[4:]
    if name.startswith("embed_bn."):
        return "xvector.dense.nonlinear.batchnorm." + name[9:]
    if name.startswith("embed."):
        return "xvector.dense.linear." + name[6:]
    m = re.match(r"xvector\.(\d+)\.(.*)$", name)
    if not m:
        return name
    i, rest = int(m.group(1)), m.group(2)
    if i == 0:
        return "xvector.tdnn.linear." + rest
    if i == 1:
        return "xvector.tdnn.nonlinear.batchnorm." + rest[2:]  # "0.<x>": the BN of bn-relu
    if i == 2 + 3 * n:
        return "xvector.out_nonlinear.batchnorm." + rest[2:]
    block, kind = divmod(i - 2, 3)
    if kind == 0:
        layer, inner = rest.split(".", 1)
        for a, b in _CAM_LAYER:
            if inner.startswith(a):
                return f"xvector.block{block + 1}.tdnnd{int(layer) + 1}.{b}{inner[len(a):]}"
        return name
    if kind == 1:
        return f"xvector.transit{block + 1}.nonlinear.batchnorm.{rest[2:]}"
    return f"xvector.transit{block + 1}.linear.{rest}"


def _campplus_name_from_upstream(name: str, n: int) -> str:
    if name.startswith("head."):
        return "fcm." + name[5:]
    for up, ours in (("xvector.dense.nonlinear.batchnorm.", "embed_bn."), ("xvector.dense.linear.", "embed."),
                     ("xvector.tdnn.linear.", "xvector.0."), ("xvector.tdnn.nonlinear.batchnorm.", "xvector.1.0."),
                     ("xvector.out_nonlinear.batchnorm.", f"xvector.{2 + 3 * n}.0.")):
        if name.startswith(up):
            return ours + name[len(up):]
    if m := re.match(r"xvector\.block(\d+)\.tdnnd(\d+)\.(.*)$", name):
        block, layer, inner = int(m.group(1)) - 1, int(m.group(2)) - 1, m.group(3)
        for a, b in _CAM_LAYER:
            if inner.startswith(b):
                return f"xvector.{2 + 3 * block}.{layer}.{a}{inner[len(b):]}"
    if m := re.match(r"xvector\.transit(\d+)\.(nonlinear\.batchnorm|linear)\.(.*)$", name):
        block = int(m.group(1)) - 1
        return (f"xvector.{3 + 3 * block}.0.{m.group(3)}" if m.group(2) != "linear"
                else f"xvector.{4 + 3 * block}.{m.group(3)}")
    return name


def campplus_to_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our CAM++ (a trainer's state dict or the bare encoder's) -> speakerlab's CAMPPlus state dict."""
    enc = encoder_state(state)
    n = _campplus_blocks(list(enc), ours=True)
    return {_campplus_name_to_upstream(k, n): v for k, v in enc.items()}


def campplus_from_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speakerlab's CAMPPlus state dict -> our trainer's names (under `encoder.`)."""
    n = _campplus_blocks(list(state), ours=False)
    return {ENCODER + _campplus_name_from_upstream(k, n): v for k, v in state.items()}


def campplus_upstream_args(upstream: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The `CAMPPlus(**args)` that has exactly these tensors, or CheckpointError naming what it cannot build.

    speakerlab's CAMPPlus fixes the front end (32 channels, two stages of two blocks), the dense blocks (12, 24
    and 16 layers, kernel 3) and the 100-frame segments; it takes feat_dim, embedding_size, growth_rate, bn_size
    and init_channels. Dilations are not visible in the weights: they are upstream's (1, 2, 2) when our model
    config is (checked by the trainer's export)."""
    need = ["head.conv1.weight", "xvector.tdnn.linear.weight", "xvector.dense.linear.weight",
            "xvector.block1.tdnnd1.cam_layer.linear2.weight", "xvector.block1.tdnnd1.linear1.weight"]
    if any(k not in upstream for k in need):
        raise CheckpointError(f"not a CAM++ state dict: {next(k for k in need if k not in upstream)!r} is missing")
    fcm = int(upstream["head.conv1.weight"].shape[0])
    fcm_blocks = [len({k.split(".")[2] for k in upstream if k.startswith(f"head.layer{s}.")}) for s in (1, 2)]
    layers = tuple(len({k.split(".")[2] for k in upstream if k.startswith(f"xvector.block{b}.")})
                   for b in range(1, 1 + _campplus_blocks(list(upstream), ours=False)))
    kernel = int(upstream["xvector.block1.tdnnd1.cam_layer.linear_local.weight"].shape[2])
    if fcm != 32 or fcm_blocks != [2, 2] or layers != (12, 24, 16) or kernel != 3:
        raise CheckpointError(f"CAM++ with a {fcm}-channel front end of {fcm_blocks} blocks and dense blocks of "
                              f"{layers} layers (kernel {kernel}): speakerlab's CAMPPlus builds only 32 channels, "
                              f"[2, 2] blocks and (12, 24, 16) layers of kernel 3")
    growth = int(upstream["xvector.block1.tdnnd1.cam_layer.linear2.weight"].shape[0])
    bottleneck = int(upstream["xvector.block1.tdnnd1.linear1.weight"].shape[0])
    tdnn = upstream["xvector.tdnn.linear.weight"]
    return {"feat_dim": 8 * int(tdnn.shape[1]) // fcm, "embedding_size": int(upstream["xvector.dense.linear.weight"]
                                                                              .shape[0]),
            "growth_rate": growth, "bn_size": bottleneck // growth, "init_channels": int(tdnn.shape[0])}


# ----------------------------------------------------------------------------- per model, for a registry

class Converter:
    """One model's converters: to_upstream / from_upstream rename tensors, upstream_args infers speakerlab's
    constructor arguments from an upstream state dict."""

    def __init__(self, name: str, to_upstream: Callable, from_upstream: Callable, upstream_args: Callable):
        self.name, self.to_upstream, self.from_upstream, self.upstream_args = (name, to_upstream, from_upstream,
                                                                              upstream_args)
        self.upstream_class = UPSTREAM_CLASS[name]


CONVERTERS = {
    "eres2net": Converter("eres2net", eres2net_to_upstream, eres2net_from_upstream, eres2net_upstream_args),
    "campplus": Converter("campplus", campplus_to_upstream, campplus_from_upstream, campplus_upstream_args),
}


def converter(model: str) -> Converter:
    if model not in CONVERTERS:
        raise CheckpointError(f"unknown speaker model {model!r}: one of {', '.join(MODELS)}")
    return CONVERTERS[model]


def head_to_upstream(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Our AAM head -> speakerlab's CosineClassifier state dict ({"weight": [classes, embedding]})."""
    return {"weight": state[HEAD]} if HEAD in state else None


# ----------------------------------------------------------------------------- reading upstream files

def is_experiment_dir(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "models").is_dir()


def experiment_checkpoint(exp_dir: str | Path, epoch: int | None = None) -> Path:
    """The CKPT-* folder of a speakerlab experiment that speakerlab would load: the one of `epoch`, or else the
    most recent (by the unixtime in CKPT.yaml, as its Checkpointer chooses)."""
    import yaml

    found = []
    for d in sorted(Path(exp_dir, "models").glob("CKPT*")):
        meta_file = d / "CKPT.yaml"
        if d.is_dir() and meta_file.is_file():
            meta = yaml.safe_load(meta_file.read_text()) or {}
            found.append((d, meta))
    if not found:
        raise CheckpointError(f"{exp_dir}: a speakerlab experiment folder without models/CKPT-*/CKPT.yaml")
    if epoch is not None:
        for d, meta in found:
            if meta.get("epoch") == epoch:
                return d
        raise CheckpointError(f"{exp_dir}: no checkpoint of epoch {epoch} (it has epochs "
                              f"{sorted(m.get('epoch') for _, m in found if 'epoch' in m)})")
    return max(found, key=lambda dm: float(dm[1].get("unixtime", 0.0)))[0]


def read_upstream(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(embedding model state dict, classifier state dict or None) of a speakerlab file or experiment folder,
    read without unpickling code."""
    p = Path(path)
    if is_experiment_dir(p):
        ck = experiment_checkpoint(p)
        emb = tensors_only(read_weights(ck / "embedding_model.ckpt"), str(ck / "embedding_model.ckpt"))
        cls = ck / "classifier.ckpt"
        return emb, (tensors_only(read_weights(cls), str(cls)) if cls.is_file() else None)
    return tensors_only(read_weights(p), str(p)), None


def looks_like_ours(state: Mapping[str, Any]) -> bool:
    """A state dict in our trainers' names (a ckpt-*.pt's model, or an export of ours), not speakerlab's."""
    return any(k.startswith(ENCODER) for k in state) or ("embed.weight" in state) or ("fcm.conv1.weight" in state)


def is_upstream_checkpoint(path: str | Path) -> bool:
    """Whether --init-from points at speakerlab's weights (a released file or an experiment folder) rather than
    ours (a ckpt-*.pt, a run folder, or our own state dict)."""
    p = Path(path)
    if is_experiment_dir(p):
        return True
    if p.is_dir() or p.name.startswith("ckpt-"):
        return False
    state = read_weights(p)
    if isinstance(state.get("model"), Mapping):
        return False
    return not looks_like_ours(state)


def from_upstream_file(model: str, path: str | Path) -> dict[str, torch.Tensor]:
    """Our trainer's state dict (encoder.* and, from an experiment folder, head.weight) of a speakerlab file."""
    conv = converter(model)
    emb, cls = read_upstream(path)
    try:
        conv.upstream_args(emb)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    ours = conv.from_upstream(emb)
    if cls is not None and "weight" in cls:
        ours[HEAD] = cls["weight"]
    return ours


# ----------------------------------------------------------------------------- writing upstream layouts

def write_embedding_file(upstream: Mapping[str, torch.Tensor], path: str | Path) -> Path:
    """The released-checkpoint layout: the embedding model's plain state dict, torch.save'd (speakerlab reads it
    with torch.load; a `.safetensors` name is refused, since speakerlab cannot read one)."""
    p = Path(path)
    if p.suffix.lower() == ".safetensors":
        raise CheckpointError(f"{p}: speakerlab loads its checkpoints with torch.load; use a .ckpt, .bin or .pt name")
    return write_torch({k: v.detach().cpu().contiguous() for k, v in upstream.items()}, p)


def experiment_config(model: str, args: Mapping[str, Any], epoch: int, num_classes: int | None) -> dict[str, Any]:
    """The config.yaml of an experiment folder: what speakerlab's extract.py builds and which epoch it loads."""
    cfg: dict[str, Any] = {
        "num_epoch": int(epoch),
        "sample_rate": SAMPLE_RATE,
        "fbank_dim": int(args["feat_dim"]),
        "embedding_size": int(args["embedding_size"]),
        "feature_extractor": {"obj": "speakerlab.process.processor.FBank",
                              "args": {"n_mels": int(args["feat_dim"]), "sample_rate": SAMPLE_RATE, "mean_nor": True}},
        "embedding_model": {"obj": UPSTREAM_CLASS[model], "args": dict(args)},
        "epoch_counter": {"obj": "speakerlab.utils.epoch.EpochCounter", "args": {"limit": int(epoch)}},
        "checkpointer": {"obj": "speakerlab.utils.checkpoint.Checkpointer",
                         "args": {"checkpoints_dir": "<exp_dir>/models",
                                  "recoverables": {"embedding_model": "<embedding_model>",
                                                   "classifier": "<classifier>",
                                                   "epoch_counter": "<epoch_counter>"}}},
    }
    if num_classes is not None:
        cfg["num_classes"] = int(num_classes)
        cfg["classifier"] = {"obj": CLASSIFIER_CLASS,
                             "args": {"input_dim": int(args["embedding_size"]), "out_neurons": int(num_classes)}}
    else:
        del cfg["checkpointer"]["args"]["recoverables"]["classifier"]
    return cfg


def write_experiment(exp_dir: str | Path, model: str, upstream: Mapping[str, torch.Tensor],
                     classifier: Mapping[str, torch.Tensor] | None = None, epoch: int = 1,
                     extra_meta: Mapping[str, Any] | None = None) -> Path:
    """A speakerlab experiment folder that its extract.py reads (`--exp_dir`): config.yaml and
    models/CKPT-EPOCH-<epoch>-00/ (CKPT.yaml, embedding_model.ckpt, classifier.ckpt when given, epoch_counter.ckpt).
    An existing checkpoint of that epoch is refused rather than overwritten."""
    import yaml

    args = converter(model).upstream_args(upstream)
    exp = Path(exp_dir)
    ck = exp / "models" / f"CKPT-EPOCH-{int(epoch)}-00"
    if ck.exists():
        raise CheckpointError(f"{ck} exists: export into a new folder (a speakerlab experiment keeps one "
                              f"checkpoint per epoch)")
    ck.mkdir(parents=True)
    num_classes = int(classifier["weight"].shape[0]) if classifier is not None else None
    write_embedding_file(upstream, ck / "embedding_model.ckpt")
    if classifier is not None:
        write_torch(dict(classifier), ck / "classifier.ckpt")
    write_text_atomic(ck / "epoch_counter.ckpt", str(int(epoch)))  # EpochCounter.save: the epoch as text
    meta = {"unixtime": time.time(), "epoch": int(epoch), **dict(extra_meta or {})}
    write_text_atomic(ck / "CKPT.yaml", yaml.safe_dump(meta))  # written last: it marks the folder complete
    config = experiment_config(model, args, epoch, num_classes)
    write_text_atomic(exp / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    return exp


# ----------------------------------------------------------------------------- export of one of our runs

def read_our_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model state dict, facts) of one of our trainer checkpoints (a ckpt-*.pt, or a run folder for its latest);
    facts: step, epoch and the run's model_config.json when it lies beside the checkpoint."""
    import json

    p = run_checkpoint(path, "a checkpoint file")
    state = read_weights(p)
    facts: dict[str, Any] = {"checkpoint": str(p)}
    if isinstance(state.get("model"), Mapping):
        facts.update(step=int(state.get("step", 0)), epoch=int(state.get("epoch", 0)))
        state = state["model"]
    cfg_file = p.parent / "model_config.json"
    if cfg_file.is_file():
        facts["model_config"] = json.loads(cfg_file.read_text())
    state = tensors_only(state, str(p))
    if not looks_like_ours(state):
        raise CheckpointError(f"{p}: not one of our speaker checkpoints (no encoder.* tensors)")
    return state, facts


def export_upstream(model: str, checkpoint: str | Path, out: str | Path, *, layout: str = "experiment",
                    check_config: Callable[[Mapping[str, Any]], None] | None = None,
                    allow_different: bool = False) -> dict[str, Any]:
    """Write one of our checkpoints in speakerlab's layout: an experiment folder (`layout="experiment"`, with the
    AAM head as classifier.ckpt) or the embedding model's plain file (`layout="file"`). Returns what was written,
    with "notes": the ways speakerlab computes otherwise with these weights (RULE_DIFFERENCES), which refuse the
    export unless allow_different.

    check_config(model_config) may refuse a config upstream cannot build from facts the weights do not show
    (CAM++'s dilations and segment length); the run's model_config.json is what it gets."""
    conv = converter(model)
    state, facts = read_our_checkpoint(checkpoint)
    mc = facts.get("model_config")
    if mc is not None:
        if mc.get("model", model) != model:
            raise CheckpointError(f"{facts['checkpoint']} is a {mc.get('model')} run, not {model}")
        if check_config is not None:
            check_config(mc)
    rules = RULE_DIFFERENCES.get(model)
    notes = settle(facts["checkpoint"], rules(mc) if rules else [], allow_different)
    upstream = conv.to_upstream(state)
    args = conv.upstream_args(upstream)
    if layout == "file":
        path = write_embedding_file(upstream, out)
    elif layout == "experiment":
        epoch = int(facts.get("epoch", 0)) + 1  # the epoch the checkpoint was taken in, counted from 1 as upstream
        path = write_experiment(out, model, upstream, head_to_upstream(state), epoch,
                                {"audiopipe_step": facts.get("step", 0)})
    else:
        raise CheckpointError(f"unknown layout {layout!r}: experiment or file")
    return {"path": str(path), "model": model, "args": args, "layout": layout, "tensors": len(upstream),
            "from": facts["checkpoint"], "notes": notes}


def main(argv: list[str] | None = None) -> int:
    """python -m audiopipe.checkpoints.speaker: export one of our runs for speakerlab."""
    p = argparse.ArgumentParser(
        prog="python -m audiopipe.checkpoints.speaker",
        description="Write an ERes2Net or CAM++ run of trainers/train_eres2net.py / train_campplus.py in "
                    "3D-Speaker's layouts: an experiment folder that `speakerlab/bin/extract.py --exp_dir` reads, "
                    "or the embedding model's plain state dict (as the released .ckpt/.bin files).")
    p.add_argument("--model", required=True, choices=MODELS, help="which network the run trained")
    p.add_argument("--checkpoint", required=True, help="a ckpt-*.pt, or a run folder (--out of the trainer) for its "
                                                       "latest")
    p.add_argument("--export-upstream", required=True, metavar="OUT",
                   help="the experiment folder to create (or, with --layout file, the .ckpt/.bin file to write)")
    p.add_argument("--layout", choices=("experiment", "file"), default="experiment",
                   help="experiment folder (config.yaml + models/CKPT-EPOCH-N-00/) or plain state dict file "
                        "(default %(default)s)")
    p.add_argument("--allow-different", action="store_true",
                   help="write a run that speakerlab would compute differently (e.g. another pooling epsilon), "
                        "printing each difference (default: refuse it)")
    a = p.parse_args(argv)
    try:
        res = export_upstream(a.model, a.checkpoint, a.export_upstream, layout=a.layout,
                              check_config=MODEL_CONFIG_CHECKS.get(a.model), allow_different=a.allow_different)
    except CheckpointError as e:
        raise SystemExit(f"export: error: {e}") from None
    print(f"wrote {res['path']} ({res['layout']}, {res['tensors']} tensors of {UPSTREAM_CLASS[a.model]}"
          f"({', '.join(f'{k}={v}' for k, v in res['args'].items())})) from {res['from']}")
    for n in res["notes"]:
        print(f"note: {n}")
    return 0


# ----------------------------------------------------------------------------- model configs upstream can build

def check_campplus_config(mc: Mapping[str, Any]) -> None:
    """Refuse a CAM++ model config whose dilations or segment length differ from speakerlab's fixed ones: the
    weights do not show them, so the export would run another network."""
    fixed = {"block_dilations": [1, 2, 2], "seg_len": 100}
    for k, v in fixed.items():
        got = list(mc[k]) if isinstance(mc.get(k), (list, tuple)) else mc.get(k, v)
        if got != v:
            raise CheckpointError(f"CAM++ config {k}={got}: speakerlab's CAMPPlus has {k}={v}, so its export would "
                                  f"be another network")


MODEL_CONFIG_CHECKS = {"campplus": check_campplus_config}

UPSTREAM_POOL_EPS = 1e-8  # speakerlab's ERes2Net: sqrt(var + 1e-8) in its TSTP pooling


def eres2net_differences(mc: Mapping[str, Any] | None) -> list[Difference]:
    """The pooling epsilon a run recorded (model_config.json) against speakerlab's, which its ERes2Net fixes."""
    if mc is None:
        return [Difference("model_config.json", "missing", "present", "the pooling epsilon the run trained with "
                                                                      "cannot be checked against speakerlab's")]
    eps = mc.get("pool_eps", 1e-7)  # a record without the field is from a trainer whose only epsilon was 1e-7
    if eps == UPSTREAM_POOL_EPS:
        return []
    return [Difference("pool_eps (--pool-eps)", eps, UPSTREAM_POOL_EPS, "speakerlab's pooling takes sqrt(var + "
                       "1e-8), which moves the embeddings of channels with little variance")]


RULE_DIFFERENCES: dict[str, Callable[[Mapping[str, Any] | None], list[Difference]]] = {
    "eres2net": eres2net_differences}


if __name__ == "__main__":
    raise SystemExit(main())
