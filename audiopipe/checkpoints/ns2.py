"""NaturalSpeech 2 weights between audiopipe's trainer (trainers/train_ns2.py) and Amphion's checkpoint folder.

Amphion's trainer saves with `accelerate.save_state` into `.../checkpoint/epoch-E_step-S_loss-L/`, and its
inference (`models/tts/naturalspeech2/ns2_inference.py`) loads `<checkpoint_path>/pytorch_model.bin` into
`NaturalSpeech2(cfg.model)` with a strict `load_state_dict`. Newer accelerate versions write `model.safetensors`
instead; both are read here, and both can be written.

The networks are the same parameter for parameter; only names differ, plus three layouts:
  - Amphion's phone embedding is registered twice (`prior_encoder.enc_emb_tokens` and
    `prior_encoder.encoder.enc_emb_tokens`, one tensor); audiopipe has it once (`phone_emb`);
  - Amphion keeps each Transformer's sinusoid table as a buffer (`position_emb.pe`, [5000, 1, hidden]);
    audiopipe computes positions on the fly, so the tables are dropped on the way in and rebuilt on the way out;
  - Amphion's model holds the frozen EnCodec quantizer (`quantizer.vq.layers.<i>._codebook.*`, 32 layers of
    1024 x 128 at 24 kHz); audiopipe stacks the same tensors (`quantizer.embed` [32, 1024, 128], ...).
`align_proj` (audiopipe's projection for monotonic alignment search) has no Amphion counterpart: it is left out
of an export, and starts as initialised when Amphion weights come in.

Pure state-dict mapping: no model code here, so a checkpoint converts without building either model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from audiopipe.checkpoints.files import (
    CheckpointError, read_weights, run_checkpoint, tensors_only, write_safetensors, write_torch,
)
from audiopipe.checkpoints.rules import Difference, settle

UPSTREAM_FILES = ("model.safetensors", "pytorch_model.bin")  # what accelerate.save_state writes (new, old)
INFERENCE_FILE = "pytorch_model.bin"  # what Amphion's NS2Inference.build_model reads
PE_MAX_LEN = 5000  # Amphion's PositionalEncoding(max_len=5000)
OURS_ONLY = ("align_proj.",)  # audiopipe-only tensors, never exported

# Amphion's phone table (models/tts/naturalspeech2/ns2_dataset.py, get_phone_map): the 84 ARPAbet symbols of
# text/cmudict.py's valid_symbols (alphabetical), then sp, spn, sil, <s>, </s>. Ids are positions; 0 ("AA")
# is also the padding id of its embedding.
_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T",
               "TH", "V", "W", "Y", "Z", "ZH")
AMPHION_PHONES: tuple[str, ...] = tuple(sorted(_CONSONANTS + tuple(v + s for v in _VOWELS
                                                                    for s in ("", "0", "1", "2")))) + (
    "sp", "spn", "sil", "<s>", "</s>")


def amphion_phone_map(vocab: list[str] | tuple[str, ...]) -> list[int]:
    """For each entry of an audiopipe phone vocabulary, its Amphion id, or -1 to drop the token.

    ARPAbet symbols and sil/sp/spn map to themselves; <bos>/<eos> to <s>/</s>; punctuation to sp (Amphion's
    inference, text/g2p.py preprocess_english, reads punctuation as a pause); <unk> to spn (MFA's label for what
    it could not align); the word boundary "|" is dropped (Amphion has none) and <pad> is -1 (padding).
    Raises CheckpointError naming entries that have no Amphion counterpart.
    """
    index = {p: i for i, p in enumerate(AMPHION_PHONES)}
    special = {"<bos>": "<s>", "<eos>": "</s>", "<unk>": "spn", ",": "sp", ".": "sp", "?": "sp", "!": "sp",
               ";": "sp", ":": "sp", "-": "sp"}
    out, unknown = [], []
    for p in vocab:
        if p in ("<pad>", "|"):
            out.append(-1)
        elif p in index or p in special:
            out.append(index[special.get(p, p)])
        else:
            out.append(-1)
            unknown.append(p)
    if unknown:
        raise CheckpointError(f"phones {unknown[:8]} have no entry in Amphion's phone table; shard with ARPAbet "
                              f"phones (the ns2 preset) to use --phone-table amphion")
    return out


# ----------------------------------------------------------------------------- names

def _encoder(ours: str, theirs: str) -> list[tuple[str, str]]:
    return [(f"{ours}.layers.{{i}}.ln1.{{p}}", f"{theirs}.layers.{{i}}.ln_1.{{p}}"),
            (f"{ours}.layers.{{i}}.ln2.{{p}}", f"{theirs}.layers.{{i}}.ln_2.{{p}}"),
            (f"{ours}.layers.{{i}}.attn.{{p}}", f"{theirs}.layers.{{i}}.self_attn.{{p}}"),
            (f"{ours}.layers.{{i}}.ffn1.{{p}}", f"{theirs}.layers.{{i}}.ffn.ffn_1.{{p}}"),
            (f"{ours}.layers.{{i}}.ffn2.{{p}}", f"{theirs}.layers.{{i}}.ffn.ffn_2.{{p}}"),
            (f"{ours}.last_ln.{{p}}", f"{theirs}.last_ln.{{p}}")]


def _predictor(ours: str, theirs: str) -> list[tuple[str, str]]:
    return [(f"{ours}.convs.{{i}}.{{p}}", f"{theirs}.conv.{{i}}.0.{{p}}"),
            (f"{ours}.lns.{{i}}.{{p}}", f"{theirs}.conv.{{i}}.2.{{p}}"),
            (f"{ours}.attns.{{i}}.{{p}}", f"{theirs}.cattn.{{i}}.0.{{p}}"),
            (f"{ours}.attn_lns.{{i}}.{{p}}", f"{theirs}.cattn.{{i}}.1.{{p}}"),
            (f"{ours}.out.{{p}}", f"{theirs}.linear.{{p}}")]


_W, _A = "wavenet", "diffusion.diff_estimator"
# (audiopipe name, Amphion name); {i} is a layer number, {p} the rest. The first pattern that matches wins.
PAIRS: list[tuple[str, str]] = [
    ("prompt_lin.{p}", "prompt_lin.{p}"),
    *_encoder("prompt_encoder", "prompt_encoder"),
    ("query_emb.{p}", "query_emb.{p}"),
    ("query_attn.{p}", "query_attn.{p}"),
    ("phone_emb.{p}", "prior_encoder.enc_emb_tokens.{p}"),
    *_encoder("phone_encoder", "prior_encoder.encoder"),
    *_predictor("duration_predictor", "prior_encoder.duration_predictor"),
    *_predictor("pitch_predictor", "prior_encoder.pitch_predictor"),
    ("pitch_bin_edges", "prior_encoder.pitch_bins"),
    ("pitch_emb.{p}", "prior_encoder.pitch_embedding.{p}"),
    (f"{_W}.in_proj.{{p}}", f"{_A}.in_proj.{{p}}"),
    (f"{_W}.step_mlp.{{i}}.{{p}}", f"{_A}.mlp.{{i}}.{{p}}"),
    (f"{_W}.cond_ln.{{p}}", f"{_A}.cond_ln.{{p}}"),
    (f"{_W}.layers.{{i}}.dilated.{{p}}", f"{_A}.layers.{{i}}.dilated_conv.{{p}}"),
    (f"{_W}.layers.{{i}}.step_proj.{{p}}", f"{_A}.layers.{{i}}.diffusion_proj.{{p}}"),
    (f"{_W}.layers.{{i}}.{{p}}", f"{_A}.layers.{{i}}.{{p}}"),  # cond_proj, out_proj, ln, attn, film: same names
    (f"{_W}.skip_proj.{{p}}", f"{_A}.skip_proj.{{p}}"),
    (f"{_W}.out_proj.{{p}}", f"{_A}.out_proj.{{p}}"),
]
_PE = ("prompt_encoder.position_emb.pe", "prior_encoder.encoder.position_emb.pe")
_EMB_TWIN = "prior_encoder.encoder.enc_emb_tokens.weight"  # the second name of prior_encoder.enc_emb_tokens
_CODEBOOK = re.compile(r"quantizer\.vq\.layers\.(\d+)\._codebook\.(inited|cluster_size|embed|embed_avg)$")
QUANTIZER_PARTS = ("inited", "cluster_size", "embed", "embed_avg")


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>.+)")
    return re.compile(pattern + "$")


_FORWARD = [(_compile(a), b) for a, b in PAIRS]
_BACKWARD = [(_compile(b), a) for a, b in PAIRS]


def _rename(name: str, table: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, target in table:
        m = pattern.match(name)
        if m:
            return target.format(**m.groupdict())
    return None


def upstream_name(name: str) -> str | None:
    """Amphion's name of one of our tensors (None: no counterpart)."""
    return _rename(name, _FORWARD)


# ----------------------------------------------------------------------------- state dicts

def sinusoid_table(hidden: int, max_len: int = PE_MAX_LEN) -> torch.Tensor:
    """[max_len, 1, hidden]: the table Amphion's PositionalEncoding registers (sin on even, cos on odd channels)."""
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, hidden, 2) * (-math.log(10000.0) / hidden))
    pe = torch.zeros(max_len, 1, hidden)
    pe[:, 0, 0::2] = torch.sin(position * div_term)
    pe[:, 0, 1::2] = torch.cos(position * div_term)
    return pe


def to_upstream(ours: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our NS2 state dict -> the state dict Amphion's NaturalSpeech2 loads strictly."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, value in ours.items():
        if name.startswith(OURS_ONLY):
            continue
        if name.startswith("quantizer."):
            part = name.split(".", 1)[1]
            if part not in QUANTIZER_PARTS:
                unknown.append(name)
                continue
            for i in range(value.shape[0]):
                out[f"quantizer.vq.layers.{i}._codebook.{part}"] = value[i].clone()
            continue
        theirs = upstream_name(name)
        if theirs is None:
            unknown.append(name)
            continue
        out[theirs] = value
    if unknown:
        raise CheckpointError(f"{len(unknown)} tensors have no Amphion counterpart (e.g. {unknown[0]!r}): not an "
                              f"audiopipe NS2 state dict")
    for need in ("prompt_encoder.last_ln.weight", "prior_encoder.enc_emb_tokens.weight"):
        if need not in out:
            raise CheckpointError(f"not an audiopipe NS2 state dict: nothing maps to Amphion's {need!r}")
    out[_EMB_TWIN] = out["prior_encoder.enc_emb_tokens.weight"]
    out[_PE[0]] = sinusoid_table(out["prompt_encoder.last_ln.weight"].shape[0])
    out[_PE[1]] = sinusoid_table(out["prior_encoder.enc_emb_tokens.weight"].shape[1])
    return out


def is_upstream_state(state: Mapping[str, Any]) -> bool:
    """True for an Amphion NS2 state dict (by its names)."""
    return any(k.startswith(("prior_encoder.", "diffusion.diff_estimator.")) for k in state)


def from_upstream(theirs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Amphion's NS2 state dict -> ours. Tensors with no counterpart here are passed on under their own names,
    so a partial load reports them as dropped; the sinusoid tables are checked against the formula and left out
    (audiopipe computes positions)."""
    theirs = {k.removeprefix("module."): v for k, v in theirs.items()}  # a DDP-wrapped model saved as it was
    out: dict[str, torch.Tensor] = {}
    books: dict[str, dict[int, torch.Tensor]] = {p: {} for p in QUANTIZER_PARTS}
    for name, value in theirs.items():
        m = _CODEBOOK.match(name)
        if m:
            books[m.group(2)][int(m.group(1))] = value
            continue
        if name in _PE:
            want = sinusoid_table(value.shape[-1], value.shape[0])
            if value.shape != want.shape or not torch.allclose(value.float(), want, atol=1e-6):
                raise CheckpointError(f"{name} is not Amphion's sinusoid table; not a checkpoint of Amphion's NS2")
            continue
        if name == _EMB_TWIN:
            twin = theirs.get("prior_encoder.enc_emb_tokens.weight")
            if twin is None:  # a safetensors file keeps one name of a shared tensor
                out["phone_emb.weight"] = value
            elif not torch.equal(twin, value):
                raise CheckpointError(f"{name} differs from prior_encoder.enc_emb_tokens.weight, which Amphion's "
                                      f"model shares with it: a damaged checkpoint")
            continue
        ours = _rename(name, _BACKWARD)
        out[ours if ours is not None else name] = value
    for part, layers in books.items():
        if layers:
            if sorted(layers) != list(range(len(layers))):
                raise CheckpointError(f"quantizer layers {sorted(layers)} are not 0..{len(layers) - 1}")
            out[f"quantizer.{part}"] = torch.stack([layers[i] for i in range(len(layers))])
    return out


def from_codec(codec_quantizer: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EnCodec's quantizer as transformers names it (`[quantizer.]layers.<i>.codebook.<part>`, what
    audiopipe.features.codec reads from a save_pretrained folder) -> our `quantizer.*` tensors."""
    pat = re.compile(r"(?:quantizer\.)?layers\.(\d+)\.codebook\.(inited|cluster_size|embed|embed_avg)$")
    books: dict[str, dict[int, torch.Tensor]] = {p: {} for p in QUANTIZER_PARTS}
    for name, value in codec_quantizer.items():
        m = pat.match(name)
        if m:
            books[m.group(2)][int(m.group(1))] = value
    n = len(books["embed"])
    if n == 0 or any(sorted(b) != list(range(n)) for b in books.values()):
        raise CheckpointError(f"the codec's quantizer is incomplete: layers {[sorted(b) for b in books.values()]}")
    return {f"quantizer.{p}": torch.stack([books[p][i] for i in range(n)]).float() for p in QUANTIZER_PARTS}


# ----------------------------------------------------------------------------- files

def upstream_file(path: str | Path) -> Path:
    """The weights file of an Amphion checkpoint: the file itself, or the folder's model.safetensors (preferred:
    it holds no code) or pytorch_model.bin."""
    p = Path(path)
    if p.is_dir():
        for name in UPSTREAM_FILES:
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"{p}: no {' or '.join(UPSTREAM_FILES)} in this folder; give Amphion's checkpoint "
                              f"folder (.../checkpoint/epoch-..._step-..._loss-...)")
    return p


def looks_upstream(path: str | Path) -> bool:
    """Whether a --init-from path names an Amphion checkpoint (by its files; nothing is read): a folder holding
    model.safetensors or pytorch_model.bin, or a file of one of those names."""
    p = Path(path)
    if p.is_dir():
        return any((p / n).is_file() for n in UPSTREAM_FILES)
    return p.name in UPSTREAM_FILES


def read_upstream(path: str | Path) -> dict[str, torch.Tensor]:
    """Amphion's NS2 weights from a checkpoint folder or file, as our state dict (read without unpickling code)."""
    f = upstream_file(path)
    state = read_weights(f)
    if isinstance(state.get("model"), Mapping):  # Amphion's get_state_dict() layout: {"model": ..., "step": ...}
        state = dict(state["model"])
    state = tensors_only(state, str(f))
    if not is_upstream_state({k.removeprefix("module."): v for k, v in state.items()}):
        raise CheckpointError(f"{f}: not an Amphion NaturalSpeech2 checkpoint (no prior_encoder / diffusion tensors)")
    return from_upstream(state)


def write_upstream(ours: Mapping[str, torch.Tensor], folder: str | Path, safetensors: bool = False,
                   config: Mapping[str, Any] | None = None) -> Path:
    """Write our weights as Amphion's checkpoint folder: pytorch_model.bin (what its inference loads), and
    model.safetensors too when asked (what newer accelerate's load_state reads). `config`: Amphion's "model"
    section, written as exp_config.json (base_config: Amphion's egs/tts/NaturalSpeech2/exp_config.json)."""
    import json

    from audiopipe.storage.atomic import write_text_atomic

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    theirs = {k: v.detach().to("cpu").contiguous() for k, v in to_upstream(ours).items()}
    write_torch(theirs, out / INFERENCE_FILE)
    if safetensors:
        write_safetensors(theirs, out / "model.safetensors")
    if config is not None:
        doc = {"base_config": "egs/tts/NaturalSpeech2/exp_config.json", "model_type": "NaturalSpeech2",
               "model": dict(config)}
        write_text_atomic(out / "exp_config.json", json.dumps(doc, indent=2) + "\n")
    return out


def upstream_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Amphion's "model" config section for one of our NS2 configs (trainers/train_ns2.py NS2Config as a dict)."""
    enc = {"encoder_hidden": cfg["hidden"], "encoder_head": cfg["heads"], "conv_filter_size": cfg["enc_filter"],
           "conv_kernel_size": cfg["enc_kernel"], "encoder_dropout": cfg["enc_dropout"]}

    def pred(layers: int, kernel: int) -> dict[str, Any]:
        return {"input_size": cfg["hidden"], "filter_size": cfg["hidden"], "kernel_size": kernel,
                "conv_layers": layers, "cross_attn_per_layer": cfg["pred_cross_attn_every"],
                "attn_head": cfg["heads"], "drop_out": cfg["pred_dropout"]}

    return {
        "latent_dim": cfg["latent_dim"],
        "prior_encoder": {"vocab_size": cfg["vocab_size"], "pitch_min": cfg["pitch_min"],
                          "pitch_max": cfg["pitch_max"], "pitch_bins_num": cfg["pitch_bins"],
                          "encoder": {"encoder_layer": cfg["enc_layers"], **enc, "use_cln": True},
                          "duration_predictor": pred(cfg["dur_layers"], cfg["dur_kernel"]),
                          "pitch_predictor": pred(cfg["pitch_layers"], cfg["pitch_kernel"])},
        "diffusion": {"wavenet": {"input_size": cfg["latent_dim"], "hidden_size": cfg["hidden"],
                                  "out_size": cfg["latent_dim"], "num_layers": cfg["wn_layers"],
                                  "cross_attn_per_layer": cfg["wn_cross_attn_every"],
                                  "dilation_cycle": cfg["wn_dilation_cycle"], "attn_head": cfg["heads"],
                                  "drop_out": 0.2},
                      "beta_min": cfg["beta_min"], "beta_max": cfg["beta_max"], "sigma": cfg["sigma"],
                      "noise_factor": cfg["noise_factor"], "ode_solver": "euler", "diffusion_type": "diffusion"},
        "prompt_encoder": {"encoder_layer": cfg["prompt_layers"], **enc, "use_cln": False},
        "query_emb": {"query_token_num": cfg["query_tokens"], "hidden_size": cfg["hidden"],
                      "head_num": cfg["heads"]},
    }


def config_from_upstream(model: Mapping[str, Any]) -> dict[str, Any]:
    """Our NS2Config fields (as a dict, for a --config JSON) from Amphion's "model" config section. Amphion lets
    each part have its own width and heads; audiopipe's config has one of each, so parts that differ are refused."""
    pe, pr, df = model["prior_encoder"], model["prompt_encoder"], model["diffusion"]
    enc, dur, pit, wn, q = pe["encoder"], pe["duration_predictor"], pe["pitch_predictor"], df["wavenet"], model["query_emb"]
    widths = {enc["encoder_hidden"], pr["encoder_hidden"], dur["filter_size"], dur["input_size"], pit["filter_size"],
              pit["input_size"], wn["hidden_size"], q["hidden_size"]}
    heads = {enc["encoder_head"], pr["encoder_head"], dur["attn_head"], pit["attn_head"], wn["attn_head"],
             q["head_num"]}
    same = {(enc[k], pr[k]) for k in ("conv_filter_size", "conv_kernel_size", "encoder_dropout")}
    if len(widths) > 1 or len(heads) > 1 or any(a != b for a, b in same) or \
            dur["cross_attn_per_layer"] != pit["cross_attn_per_layer"] or dur["drop_out"] != pit["drop_out"]:
        raise CheckpointError("this Amphion config gives its parts different widths, heads or FFN sizes; "
                              "audiopipe's NS2 config has one of each")
    return {"latent_dim": model["latent_dim"], "vocab_size": pe["vocab_size"], "hidden": widths.pop(),
            "heads": heads.pop(), "enc_layers": enc["encoder_layer"], "prompt_layers": pr["encoder_layer"],
            "enc_filter": enc["conv_filter_size"], "enc_kernel": enc["conv_kernel_size"],
            "enc_dropout": enc["encoder_dropout"], "dur_layers": dur["conv_layers"], "dur_kernel": dur["kernel_size"],
            "pitch_layers": pit["conv_layers"], "pitch_kernel": pit["kernel_size"],
            "pred_cross_attn_every": dur["cross_attn_per_layer"], "pred_dropout": dur["drop_out"],
            "pitch_min": float(pe["pitch_min"]), "pitch_max": float(pe["pitch_max"]),
            "pitch_bins": pe["pitch_bins_num"], "query_tokens": q["query_token_num"], "wn_layers": wn["num_layers"],
            "wn_cross_attn_every": wn["cross_attn_per_layer"], "wn_dilation_cycle": wn["dilation_cycle"],
            "beta_min": float(df["beta_min"]), "beta_max": float(df["beta_max"]), "sigma": float(df["sigma"]),
            "noise_factor": float(df["noise_factor"])}


def read_run_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """Our NS2 weights from a run: a ckpt-*.pt of trainers/core, or a run folder (its latest ckpt-*.pt).
    Returns (state dict, the checkpoint file)."""
    p = run_checkpoint(path)
    state = read_weights(p)
    if isinstance(state.get("model"), Mapping) and "step" in state:
        state = dict(state["model"])
    return tensors_only(state, str(p)), p


def export_run(src: str | Path, out: str | Path, safetensors: bool = False) -> Path:
    """`audiopipe export-checkpoint` for NS2: our run (folder or ckpt-*.pt) -> Amphion's checkpoint folder. When
    the run folder has the trainer's ns2_config.json, Amphion's model config is written beside the weights."""
    import json

    state, ck = read_run_weights(src)
    cfg_file = ck.parent / "ns2_config.json"
    config = upstream_config(json.loads(cfg_file.read_text())) if cfg_file.is_file() else None
    return write_upstream(state, out, safetensors=safetensors, config=config)


# The rules a run records in ns2_config.json (trainers/train_ns2.py) that change what the weights compute, with
# Amphion's value and what Amphion's inference does otherwise. `ce_labels` only chooses the loss's labels in
# training, so it is not among them.
AMPHION_RULES: tuple[tuple[str, str, Any, str], ...] = (
    ("phone_table", "--phone-table", "amphion", "Amphion's g2p gives ids of its 89-entry table, and none of them "
                                                "means the phone it meant in this run"),
    ("prompt_rule", "--prompt-rule", "phones", "Amphion's inference gives the phone encoder the target's phones "
                                               "only; this run's read the prompt's phones too"),
    ("positions", "--forward (positions)", "batch", "Amphion's Transformers add one sinusoid position per batch "
                                                    "item, this run's one per time step"),
    ("mask_padding", "--forward (padding)", False, "in a batch of unequal lengths, Amphion's convs and style "
                                                   "means read the padded frames this run masked"),
)


def rule_differences(cfg: Mapping[str, Any] | None) -> list[Difference]:
    """How a run's recorded NS2 config (ns2_config.json as a dict; None: not recorded) makes Amphion compute
    something else with its weights. Fields missing from an older record count as the trainer's defaults then
    (frames, audiopipe table, per-time-step positions, masked padding)."""
    if cfg is None:
        return [Difference("ns2_config.json", "missing", "present", "the run's prompt rule, phone table and "
                                                                    "forward cannot be checked against Amphion's")]
    was = {"phone_table": "audiopipe", "prompt_rule": "frames", "positions": "time", "mask_padding": True}
    return [Difference(flag, cfg.get(key, was[key]), want, effect)
            for key, flag, want, effect in AMPHION_RULES if cfg.get(key, was[key]) != want]


def export_cli(source: str | Path, out: str | Path, *, weights: str | None = None, fmt: str = "bin",
               overwrite: bool = False, allow_different: bool = False) -> dict[str, Any]:
    """export_run in `audiopipe export-checkpoint`'s terms. fmt bin: pytorch_model.bin (what Amphion's inference
    loads); both: model.safetensors as well (what newer accelerate's load_state reads). A run whose rules differ
    from Amphion's (rule_differences) is refused unless allow_different; then each difference is a note."""
    import json

    if weights not in (None, "online"):
        raise CheckpointError(f"--weights {weights}: the NS2 trainer keeps no EMA copy; its weights are the online "
                              f"ones")
    target = Path(out)
    if (target / INFERENCE_FILE).exists() and not overwrite:
        raise CheckpointError(f"{target / INFERENCE_FILE} exists; pass --overwrite to replace it")
    _, ck = read_run_weights(source)
    cfg_file = ck.parent / "ns2_config.json"
    differs = settle(str(ck), rule_differences(json.loads(cfg_file.read_text()) if cfg_file.is_file() else None),
                     allow_different)
    folder = export_run(ck, target, safetensors=fmt == "both")
    files = sorted(str(p) for p in folder.iterdir() if p.name in (INFERENCE_FILE, "model.safetensors",
                                                                   "exp_config.json"))
    notes = differs + ([] if (folder / "exp_config.json").is_file() else [
        f"{cfg_file} is missing, so no exp_config.json was written; give Amphion the model config the run "
        f"trained with"])
    return {"files": files, "weights": "online", "source": str(ck), "notes": notes,
            "next": f"cd Amphion && PYTHONPATH=. python bins/tts/inference.py --config {folder}/exp_config.json "
                    f"--checkpoint_path {folder} --mode single --text 'Hello.' --ref_audio prompt.wav "
                    f"--output_dir out"}
