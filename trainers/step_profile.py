"""--profile-steps N: where a training step's time goes, written beside the log.

Rank 0 records N optimizer steps after the first log window (the warm-up: first calls, allocator growth,
cuDNN's algorithm search) with torch.profiler, everything the loop does included (the wait for the batch, the
step, the optimizer), then writes to --out:
  - profile.json: per step, the wall time, the kernels the device ran and their summed time, the calls that made
    the host wait for the device, and the ops that took the most device and host time;
  - profile.txt: torch's table of the ops, by device time on a GPU, by host time on a CPU.
A step whose kernels sum to a small share of its wall time is not the model's: the host, a wait or the data
holds it (docs/trainers/core.md#profiling-a-step).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

# CUDA runtime calls that block the host until the device (or a stream, or an event) is done: a read-back
# (.item(), a data-dependent shape), a copy from pageable memory, an explicit synchronize.
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
TOP = 12


class StepProfile:
    """A TrainHook: starts torch.profiler after this process's `start`-th step, stops `steps` steps later and
    writes the summary. It saves no state: a resumed run profiles after its own first window."""

    name = "step_profile"

    def __init__(self, out: Path, steps: int, start: int, device: torch.device):
        self.out, self.steps, self.start, self.device = Path(out), int(steps), int(start), device
        self._prof: torch.profiler.profile | None = None
        self._seen, self._t0, self.done, self.first = 0, 0.0, False, 0

    def on_start(self, model: torch.nn.Module, resumed: bool) -> None:
        pass

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        self._seen += 1  # counted from this process's first step: a resumed run warms up again
        if self._seen == self.start:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=acts)
            self._prof.__enter__()
            self._t0, self.first = time.perf_counter(), step + 1
        elif self._prof is not None and self._seen == self.start + self.steps:
            if self.device.type == "cuda":
                torch.cuda.synchronize()  # the last step's kernels end inside the record
            wall = time.perf_counter() - self._t0
            self._prof.__exit__(None, None, None)
            self._write(self._prof, wall)
            self._prof, self.done = None, True

    def _write(self, prof: torch.profiler.profile, wall_s: float) -> None:
        ops = prof.key_averages()
        cuda = self.device.type == "cuda"
        per = 1.0 / self.steps
        kernels = [k for k in ops if k.device_type == torch.autograd.DeviceType.CUDA]
        host_ops = [k for k in ops if k.device_type == torch.autograd.DeviceType.CPU]

        def top(key: str) -> list[list[Any]]:
            rows = sorted(host_ops, key=lambda k: getattr(k, key), reverse=True)[:TOP]
            return [[k.key, round(getattr(k, key) / 1e3 * per, 3), round(k.count * per, 1)] for k in rows]

        kernel_ms = sum(k.self_device_time_total for k in kernels) / 1e3 * per if cuda else None
        summary = {
            "steps": self.steps, "first_step": self.first, "device": str(self.device),
            "wall_ms": round(wall_s * 1e3 * per, 2),
            "kernels": round(sum(k.count for k in kernels) * per, 1) if cuda else None,
            "kernel_ms": round(kernel_ms, 2) if cuda else None,
            # Kernels of several streams may overlap, so this is an upper bound on the device's busy share.
            "kernel_share": round(kernel_ms / (wall_s * 1e3 * per), 4) if cuda else None,
            "host_waits": round(sum(k.count for k in host_ops if k.key in HOST_WAITS) * per, 1) if cuda else None,
            "ops": round(sum(k.count for k in host_ops if k.key.startswith("aten::")) * per, 1),
            "top_device_ms": top("self_device_time_total") if cuda else None,
            "top_host_ms": top("self_cpu_time_total"),
        }
        (self.out / "profile.json").write_text(json.dumps(summary, indent=1) + "\n")
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        (self.out / "profile.txt").write_text(ops.table(sort_by=sort, row_limit=40) + "\n")
        print(f"[profile] steps {self.first}-{self.first + self.steps - 1}: {summary['wall_ms']} ms a step"
              + (f", kernels {summary['kernel_ms']} ms ({summary['kernel_share']:.0%}), "
                 f"{summary['host_waits']:g} host waits" if cuda else "")
              + f"; {self.out / 'profile.txt'}", flush=True)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
