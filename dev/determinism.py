"""Is a step repeatable bit for bit on the GPU? The K2-depth stand-in's prefill run twice through the
engine (the first layer whose latent rows differ), then one dense and one MoE layer run four times from
the same rows, each intermediate buffer compared with the first run's, in the order the layer writes
them (the first one listed is where a difference enters). Usage (GPU, wheels on PYTHONPATH):

    python dev/determinism.py [--prompt 512] [--sets 2] [--rows 1,17,65,512] [--stream both]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kernels_numba.device import download, head_rows
from workbench.bench.k2_depth import _config
from workbench.config import preset
from workbench.engine.build import RandomSource, build_model
from workbench.engine.layer import LayerRig
from workbench.engine.runtime import Engine

ORDER = ("a1", "qn", "cache", "q", "o", "x", "rids", "rwts", "x16", "y", "h")


def _diff(a: np.ndarray, b: np.ndarray) -> float | None:
    if np.array_equal(a.view(np.uint8), b.view(np.uint8)):
        return None
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def engine_probe(cfg, model, prompt: np.ndarray, reps: int) -> dict:
    p = len(prompt)
    eng = Engine(cfg, None, max_len=p + 8, max_rows=p, model=model)
    first = None
    out = []
    for _ in range(reps):
        eng.prefill(prompt)
        cache = eng.fetch(eng.buf.cache)[:, :p]
        logits = eng.fetch(head_rows(eng.buf.logits, p))[p - 1]
        if first is None:
            first = (cache, logits)
            continue
        layers = [i for i in range(cache.shape[0]) if not np.array_equal(cache[i], first[0][i])]
        out.append({"first_layer": layers[0] if layers else None, "layers": len(layers),
                    "logit_diff": float(np.abs(logits - first[1]).max()),
                    "argmax_equal": int(np.argmax(logits)) == int(np.argmax(first[1]))})
    return {"prompt": p, "repeats": out}


def layer_probe(cfg, model, layer: int, n: int, reps: int, stream) -> dict:
    rig = LayerRig(cfg, layer, model.layers[layer], n, n + 8)
    rng = np.random.default_rng(layer * 1000 + n)
    x = rng.standard_normal((n, cfg.hidden_size)).astype(np.float32)
    vis = np.tril(np.ones((n, n), np.uint8))
    b, sc = rig.buf, rig.scratch
    bufs = {"a1": b.a1, "qn": b.qn, "cache": rig.cache, "q": b.q, "o": b.o, "x": b.x, "rids": sc.rids,
            "rwts": sc.rwts, "x16": sc.x16, "y": sc.y, "h": b.h}
    runs = []
    for _ in range(reps):
        rig.load(x, 0, np.arange(n), vis)
        rig.step(n, stream)
        if stream != 0:
            stream.synchronize()
        rig.sync()
        runs.append({k: download(v) for k, v in bufs.items()})
    found = {}
    for r in runs[1:]:
        for k in ORDER:
            d = _diff(runs[0][k], r[k])
            if d is not None:
                found.setdefault(k, []).append(d)
    first = next((k for k in ORDER if k in found), None)
    return {"layer": layer, "rows": n, "first_differing": first, "differing": found}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--sets", type=int, default=2)
    ap.add_argument("--rows", default="1,17,65,512")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--stream", choices=("default", "own", "both"), default="both")
    ap.add_argument("--out", default=None)
    ap.add_argument("--preset", default="k2_6")
    a = ap.parse_args()
    from kernels_numba import device, ops
    from kernels_numba.sim import sim_speed
    ops.BLAS = ops.BLAS or device.SIMULATED            # a dry run of this script on CPU
    cfg = _config(True)[0] if a.preset == "dry" else preset(a.preset)
    model = build_model(cfg, RandomSource(cfg, 0), sets=a.sets)
    with sim_speed():                                   # the simulator's fast executor (a no-op on a GPU)
        run(a, cfg, model)


def run(a, cfg, model) -> None:
    from numba import cuda
    res: dict = {"engine": None, "layers": []}
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, a.prompt).astype(np.int64)
    res["engine"] = engine_probe(cfg, model, prompt, a.reps)
    print("engine prefill:", json.dumps(res["engine"]), flush=True)
    streams = {"default": [0], "own": [cuda.stream()], "both": [0, cuda.stream()]}[a.stream]
    for s in streams:
        for layer in (0, cfg.first_k_dense_replace):
            for n in (int(v) for v in a.rows.split(",")):
                r = layer_probe(cfg, model, layer, n, a.reps, s)
                r["stream"] = "default" if s == 0 else "own"
                res["layers"].append(r)
                print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
