"""The shared loop: the schedule, a resumed run equals an uninterrupted one, the time plan caps steps."""

import json

import numpy as np
import pytest
import torch

from workbench.train.loop import LoopConfig, adamw, lr_at, run_loop


def test_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 100, 10, 1.0, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    assert lr_at(100, 100, 10, 1.0, 0.1) == pytest.approx(0.1)


def _fit(out, max_steps, minutes=None, stop_after=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = adamw(list(model.named_parameters()), 0.05, 0.0, lambda n, p: True)
    w_true = torch.tensor([[1.0, -2.0, 0.5, 3.0]])
    loop = LoopConfig(max_steps, minutes, 0.3, 0.1, 3, 1.0, 2, 5, 0.0 if stop_after else 1e9)

    def step(i):
        if stop_after is not None and i == stop_after:
            raise KeyboardInterrupt
        g = np.random.default_rng([7, i])
        x = torch.from_numpy(g.standard_normal((16, 4))).float()
        loss = ((model(x) - x @ w_true.T) ** 2).mean()
        loss.backward()
        return {"loss": float(loss.detach())}

    res = run_loop("fit", out, {"m": model}, opt, loop, step,
                   lambda: {"w0": float(model.weight[0, 0].detach())}, progress=False)
    return model, res


def test_resumed_run_equals_an_uninterrupted_run(tmp_path):
    full, res = _fit(tmp_path / "a", 20)
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path / "b", 20, stop_after=12)          # checkpoints every step, dies in step 12
    resumed, res_b = _fit(tmp_path / "b", 20)
    assert res["steps"] == res_b["steps"] == 20
    assert torch.equal(full.weight, resumed.weight) and torch.equal(full.bias, resumed.bias)
    log = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert res["last"]["loss"] < 0.5 * log[0]["loss"]
    assert [r["step"] for r in log if r["event"] == "resume"] == [12]


def test_time_plan_fixes_the_total_within_the_cap(tmp_path):
    _, res = _fit(tmp_path, 60, minutes=1e-9)             # no time left after calibration: stop early
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    plan = [r for r in log if r["event"] == "plan"]
    assert len(plan) == 1 and res["steps"] == plan[0]["total"] == 31
    _, res = _fit(tmp_path / "c", 40, minutes=10.0)        # plenty of time: the cap
    assert res["steps"] == 40


def test_checkpoint_temp_names_are_per_process(tmp_path):
    """Two runs into one folder: another run's in-flight temp file is never overwritten or renamed."""
    from workbench.train.loop import save_checkpoint
    ckpt = tmp_path / "ckpt.pt"
    theirs = tmp_path / ".ckpt.pt.tmp"                        # the fixed name an older writer used
    theirs.write_bytes(b"another run's half-written checkpoint")
    save_checkpoint(ckpt, {"step": 1})
    save_checkpoint(ckpt, {"step": 2})
    assert torch.load(ckpt)["step"] == 2
    assert theirs.read_bytes() == b"another run's half-written checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.pt.tmp", "ckpt.pt"]


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import errno
    import os

    from workbench.train.loop import save_checkpoint
    ckpt = tmp_path / "ckpt.pt"
    save_checkpoint(ckpt, {"step": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left") as e:
        save_checkpoint(ckpt, {"step": 2})
    monkeypatch.undo()
    assert e.value.filename == str(ckpt) and torch.load(ckpt)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
