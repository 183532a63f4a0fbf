"""`audiopipe export-checkpoint`: write a run of one of audiopipe's trainers as the files its upstream project reads.

    audiopipe export-checkpoint runs/f5 --out exported/ [--model f5tts] [--format safetensors|pt|both]

Each model is one entry of MODELS: where its converters live (imported only when that model is exported). An
entry names three functions in "module:function" form:
  to_upstream(state, **model settings) -> upstream state dict      (audiopipe names -> upstream names)
  from_upstream(state) -> (audiopipe state dict, ...)              (the way back, used by --init-from)
  writer(source, out, *, weights, fmt, overwrite[, allow_different]) -> summary dict  (files written, "notes",
                                                                                     "next")
and the file formats the writer offers (the first is the default). A writer that knows how upstream would compute
otherwise with a run's weights (audiopipe.checkpoints.rules) takes allow_different: without it, it refuses.
"""

from __future__ import annotations

import argparse
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from audiopipe.errors import InvalidValue, NotFound


@dataclass(frozen=True)
class Converter:
    to_upstream: str
    from_upstream: str
    writer: str
    formats: tuple[str, ...]
    upstream: str  # what the files are for, in the help
    rules: bool = False  # the writer compares the run's rules with upstream's (takes allow_different)

    def load(self, which: str) -> Callable[..., Any]:
        module, _, name = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), name)


MODELS: dict[str, Converter] = {
    "f5tts": Converter("audiopipe.checkpoints.f5tts:to_upstream", "audiopipe.checkpoints.f5tts:from_upstream",
                       "audiopipe.checkpoints.f5tts:export_run", ("safetensors", "pt", "both"),
                       "SWivid/F5-TTS (f5-tts_infer-cli, its Trainer)"),
    "eres2net": Converter("audiopipe.checkpoints.speaker:eres2net_to_upstream",
                          "audiopipe.checkpoints.speaker:eres2net_from_upstream",
                          "audiopipe.checkpoints.cli:export_eres2net", ("experiment", "file"),
                          "3D-Speaker speakerlab (bin/extract.py)", rules=True),
    "campplus": Converter("audiopipe.checkpoints.speaker:campplus_to_upstream",
                          "audiopipe.checkpoints.speaker:campplus_from_upstream",
                          "audiopipe.checkpoints.cli:export_campplus", ("experiment", "file"),
                          "3D-Speaker speakerlab (bin/extract.py)"),
    "gpt_sovits": Converter("audiopipe.checkpoints.gpt_sovits:to_upstream",
                            "audiopipe.checkpoints.gpt_sovits:from_upstream",
                            "audiopipe.checkpoints.gpt_sovits:export_run", ("fp16", "fp32"),
                            "RVC-Boss/GPT-SoVITS stage 1 (its WebUI, TTS_infer_pack)"),
    "ns2": Converter("audiopipe.checkpoints.ns2:to_upstream", "audiopipe.checkpoints.ns2:from_upstream",
                     "audiopipe.checkpoints.ns2:export_cli", ("bin", "both"),
                     "open-mmlab/Amphion NaturalSpeech2 (its inference, accelerate load_state)", rules=True),
}


def _export_speaker(model: str, source: Path, out: str | Path, *, weights: str | None, fmt: str,
                    overwrite: bool, allow_different: bool = False) -> dict[str, Any]:
    """audiopipe.checkpoints.speaker's export in this command's terms: an experiment folder at --out, or (format
    file) the embedding model's state dict as --out/embedding_model.ckpt."""
    from audiopipe.checkpoints.files import CheckpointError
    from audiopipe.checkpoints.speaker import MODEL_CONFIG_CHECKS, export_upstream

    if weights == "ema":
        raise CheckpointError(f"{model} keeps no EMA weights; export its weights (no --weights)")
    target = Path(out) / "embedding_model.ckpt" if fmt == "file" else Path(out)
    if target.exists() and not overwrite and (fmt == "file" or any(target.iterdir())):
        raise CheckpointError(f"{target} already exists; pass --overwrite to replace")
    res = export_upstream(model, source, target, layout=fmt, check_config=MODEL_CONFIG_CHECKS.get(model),
                          allow_different=allow_different)
    nxt = (f"torchrun --nproc_per_node=1 speakerlab/bin/extract.py --exp_dir {target} --data wav.scp"
           if fmt == "experiment" else "")
    return {"model": model, "source": res["from"], "weights": "model", "files": [res["path"]], "notes": res["notes"],
            "next": nxt}


def export_eres2net(source: Path, out: str | Path, **kw: Any) -> dict[str, Any]:
    return _export_speaker("eres2net", source, out, **kw)


def export_campplus(source: Path, out: str | Path, **kw: Any) -> dict[str, Any]:
    return _export_speaker("campplus", source, out, **kw)


def _model_of(source: Path) -> str | None:
    """The trainer a run folder (or a checkpoint inside one) came from, as its model_config.json records it."""
    folder = source if source.is_dir() else source.parent
    cfg = folder / "model_config.json"
    if not cfg.is_file():
        # the NS2 trainer records its model config as ns2_config.json
        return "ns2" if (folder / "ns2_config.json").is_file() else None
    try:
        cfg_json = json.loads(cfg.read_text())
    except (ValueError, OSError):
        return None
    # F5 records {"trainer": "f5tts"}; the speaker trainers {"model": "eres2net" | "campplus", ...}
    name = cfg_json.get("trainer") or cfg_json.get("model")
    return name if isinstance(name, str) else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a run of an audiopipe trainer (its folder, for the latest checkpoint, or one\n"
                     "ckpt-*.pt) as the checkpoint files the model's upstream project loads.\n\nmodels:\n"
                     + "\n".join(f"  {k:<10} {c.upstream}; formats {', '.join(c.formats)}" for k, c in MODELS.items())
                     + "\n\nSee docs/trainers/<model>.md for each model's files and the upstream command that "
                       "runs them.")
    p.add_argument("source", help="run folder (its latest ckpt-*.pt) or one ckpt-*.pt; its model_config.json "
                                  "(and vocab.txt) are read beside it")
    p.add_argument("--out", required=True, help="folder to write the upstream files into")
    p.add_argument("--model", choices=sorted(MODELS), default=None,
                   help="which trainer made the run (default: as recorded in its model_config.json)")
    p.add_argument("--format", default=None, help="file format (default: the model's first; f5tts: safetensors, "
                                                  "pt or both; ns2: bin or both)")
    p.add_argument("--weights", choices=("ema", "online"), default=None,
                   help="which weights (default: the EMA copy where the model keeps one, as upstream inference "
                        "reads it; online: the weights as last trained)")
    p.add_argument("--overwrite", action="store_true", help="replace files already in --out")
    p.add_argument("--allow-different", action="store_true",
                   help="write a run that upstream would compute differently (NS2: a prompt rule, phone table or "
                        "forward not Amphion's; ERes2Net: a pooling epsilon not speakerlab's), printing each "
                        "difference (default: refuse it, naming each)")


def run(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if not source.exists():
        raise NotFound(f"{source}: no such run folder or checkpoint")
    model = args.model or _model_of(source)
    if model is None:
        raise InvalidValue(f"{source}: its model_config.json does not say which trainer made it; pass --model "
                           f"({', '.join(sorted(MODELS))})")
    if model not in MODELS:
        raise InvalidValue(f"{source} was made by {model!r}, which has no exporter (have: {', '.join(sorted(MODELS))})")
    conv = MODELS[model]
    fmt = args.format or conv.formats[0]
    if fmt not in conv.formats:
        raise InvalidValue(f"--format {fmt}: {model} exports {', '.join(conv.formats)}")
    writer = conv.load("writer")
    extra = {"allow_different": args.allow_different} if conv.rules else {}
    summary = writer(source, args.out, weights=args.weights, fmt=fmt, overwrite=args.overwrite, **extra)
    step = f" step {summary['step']}" if summary.get("step") is not None else ""
    print(f"exported {model}{step} ({summary.get('weights', 'model')} weights) from {summary.get('source', source)}:")
    for f in summary["files"]:
        print(f"  {f}")
    for n in summary.get("notes", []):
        print(f"note: {n}")
    if summary.get("next"):
        print(f"run it with:\n  {summary['next']}")
    return 0
