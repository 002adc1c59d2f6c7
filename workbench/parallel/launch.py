"""Run a function on P processes joined by torch.distributed, bounded in time.

``run_ranks("pkg.module:fn", P, args)`` spawns P fresh interpreters (start method ``spawn``), each of
which sets ``env`` (before anything imports numba: ``NUMBA_ENABLE_CUDASIM=1`` for the simulator),
joins a process group (``MASTER_ADDR=127.0.0.1``, a free port, ``timeout_s`` on every collective),
calls ``fn(rank, world, *args)`` and hands its picklable result back through a file. The parent
returns the results in rank order, or raises ``RankError`` (one line plus the failing rank's
traceback tail) for the rank that failed first, and kills every rank still running at the deadline, so a hung
collective cannot hang the caller. ``NCCL_NVLS_ENABLE=0`` is always set (no NVLink multicast).
Standard library at import: the heavy modules are imported inside the child.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

GRACE_S = 3.0          # after one rank fails, how long the others get to exit before they are killed


class RankError(RuntimeError):
    """A rank failed or the ranks ran past their deadline."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(rank: int, world: int, port: int, backend: str, target: str, args: tuple, env: dict,
           out: str, timeout_s: float) -> None:
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    res: dict = {"ok": False, "error": "did not start"}
    try:
        import datetime
        import importlib

        import torch.distributed as dist
        mod, name = target.split(":")
        fn = getattr(importlib.import_module(mod), name)
        kw = {"timeout": datetime.timedelta(seconds=timeout_s)}
        if backend == "nccl":
            import torch
            torch.cuda.set_device(rank)
            kw["device_id"] = torch.device("cuda", rank)
        dist.init_process_group(backend, rank=rank, world_size=world, **kw)
        res = {"ok": True, "value": fn(rank, world, *args)}
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        res = {"ok": False, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}", "at": time.time()}
    _leave_group()
    sys.stdout.flush()
    sys.stderr.flush()
    tmp = Path(out + ".tmp")
    tmp.write_bytes(pickle.dumps(res))
    os.replace(tmp, out)
    os._exit(0 if res["ok"] else 1)     # no interpreter teardown: a wedged backend thread cannot block exit


def _leave_group() -> None:
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is already decided
        pass


def run_ranks(target: str, world: int, args: tuple = (), *, backend: str = "gloo", timeout_s: float = 120.0,
              env: dict | None = None) -> list:
    """``fn(rank, world, *args)`` on ``world`` processes; their results in rank order (see the module)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise RankError(f"world size must be a positive int, got {world!r}")
    ctx = mp.get_context("spawn")
    port = free_port()
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="ranks_") as tmp:
        outs = [os.path.join(tmp, f"rank{r}.pkl") for r in range(world)]
        procs = [ctx.Process(target=_child, daemon=False, name=f"rank{r}",
                             args=(r, world, port, backend, target, tuple(args), dict(env or {}), outs[r],
                                   timeout_s))
                 for r in range(world)]
        for p in procs:
            p.start()
        failed_at = None
        try:
            while any(p.is_alive() for p in procs):
                now = time.monotonic()
                if failed_at is None and any(p.exitcode not in (None, 0) for p in procs):
                    failed_at = now
                if now > deadline or (failed_at is not None and now - failed_at > GRACE_S):
                    break
                time.sleep(0.05)
        finally:
            alive = [p for p in procs if p.is_alive()]
            for p in alive:
                p.kill()
            for p in procs:
                p.join(5)
        results = []
        for r, p in enumerate(procs):
            if not os.path.exists(outs[r]):
                results.append({"ok": False, "error": f"exit code {p.exitcode}, no result"
                                + (" (killed at the deadline)" if p in alive else "")})
                continue
            with open(outs[r], "rb") as f:
                results.append(pickle.load(f))
    bad = sorted((res.get("at", float("inf")), r, res["error"])
                 for r, res in enumerate(results) if not res["ok"])
    if bad:
        _, r, err = bad[0]                           # the rank that failed first (the others follow it)
        late = " past the deadline" if alive and time.monotonic() > deadline else ""
        raise RankError(f"rank {r} of {world} failed{late}: {err.splitlines()[0]}\n"
                        + "\n".join(err.splitlines()[-12:]))
    return [res["value"] for res in results]
