"""The training loop both recipes share: AdamW with warmup + cosine, clipping, a wall-clock step plan,
resumable checkpoints, JSON-lines logs and a tqdm bar.

Step plan: with a time budget, the first ``CALIBRATE`` steps and one evaluation are timed and the total
is cut to what fits, evaluations included (never above max_steps); the total is fixed from then on and
saved, so a resumed run follows the same schedule. Calibration ends inside the warmup, where the
learning rate does not depend on the total. Batches are drawn from generators seeded by (seed, step),
so a resumed run sees the same batches. Checkpoints are written atomically (temp file + rename); the
log is appended line by line.
"""

from __future__ import annotations

import io
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..fileio import with_path, write_bytes_atomic

CALIBRATE = 30          # steps timed before the plan is fixed (the first 5 are skipped: warm-up of kernels)


def lr_at(step: int, total: int, warmup: int, lr: float, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from lr to lr * min_ratio at ``total``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def adamw(params: list[tuple[str, nn.Parameter]], lr: float, weight_decay: float,
          no_decay: Callable[[str, nn.Parameter], bool]) -> torch.optim.AdamW:
    decay = [p for n, p in params if p.requires_grad and not no_decay(n, p)]
    rest = [p for n, p in params if p.requires_grad and no_decay(n, p)]
    fused = all(p.is_cuda for _, p in params)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=fused or None)


def save_checkpoint(path: Path, obj: dict[str, Any]) -> None:
    """torch.save through a per-process temp name (two runs into one folder never share one), renamed
    onto ``path``; a failed or interrupted save leaves the previous checkpoint and no temp file."""
    buf = io.BytesIO()                  # in memory first: torch.save reports a full disk as a RuntimeError
    torch.save(obj, buf)
    write_bytes_atomic(path, buf.getvalue())


class JsonLog:
    """Append-only JSON lines (one object per event), flushed per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: Any) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        except OSError as e:
            raise with_path(e, self.path) from None


@dataclass
class LoopConfig:
    max_steps: int
    minutes: float | None
    lr: float
    min_lr_ratio: float
    warmup: int
    clip: float
    log_every: int
    eval_every: int
    ckpt_seconds: float


def run_loop(name: str, out: Path, modules: dict[str, nn.Module], opt: torch.optim.Optimizer,
             loop: LoopConfig, step_fn: Callable[[int], dict[str, float]],
             eval_fn: Callable[[], dict[str, Any]], progress: bool = True,
             started: float | None = None) -> dict[str, Any]:
    """Train until the planned total; returns {"steps", "last": last step metrics, "eval": last eval}.

    The time budget counts from ``started`` (a time.time() value; default: now), so a stage's set-up
    (tokenizing, generating) can be inside it.

    step_fn(step) runs forward + backward (gradients left in the parameters) and returns metrics;
    the loop sets the learning rate, clips, steps the optimiser and zeroes the gradients.
    """
    ckpt = out / "ckpt.pt"
    log = JsonLog(out / "log.jsonl")
    step, total, last_eval, last = 0, None, {}, {}
    if ckpt.exists():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        for k, m in modules.items():
            m.load_state_dict(state["modules"][k])
        opt.load_state_dict(state["opt"])
        step, total, last_eval, last = state["step"], state["total"], state["eval"], state["last"]
        log.write(event="resume", name=name, step=step, total=total)
    if loop.minutes is None:
        total = loop.max_steps
    params = [p for g in opt.param_groups for p in g["params"]]

    def save() -> None:
        save_checkpoint(ckpt, {"modules": {k: m.state_dict() for k, m in modules.items()},
                               "opt": opt.state_dict(), "step": step, "total": total, "eval": last_eval,
                               "last": last})

    bar = _bar(name, total or loop.max_steps, step, progress)
    t_start = t_ckpt = time.time()
    t_origin = t_start if started is None else started
    t_calib = None
    while step < (total or loop.max_steps):
        lr = lr_at(step, total or loop.max_steps, loop.warmup, loop.lr, loop.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.time()
        metrics = step_fn(step)
        gnorm = float(torch.nn.utils.clip_grad_norm_(params, loop.clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        last = {**metrics, "lr": lr, "grad_norm": gnorm, "step_s": time.time() - t0}
        if total is None and step == 5:
            t_calib = time.time()
        if total is None and t_calib is not None and step == min(CALIBRATE, loop.max_steps - 1):
            per_step = (time.time() - t_calib) / (step - 5)
            t_eval = time.time()
            last_eval = eval_fn()                  # timed: the plan leaves room for the evaluations
            per_eval = time.time() - t_eval
            log.write(event="eval", name=name, step=step, **last_eval)
            left = loop.minutes * 60 - (time.time() - t_origin)
            fit = int(left / (per_step + per_eval / loop.eval_every))
            total = max(step + 1, min(loop.max_steps, step + fit))
            log.write(event="plan", name=name, step=step, total=total, sec_per_step=per_step,
                      sec_per_eval=per_eval)
            bar.total = total
            bar.refresh()
        if step % loop.log_every == 0 or step == total or step == 1:
            log.write(event="step", name=name, step=step, elapsed_s=time.time() - t_start, **last)
        bar.update(1)
        bar.set_postfix(loss=f"{last.get('loss', float('nan')):.3f}", refresh=False)
        if step % loop.eval_every == 0 or step == total:
            last_eval = eval_fn()
            log.write(event="eval", name=name, step=step, **last_eval)
        if time.time() - t_ckpt > loop.ckpt_seconds:
            save()
            t_ckpt = time.time()
    bar.close()
    save()
    log.write(event="done", name=name, step=step, total=total, elapsed_s=time.time() - t_start)
    return {"steps": step, "last": last, "eval": last_eval}


def _bar(name: str, total: int, initial: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=name, file=sys.stderr, ascii=True, ncols=100,
                disable=not enabled, mininterval=2.0)
