"""Optimizer steps as trainers/core.train takes them, on batches an upstream trainer recorded.

The step parity tests (tests/test_step_parity_*.py) run an upstream project's own trainer for a few steps in the
side venv (tests/upstream/), which records each step's batch, the RNG state its forward started from and its
loss. Here our trainer's pieces (model, loss function, optimizer, LR schedule, clip, hooks) take the same steps in
core.train's order: loss, backward, the step's LR on every param group (times its "lr_scale"), clip, optimizer
step, zero_grad, then the hooks with the step count reached. Where core.train reseeds the RNG at each step from
(seed, rank, step), the replay instead restores the state upstream's forward started from (`set_rng`), so both
sides draw the same noise, masks and dropout: that reseeding is the one deliberate difference, and it changes
which draws a step gets, never how the step uses them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def replay(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, dict[str, Any]], tuple[torch.Tensor, Any]],
           batches: Sequence[dict[str, Any]], opt: torch.optim.Optimizer, lr_of: Callable[[int], float],
           clip: float, hooks: Sequence[Any] = (),
           set_rng: Callable[[int], None] | None = None, grad_accum: int = 1,
           groups: Sequence[int] | None = None) -> list[float]:
    """Take the optimizer steps of these batches; returns each batch's loss as core.train adds it to its log (divided
    by grad_accum; before the step).

    With grad_accum > 1 a step sums the gradients of several batches, each loss divided by grad_accum before its
    backward, as core.train does; `groups` says how many batches each step takes (default: grad_accum each), for
    an upstream trainer whose steps are not all the same size."""
    groups = list(groups) if groups is not None else [grad_accum] * (len(batches) // grad_accum)
    assert sum(groups) == len(batches), (groups, len(batches))
    losses = []
    model.train()
    for h in hooks:
        h.on_start(model, False)
    opt.zero_grad(set_to_none=True)
    it = iter(batches)
    for step, n in enumerate(groups):
        if set_rng is not None:
            set_rng(step)
        for _ in range(n):
            loss, _ = loss_fn(model, next(it))
            share = loss / grad_accum
            share.backward()
            losses.append(float(share.detach()))
        lr = lr_of(step)
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for h in hooks:
            h.after_step(step + 1, model)
    return losses


def max_gap(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest |ours - theirs| / max(1, |theirs|) over tensors both have, and where: absolute for values up to
    1, relative above (a BatchNorm's running variance of several hundred holds float32 rounding of ~1e-4); the
    names must agree."""
    assert sorted(ours) == sorted(theirs), sorted(set(ours) ^ set(theirs))
    return max((((ours[k].double() - theirs[k].double()).abs() / theirs[k].double().abs().clamp(min=1)).max().item(), k)
               for k in ours if ours[k].is_floating_point())
