"""ScaledAdam, the optimizer GPT-SoVITS trains stage 1 with (icefall's ScaledAdam as GPT-SoVITS ships it in
`AR/modules/optim.py`), written here per parameter and checked step by step against GPT-SoVITS's own class on
identical gradients (tests/test_train_gpt_sovits.py with tests/upstream/gpt_sovits_optim.py).

The update, for a tensor p with more than one element (momentum beta1 kept in one running `delta`):
    second moment  v = beta2 v + (1 - beta2) g^2, divided by 1 - beta2^(t+1) while that is below 0.99
    delta         = beta1 delta - lr (1 - beta1) rms(p) g / (sqrt(v) + eps)        rms(p) >= param_min_rms
    every size_update_period steps, the tensor's overall scale learns from sum(p * g) of those steps, by Adam
    on that scalar (lr x scalar_lr_scale), stopped at param_min_rms and pulled back above param_max_rms;
    rms(p) is refreshed then too
    p += delta
Tensors of one element (the positional `alpha`s) take plain Adam without first-moment bias correction at
lr x scalar_lr_scale, clamped to +-scalar_max.

Clipping: the step's gradient norm, with each tensor's gradient weighted by rms(p), is kept for the last
clipping_update_period steps; every period the threshold becomes clipping_scale x their median, and from then
on a larger norm scales the gradient down. As in GPT-SoVITS's copy, the scaled gradient feeds only the scale
update: the main update reads the unscaled gradient (newer icefall versions scale both). Kept so, since the
checkpoints being fine-tuned were trained that way.

A parameter without a gradient counts as a zero gradient (as upstream stacks zeros for it). No host
synchronisation except once per clipping period (the median).
"""

from __future__ import annotations

from typing import Iterable

import torch


class ScaledAdam(torch.optim.Optimizer):
    def __init__(self, params: Iterable, lr: float = 0.01, betas: tuple[float, float] = (0.9, 0.95),
                 clipping_scale: float | None = 2.0, scalar_lr_scale: float = 0.1, eps: float = 1e-8,
                 param_min_rms: float = 1e-5, param_max_rms: float = 3.0, scalar_max: float = 10.0,
                 size_update_period: int = 4, clipping_update_period: int = 1000):
        # Defaults: GPT-SoVITS's Text2SemanticLightningModule.configure_optimizers (lr 0.01, betas (0.9, 0.95),
        # clipping_scale 2.0, clipping_update_period 1000) over icefall's class defaults for the rest.
        if not 0 < betas[0] <= betas[1] < 1:
            raise ValueError(f"betas must satisfy 0 < beta1 <= beta2 < 1, got {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, clipping_scale=clipping_scale,
                                      scalar_lr_scale=scalar_lr_scale, eps=eps, param_min_rms=param_min_rms,
                                      param_max_rms=param_max_rms, scalar_max=scalar_max,
                                      size_update_period=size_update_period,
                                      clipping_update_period=clipping_update_period))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            if any(g.is_sparse for g in grads):
                raise RuntimeError("ScaledAdam does not support sparse gradients")
            for p in params:
                if "step" not in self.state[p]:
                    self._init_state(group, p, self.state[p])
            clip = self._clipping_scale(group, params, grads)
            for p, g in zip(params, grads):
                self._step_one(group, p, g, self.state[p], clip)
        return loss

    def _init_state(self, group: dict, p: torch.Tensor, state: dict) -> None:
        state["step"] = 0
        state["delta"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
        if p.numel() > 1:
            state["param_rms"] = (p ** 2).mean().sqrt()
            state["scale_exp_avg_sq"] = torch.zeros_like(state["param_rms"])
            state["scale_grads"] = torch.zeros(group["size_update_period"], device=p.device, dtype=p.dtype)

    def _clipping_scale(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]):
        """1.0, or a 0-d tensor <= 1 that scales this step's gradient (the group's clipping state lives in the
        state of its first parameter)."""
        scale = group["clipping_scale"]
        first = self.state[params[0]]
        step = first["step"]
        if scale is None or step == 0:
            return 1.0
        period = group["clipping_update_period"]
        sumsq = torch.zeros((), device=params[0].device, dtype=torch.float32)
        for p, g in zip(params, grads):
            w = g if p.numel() == 1 else g * self.state[p]["param_rms"]
            sumsq = sumsq + (w.float() ** 2).sum()
        norm = sumsq.sqrt()
        if "model_norms" not in first:
            first["model_norms"] = torch.zeros(period, device=norm.device)
            first["num_clipped"] = torch.zeros((), device=norm.device)
        first["model_norms"][step % period] = norm
        if step % period == 0:
            median = first["model_norms"].sort()[0][min(period - 1, (period // 4) * 2)]
            first["model_norm_threshold"] = scale * median
            first["num_clipped"].zero_()
        if step < period:
            return 1.0
        ans = torch.clamp(first["model_norm_threshold"] / (norm + 1e-20), max=1.0)
        first["num_clipped"] += (ans < 1.0).float()
        return ans

    def _step_one(self, group: dict, p: torch.Tensor, grad: torch.Tensor, state: dict, clip) -> None:
        beta1, beta2 = group["betas"]
        eps = group["eps"]
        step = state["step"]
        delta = state["delta"]
        delta.mul_(beta1)
        if p.numel() == 1:
            lr = group["lr"] * group["scalar_lr_scale"]
            v = state["exp_avg_sq"]
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (v / (1 - beta2 ** (step + 1))).sqrt() + eps
            delta.add_(grad / denom, alpha=-lr * (1 - beta1))
            p.clamp_(min=-group["scalar_max"], max=group["scalar_max"])
            p.add_(delta)
            state["step"] = step + 1
            return
        period = group["size_update_period"]
        scaled = grad if isinstance(clip, float) and clip == 1.0 else grad * clip
        state["scale_grads"][step % period] = (p * scaled).sum()
        if step % period == period - 1:
            state["param_rms"].copy_((p ** 2).mean().sqrt())
            if step > 0:
                self._size_update(group, p, state)
        v = state["exp_avg_sq"]
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction2 = 1 - beta2 ** (step + 1)
        if bias_correction2 < 0.99:
            v = v * (1.0 / bias_correction2)
        denom = v.sqrt()
        denom += eps
        alpha = -group["lr"] * (1 - beta1) * state["param_rms"].clamp(min=group["param_min_rms"])
        delta.add_(grad / denom * alpha)
        p.add_(delta)
        state["step"] = step + 1

    def _size_update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        beta1, beta2 = group["betas"]
        size_lr = group["lr"] * group["scalar_lr_scale"]
        scale_grads = state["scale_grads"]
        period = scale_grads.shape[0]
        beta2_corr = beta2 ** period  # the scale is updated once per period: its second moment decays faster
        v = state["scale_exp_avg_sq"]
        v.mul_(beta2_corr).add_((scale_grads ** 2).mean(), alpha=1 - beta2_corr)
        size_step = (state["step"] + 1) // period
        bias_correction2 = 1 - beta2_corr ** size_step
        scale_step = -size_lr * (bias_correction2 ** 0.5) * scale_grads.sum() / (v.sqrt() + group["eps"])
        rms = state["param_rms"]
        scale_step = torch.where(rms < group["param_min_rms"], torch.zeros_like(scale_step), scale_step)
        scale_step = torch.where(rms > group["param_max_rms"], torch.full_like(scale_step, -size_lr * period),
                                 scale_step)
        state["delta"].add_(p * scale_step, alpha=1 - beta1)


def upstream_lr(step: int) -> float:
    """The LR GPT-SoVITS's stage 1 actually trains with. Its WarmupCosineLRSchedule is built with warmup 2000 and
    cosine decay, but its step() pins the LR to 0.002 ("locked"), and it is first called after the first
    optimizer step, which therefore runs at ScaledAdam's own lr 0.01."""
    return 0.01 if step == 0 else 0.002
