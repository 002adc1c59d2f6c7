"""The whole seeded k2_slice on the engine against the numpy reference (GPU only).

    python dev/k2_slice_engine.py [--seed 0] [--prompt 8] [--decode 8] [--tree 16] [--dense fp32|bf16]
        [--experts int4|bf16]
        [--workers 16] [--ref results.npz] [--out k2_slice_engine.json]

Builds the engine's model the way ``bench k2`` builds each layer (``engine.build.SeededSource``:
INT4 experts repacked on ``--workers`` processes; dense projections FP32 or W16A16), then runs the
engine's scenarios (``engine.scenarios``): a prefill + ``--decode`` greedy steps with every step's
logits, and one verify of a random ``--tree``-node tree + root with every node's logits and the
latent rows it appended. The reference side is ``dev/k2_slice_reference.py`` (a few minutes of
numpy), run in a child process on the CPU while the engine is built and run, unless ``--ref`` names
the npz it saved for the same seed, prompt, tree and layout. Prints and writes per step / node: the
largest logit difference, the reference's top-2 margin, whether the greedy tokens agree; and the
latent rows' relative error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--tree", type=int, default=16)
    ap.add_argument("--dense", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--experts", choices=("int4", "bf16"), default="int4",
                    help="bf16: the bf16 layout's experts on grouped GEMMs (the BLAS path)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--ref", help="npz of dev/k2_slice_reference.py --out (same seed, prompt, tree, layout); "
                    "'none': no comparison (with --save)")
    ap.add_argument("--save", help="write the engine's outputs to SAVE.decode.npz and SAVE.verify.npz")
    ap.add_argument("--engine", help="compare the outputs --save wrote (no GPU; skips the engine run)")
    ap.add_argument("--out", default="k2_slice_engine.json")
    a = ap.parse_args()
    if a.ref == "none" and not a.save:
        ap.error("--ref none compares nothing: give --save to keep the engine's outputs")

    from workbench.config import preset
    from workbench.ddtree.scenarios import random_prompt, random_tree
    from workbench.engine.build import SeededSource, build_model
    from workbench.engine.runtime import Engine
    from workbench.engine.scenarios import engine_decode, engine_tree_verify

    cfg = preset("k2_slice")
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)

    prompt = random_prompt(cfg, a.prompt, a.seed)
    parents, node_tokens = random_tree(cfg, a.tree, a.seed)
    child, ref_log = None, Path(a.out).with_suffix(".ref.log")
    if not a.ref:
        a.ref = str(Path(a.out).with_suffix(".ref.npz"))
        with open(ref_log, "w") as f:
            child = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("k2_slice_reference.py")),
                 "--seed", str(a.seed), "--prompt", str(a.prompt), "--decode", str(a.decode),
                 "--tree", str(a.tree), "--dense", a.dense, "--out", a.ref,
                 "--experts", "bf16" if a.experts == "bf16" else "layout"],
                stdout=f, stderr=subprocess.STDOUT)
    if a.engine:
        dec, ver = np.load(f"{a.engine}.decode.npz"), np.load(f"{a.engine}.verify.npz")
        tokens, logits = dec["tokens"], dec["logits"]
        got_logits, got_latents = ver["logits"], ver["latents"]
    else:
        model = build_model(cfg, SeededSource(cfg, a.seed, a.dense, a.experts, a.workers))
        eng = Engine(cfg, None, max_len=a.prompt + max(a.decode, a.tree) + 4,
                     max_rows=max(a.prompt, a.tree + 1), model=model)
        log(f"engine built (dense {a.dense}, experts {a.experts})")
        tokens, logits = engine_decode(eng, prompt, a.decode)
        got = engine_tree_verify(eng, prompt, parents, node_tokens)
        got_logits, got_latents = got.logits, got.latents
        log("engine decode and verify done")
    if a.save:                                      # two files: each comes back from a device under 16 MiB
        np.savez(f"{a.save}.decode.npz", tokens=tokens, logits=logits)
        np.savez(f"{a.save}.verify.npz", logits=got_logits, latents=got_latents)
        log(f"wrote {a.save}.decode.npz / .verify.npz")
    if a.ref == "none":
        return
    if child is not None:
        if child.wait() != 0:
            raise SystemExit(f"the reference failed (rc {child.returncode}): see {ref_log}")
        log("reference done")
    z = np.load(a.ref)
    if not np.array_equal(z["prompt"], prompt) or not np.array_equal(z["tree_parents"], parents):
        raise SystemExit(f"{a.ref} holds another prompt or tree than --seed/--prompt/--tree make")
    ref_tokens, ref_logits, ref_margins = z["dec_tokens"], z["dec_logits"], z["dec_margins"]
    v_logits, v_latents, v_margins = z["tree_logits"], z["tree_latents"], z["tree_margins"]
    d_err = np.abs(logits - ref_logits).max(axis=1)
    v_err = np.abs(got_logits - v_logits).max(axis=1)
    lat = (np.linalg.norm(got_latents - v_latents, axis=-1)
           / np.maximum(np.linalg.norm(v_latents, axis=-1), 1e-30))
    res = {
        "seed": a.seed, "prompt": prompt.tolist(), "dense": a.dense, "experts": a.experts,
        "tree_nodes": a.tree,
        "decode": [{"step": i, "max_abs_logit_err": float(d_err[i]), "ref_margin": float(ref_margins[i]),
                    "engine_token": int(tokens[i]), "ref_token": int(ref_tokens[i])}
                   for i in range(len(d_err))],
        "verify": [{"node": i, "max_abs_logit_err": float(v_err[i]), "ref_margin": float(v_margins[i]),
                    "argmax_equal": bool(got_logits[i].argmax() == v_logits[i].argmax())}
                   for i in range(len(v_err))],
        "latent_rel_err_max": float(lat.max()),
        "ref_logit_abs_max": float(np.abs(ref_logits).max()),
        "elapsed_s": None if a.engine else round(time.perf_counter() - t0, 1),   # None: compared only
    }
    for r in res["decode"]:
        print(f"decode step {r['step']}: |dlogit| {r['max_abs_logit_err']:.2e}, "
              f"margin {r['ref_margin']:.3f}, tokens {r['engine_token']} / {r['ref_token']}")
    print(f"verify: |dlogit| max {v_err.max():.2e} (median {np.median(v_err):.2e}); argmax equal on "
          f"{sum(r['argmax_equal'] for r in res['verify'])}/{len(v_err)} nodes (margins min "
          f"{v_margins.min():.3f}); latent rows rel. err max {lat.max():.2e}")
    Path(a.out).write_text(json.dumps(res, indent=1))
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
