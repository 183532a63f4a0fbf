"""NS2 training steps: audiopipe's trainer against Amphion's own (opt-in: Amphion's source in AUDIOPIPE_AMPHION_SRC).

Amphion is not on the package registry, so, as the NS2 checkpoint oracle does, this runs only where
AUDIOPIPE_AMPHION_SRC names a checkout (tests/skips.py allows that skip). tests/upstream/ns2_steps.py runs
Amphion's NS2Trainer._train_step (its loss terms, AdamW, diffusers' cosine schedule, clipping at 0.5), its
dataset's prompt cut and its collator, from its source, for 3 steps on Amphion's NaturalSpeech2 class, fp32,
deterministic. Our trainer's pieces take the same 3 steps in core.train's order (tests/step_parity.py): the model
at the config's default rules (Amphion's: phones prompt rule, Amphion's phone table and forward), loss_fn on
batches as the loader gives them (the shards' phone ids, MFA durations, word boundaries, through PhoneRemap and
PromptSplit), core's AdamW at the NS2 run defaults, amphion_lr and clip 0.5. Every step's loss terms and the
weights after step 3 equal Amphion's within 1e-5, every step's clipped gradients within 1e-4 of each tensor's
largest entry.

The model is the checkpoint fixture's config at width 16 (every hidden size 16). At the fixture's own width 4
the predictors' layer norms see four features, of which ReLU often leaves one or two: float32 rounding
differences of 1e-7 become gradient differences of 1e-3 relative there, and AdamW turns those into weight
differences of 1.2e-5 by step 3, whichever implementation rounds. At width 16 the 3 steps agree within 1.7e-6.
The width-4 run still checks the rounding path: with scaled_dot_product_attention in place of Amphion's softmax
path in nn.MultiheadAttention, its first step's gradients were 1 % apart on a forward equal within 2.4e-7.

Differences pinned here (docs/trainers/ns2.md says why):
  - the attention keys' bias (the middle third of each in_proj_bias): adding a constant to every key of a query
    leaves its softmax unchanged, so its exact gradient is 0. What either trainer computes there is float32
    rounding (below 3e-7 of the tensor's largest gradient entry); AdamW divides it by its own root mean square
    and moves the bias by up to a step's LR on noise the two trainers do not share. Those entries are checked to
    be noise on both sides and kept apart from the 1e-5 comparison; their weights differ by 1.1e-4 after step 3.
  - the prompt size: Amphion draws it from numpy's global RNG in its dataset; PromptSplit draws it from (seed,
    utterance indices), so --resume draws it again. The replay takes Amphion's draw; ours lies in the same range.
  - the RNG: core reseeds it at every step from (seed, rank, step); the replay restores the state Amphion's
    forward started from, so both draw the same dropout, t and noise.
  - Amphion's train_loop also steps its scheduler once at the end of every epoch (on top of once per step);
    amphion_lr counts optimizer steps only. The 3 steps here are one epoch's; the schedule check below compares
    amphion_lr with diffusers' scheduler stepped once per step.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import core
import train_ns2 as ns2
from audiopipe.checkpoints.load import load_matching
from audiopipe.checkpoints.ns2 import amphion_phone_map, config_from_upstream, from_upstream
from audiopipe.text.en_phones import PHONES
from step_parity import max_gap, replay
from test_checkpoint_ns2 import META, amphion_source, fixture_config
from upstream_oracle import run_upstream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS, LR, WARMUP, TOTAL = 3, 1e-2, 2, 4  # LRs 0 (Amphion's first warmup step), LR / 2, LR
WIDE, NARROW = 16, 4  # the fixture's model at width 16, and at its own width 4 (module docstring)
SCHEDULE = {"lr": 1e-3, "warmup": 5, "total": 20, "steps": 24}
# (phones as the shards hold them, MFA frames per phone): word boundaries "|" hold no frame, punctuation is
# Amphion's "sp", a 0-frame first phone as MFA can give
UTTERANCES = [
    (["HH", "AH0", "L", "OW1", "|", ",", "|", "W", "ER1", "L", "D"], [2, 3, 2, 3, 0, 2, 0, 2, 3, 1, 2]),
    (["sil", "DH", "IH1", "S", "|", "IH1", "Z", "|", "IH0", "T"], [0, 2, 3, 2, 0, 2, 2, 0, 3, 2]),
    (["G", "UH1", "D", "|", "M", "AO1", "R", "N", "IH0", "NG", "."], [1, 3, 2, 0, 2, 3, 1, 2, 2, 2, 3]),
    (["Y", "EH1", "S", "|", "P", "L", "IY1", "Z"], [2, 3, 3, 0, 2, 1, 4, 3]),
    (["S", "IY1", "|", "Y", "UW1", "|", "S", "UW1", "N", "!"], [3, 2, 0, 1, 4, 0, 2, 3, 2, 2]),
]
BATCHES = [[0, 1], [2, 3], [4, 1]]


def step_model(width: int) -> dict:
    """The checkpoint fixture's Amphion config with every hidden size `width` and every FFN filter 2 * width."""
    m = json.loads(json.dumps(META["model"]))
    pe = m["prior_encoder"]
    for enc in (pe["encoder"], m["prompt_encoder"]):
        enc.update(encoder_hidden=width, conv_filter_size=2 * width)
    for pred in (pe["duration_predictor"], pe["pitch_predictor"]):
        pred.update(input_size=width, filter_size=width)
    m["diffusion"]["wavenet"]["hidden_size"] = width
    m["query_emb"]["hidden_size"] = width
    return m


def step_config(width: int) -> ns2.NS2Config:
    return fixture_config(**config_from_upstream(step_model(width)))


def key_bias(name: str, t: torch.Tensor) -> torch.Tensor | None:
    """The attention keys' bias in an in_proj_bias (query, key, value thirds); None for other tensors."""
    if not name.endswith("in_proj_bias"):
        return None
    h = t.numel() // 3
    return t[h:2 * h]


def without_key_bias(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([v[:v.numel() // 3], v[2 * v.numel() // 3:]]) if key_bias(k, v) is not None else v
            for k, v in state.items()}


def utterances() -> list[dict]:
    """Codes, pitch, durations and phones of each utterance: ours as the shards hold them, Amphion's as its
    preprocessing gives them (the same phones in its table, no word boundaries)."""
    g = torch.Generator().manual_seed(11)
    nq, bins = META["codec"]["n_q"], META["codec"]["bins"]
    out = []
    for phones, dur in UTTERANCES:
        t = sum(dur)
        out.append({"code": torch.randint(0, bins, (nq, t), generator=g), "pitch": 80 + 200 * torch.rand(t, generator=g),
                    "phones": phones, "duration": dur})
    return out


def amphion_symbols(phones: list[str], dur: list[int]) -> tuple[list[str], list[int]]:
    table = META["phone_table"]
    lut = amphion_phone_map(PHONES)
    kept = [(table[lut[PHONES.index(p)]], d) for p, d in zip(phones, dur) if lut[PHONES.index(p)] >= 0]
    return [p for p, _ in kept], [d for _, d in kept]


def our_batch(utts: list[dict], indices: list[int]) -> dict:
    """The batch as the loader's collate pads it (shard phone ids, MFA durations), before the batch transform."""
    items = [utts[i] for i in indices]
    b, t, p = len(items), max(u["code"].shape[1] for u in items), max(len(u["phones"]) for u in items)
    lens = torch.tensor([u["code"].shape[1] for u in items])
    plens = torch.tensor([len(u["phones"]) for u in items])
    batch = {"codes": torch.zeros(b, items[0]["code"].shape[0], t, dtype=torch.int16), "f0": torch.zeros(b, t),
             "phones": torch.zeros(b, p, dtype=torch.int16), "durations": torch.zeros(b, p, dtype=torch.int32),
             "codes_lengths": lens, "f0_lengths": lens, "phones_lengths": plens, "durations_lengths": plens,
             "id": [f"u{i}" for i in indices], "index": list(indices)}
    for i, u in enumerate(items):
        batch["codes"][i, :, :lens[i]] = u["code"]
        batch["f0"][i, :lens[i]] = u["pitch"]
        batch["phones"][i, :plens[i]] = torch.tensor([PHONES.index(x) for x in u["phones"]])
        batch["durations"][i, :plens[i]] = torch.tensor(u["duration"])
    for k, n in (("codes", lens), ("f0", lens), ("phones", plens)):
        batch[f"{k}_mask"] = torch.arange(batch[k].shape[-1])[None] < n[:, None]
    return batch


def run_amphion(tmp_path_factory, width: int):
    src = amphion_source(tmp_path_factory)
    d = tmp_path_factory.mktemp("ns2_steps")
    utts = utterances()
    inputs = [{"code": u["code"].tolist(), "pitch": u["pitch"].tolist(),
               **dict(zip(("phones", "duration"), amphion_symbols(u["phones"], u["duration"])))} for u in utts]
    (d / "inputs.json").write_text(json.dumps({"model": step_model(width), "utterances": inputs, "batches": BATCHES,
                                               "lr": LR, "warmup": WARMUP, "total": TOTAL, "schedule": SCHEDULE}))
    run_upstream("ns2_steps.py", src, d, timeout=300)
    return d, utts, width


@pytest.fixture(scope="module")
def amphion_steps(tmp_path_factory):
    return run_amphion(tmp_path_factory, WIDE)


def replayed(d, utts, width: int) -> dict:
    """Our trainer's 3 steps on Amphion's batches, from its initial weights."""
    steps = torch.load(d / "steps.pt", weights_only=True)
    assert len(steps) == STEPS
    cfg = core.RunConfig(**{**ns2.RUN_DEFAULTS, "lr": LR, "warmup_steps": WARMUP, "max_steps": TOTAL})
    mcfg = step_config(width)  # the NS2Config defaults: Amphion's rules
    assert {k: getattr(mcfg, k) for k in ns2.AMPHION_RULES} == ns2.AMPHION_RULES
    model = ns2.NaturalSpeech2(mcfg)
    init = ns2.make_init_reader(None, mcfg.n_codebooks)(str(d / "init"))
    assert load_matching(model, init, ns2.INIT_HINTS).new == ["align_proj.weight", "align_proj.bias"]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    # as trainers/core.train builds the optimizer, and train_ns2.main the batch transform and the schedule
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    transform = ns2.Chain(ns2.PhoneRemap(amphion_phone_map(PHONES)),
                          ns2.PromptSplit(mcfg.prompt_min_frac, mcfg.prompt_max_frac, seed=cfg.seed,
                                          vocab_size=mcfg.vocab_size, rule=mcfg.prompt_rule))
    batches = []
    for s, indices in zip(steps, BATCHES):
        batch = transform(our_batch(utts, indices))
        n = batch["phones_lengths"]  # Amphion's table: the word boundaries are gone
        ours = batch["prompt_phones"]
        assert ((ours >= (n * 0.1).long().clamp(min=1)) & (ours <= (n * 0.5).long().clamp(min=1))).all()
        batch["prompt_phones"] = torch.tensor(s["prompt_phones"])  # the one deliberate difference: Amphion's draw
        first = ns2.prompt_start(batch["durations"][:, 0].long(), batch["prompt_phones"])
        assert first.tolist() == s["prompt_start"]
        batches.append(batch)

    def set_rng(k: int) -> None:
        torch.set_rng_state(steps[k]["torch_rng"])

    terms: list[dict] = []
    grads: list[dict] = []  # what each optimizer step stepped with (after clipping), as Amphion's record
    opt.register_step_pre_hook(lambda *_: grads.append({k: p.grad.detach().clone()
                                                        for k, p in model.named_parameters() if p.grad is not None}))

    def loss_fn(m, batch):
        loss, logs = ns2.loss_fn(m, batch)
        terms.append({k: float(v) for k, v in logs.items()})
        return loss, logs

    losses = replay(model, loss_fn, batches, opt, lambda s: ns2.amphion_lr(s, cfg.lr, cfg.warmup_steps,
                                                                           cfg.max_steps), cfg.clip, (), set_rng)
    assert [ns2.amphion_lr(k, cfg.lr, cfg.warmup_steps, cfg.max_steps) for k in range(STEPS)] == \
        pytest.approx([s["lr"] for s in steps], rel=1e-12, abs=0)
    names = {"pitch": "pitch_loss", "duration": "dur_loss", "x0": "diff_loss_x0", "noise": "diff_loss_noise",
             "ce": "diff_loss_ce"}
    theirs = from_upstream(torch.load(d / "final" / "pytorch_model.bin", weights_only=True))
    online = {k: v.detach() for k, v in model.state_dict().items() if k in theirs}
    assert sorted(online) == sorted(k for k in start if not k.startswith("align_proj."))
    return {"losses": losses, "steps": steps, "terms": [{k: t[k] for k in names} for t in terms],
            "amphion_terms": [{k: s["terms"][v] for k, v in names.items()} for s in steps],
            "align": [t["align"] for t in terms], "online": online, "start": start, "final": theirs,
            "grads": grads, "amphion_grads": [from_upstream(s["grads"]) for s in steps]}


@pytest.fixture(scope="module")
def ours(amphion_steps):
    return replayed(*amphion_steps)


@pytest.fixture(scope="module")
def ours_narrow(tmp_path_factory):
    return replayed(*run_amphion(tmp_path_factory, NARROW))


def test_steps_one_and_two_equal_amphions_trainer(ours):
    """Both steps' loss terms within 1e-5: the cut, the collated batch, the phone table, the forward, the
    RNG draws (dropout, t, noise) and the loss terms; step 1 (LR 0 in Amphion's warmup) leaves the weights as
    they were on both sides, so step 2 sees equal weights."""
    for k in range(2):
        assert ours["terms"][k] == pytest.approx(ours["amphion_terms"][k], abs=1e-5, rel=0), k
        assert ours["align"][k] == 0.0  # MFA durations: no alignment search, no align term
    assert ours["losses"][:2] == pytest.approx([s["loss"] for s in ours["steps"][:2]], abs=1e-5, rel=0)


def test_step_three_and_the_weights_equal_amphions_trainer(ours):
    """Step 3 runs on weights both trainers updated (step 2 at LR / 2): its loss terms, and every weight after
    it, within 1e-5 of Amphion's, the attention keys' bias apart (module docstring)."""
    assert ours["terms"][2] == pytest.approx(ours["amphion_terms"][2], abs=1e-5, rel=0)
    assert ours["losses"] == pytest.approx([s["loss"] for s in ours["steps"]], abs=1e-5, rel=0)
    gap, where = max_gap(without_key_bias(ours["online"]), without_key_bias(ours["final"]))
    assert gap < 1e-5, (where, gap)
    moved = max(((ours["online"][k] - ours["start"][k]).abs().max().item(), k) for k in ours["online"])
    assert moved[0] > 100 * 1e-5, moved  # the steps moved the weights far beyond the tolerance


def gradients_agree(ours: dict, steps: int, tol: float) -> None:
    """The clipped gradients of the first `steps` steps, tensor by tensor, within tol of the tensor's largest
    entry."""
    for k, (mine, theirs) in enumerate(zip(ours["grads"][:steps], ours["amphion_grads"][:steps])):
        assert sorted(theirs) == sorted(n for n in mine if not n.startswith("align_proj.")), k
        for name, g in theirs.items():
            scale = g.abs().max().item()
            assert scale > 0, (k, name)  # every tensor trains here
            gap = (mine[name] - g).abs().max().item()
            assert gap <= tol * scale, (k, name, gap, scale)


def test_every_steps_gradients_equal_amphions(ours):
    """Measured: within 2.3e-5 of a tensor's largest entry at every step."""
    gradients_agree(ours, STEPS, 1e-4)


def test_the_narrow_models_gradients_equal_amphions_on_equal_weights(ours_narrow):
    """At the fixture's width 4, where float32 rounding is amplified most (module docstring), steps 1 and 2 (on
    weights equal on both sides: step 1 has LR 0) within 1e-4 of a tensor's largest entry; measured 1.4e-5. With
    nn.MultiheadAttention's scaled_dot_product_attention path instead of Amphion's softmax path the duration
    predictor's and phone encoder's are 1 % apart, on a forward equal within 2.4e-7."""
    gradients_agree(ours_narrow, 2, 1e-4)


def test_the_attention_key_bias_gradient_is_rounding_on_both_sides(ours):
    """Why the keys' bias is kept apart: its exact gradient is 0, and both trainers' are float32 noise, below 1e-6
    of the same tensor's largest entry; AdamW still moves it (normalised noise), differently on each side."""
    noise = []
    for mine, theirs in zip(ours["grads"], ours["amphion_grads"]):
        for name, g in theirs.items():
            if key_bias(name, g) is not None:
                scale = g.abs().max().item()
                noise += [key_bias(name, g).abs().max().item() / scale,
                          key_bias(name, mine[name]).abs().max().item() / scale]
    assert len(noise) == 2 * STEPS * sum(1 for n in ours["final"] if n.endswith("in_proj_bias"))
    assert max(noise) < 1e-6, max(noise)
    gaps = [(key_bias(n, ours["online"][n]) - key_bias(n, ours["final"][n])).abs().max().item()
            for n in ours["final"] if n.endswith("in_proj_bias")]
    assert 1e-5 < max(gaps) < 5e-4, max(gaps)  # measured 1.1e-4: beyond the tolerance, far below the LR (1e-2)


def test_amphion_schedule_is_diffusers_cosine(amphion_steps):
    """amphion_lr against the scheduler Amphion's trainer builds, over warmup, decay and past the end."""
    d = amphion_steps[0]
    theirs = json.loads((d / "schedule.json").read_text())
    s = SCHEDULE
    ours = [ns2.amphion_lr(k, s["lr"], s["warmup"], s["total"]) for k in range(s["steps"])]
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18)
    assert theirs[0] == 0.0 and max(theirs) == pytest.approx(s["lr"], rel=1e-12) and theirs[s["total"]] == 0.0
    assert theirs[-1] > 0.0  # past its total the cosine rises again, ours too; a run ends at --max-steps, the total


def test_the_default_rules_are_amphions():
    """What a run from scratch records with no rule flags: Amphion's rules, which its export checks against."""
    from audiopipe.checkpoints.ns2 import rule_differences

    for name, cfg in ns2.CONFIGS.items():
        assert rule_differences(dataclasses.asdict(cfg)) == [], name
        assert {k: getattr(cfg, k) for k in ns2.AMPHION_RULES} == ns2.AMPHION_RULES, name
    assert rule_differences(dataclasses.asdict(dataclasses.replace(ns2.CONFIGS["tiny"], **ns2.LEGACY_RULES)))
