"""Where a model built from random weights on the device parts from the reference on its own downloaded
weights, layer by layer: the GPU-tier case `tests/engine/test_build.py::
test_random_source_matches_reference_on_its_downloaded_weights` (its config, seed and prompt), whose second
token differed on the H200 at e5fd01e (its output there: reports/bench/gpu_tier_int4_430af85a5fd4.log).

    python dev/probe_random_source.py      # on a GPU (NUMBA_ENABLE_CUDASIM=1: the same under the simulator)

The prompt and the reference's first token go through one prefill on both sides; every layer's output
is tapped on the engine and captured on the reference. Prints, per layer, the largest relative
difference over the rows and at the last row, and at each MoE layer the reference's gap between its
K-th and (K+1)-th selection scores at the last row and over all rows (a routing near-tie when small).
A weights mismatch shows from layer 0; a near-tie as a jump at one MoE layer with a small gap there.
Then the test's own path (the prompt's prefill, then one-row steps) against the reference's generation
step by step, the reference's one forward against its own generation (a near-tie the reference itself
resolves two ways shows here), and the engine's prefill against both.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels_numba import ops  # noqa: E402
from kernels_numba.device import head_rows  # noqa: E402
from workbench.config import preset  # noqa: E402
from workbench.engine.build import Cycled, RandomSource, build_model, model_weights  # noqa: E402
from workbench.engine.runtime import Engine  # noqa: E402
from workbench.reference.generate import greedy_generate  # noqa: E402
from workbench.reference.layers import sigmoid  # noqa: E402
from workbench.reference.model import LatentCache, forward  # noqa: E402

CFG = dataclasses.replace(preset("tiny2"), moe_intermediate_size=64, num_hidden_layers=5,
                          first_k_dense_replace=1)
SETS, SEED = 2, 6
PROMPT = np.array([300, 7, 77, 123, 9, 10], np.int64)


def _gaps_of_moe_gate(gaps: list) -> None:
    """Record, per call of the reference router (one per MoE layer, in order), the gap between each row's
    K-th and (K+1)-th selection scores."""
    from workbench.reference import moe
    gate = moe.moe_gate

    def recording(cfg, x, gate_w, bias):
        sel = sigmoid(x.astype(np.float64) @ np.asarray(gate_w, np.float64).T) + np.asarray(bias, np.float64)
        top = -np.sort(-sel, axis=-1)
        gaps.append(top[:, cfg.num_experts_per_tok - 1] - top[:, cfg.num_experts_per_tok])   # [S]
        return gate(cfg, x, gate_w, bias)
    moe.moe_gate = recording


def main() -> None:
    ops.BLAS = True
    model = build_model(CFG, RandomSource(CFG, seed=SEED), sets=SETS)
    w = Cycled(CFG, model_weights(model, SETS), SETS)
    seq = np.concatenate([PROMPT, greedy_generate(CFG, w, PROMPT, 1).tokens[:1]])
    layers = range(CFG.num_hidden_layers)
    gaps: list = []
    _gaps_of_moe_gate(gaps)
    ref = forward(CFG, w, seq, LatentCache.empty(CFG, len(seq) + 1), capture=layers)
    eng = Engine(CFG, None, max_len=len(seq) + 2, max_rows=len(seq), taps=tuple(layers), model=model)
    with ops.sim_speed():
        eng.prefill(seq)
    feats = eng.fetch(eng.buf.feats)[:, :len(seq)].astype(np.float64)        # [L, S, D]
    moe_layers = sorted(ref.routes)
    print(f"rows {len(seq)} (prompt + the reference's first token {seq[-1]})")
    for i in layers:
        want = ref.hidden[i].astype(np.float64)                              # [S, D]
        rel = np.linalg.norm(feats[i] - want, axis=1) / np.linalg.norm(want, axis=1)
        line = f"layer {i}: max rel diff {rel.max():.2e}, last row {rel[-1]:.2e}"
        if i in ref.routes:
            g = gaps[moe_layers.index(i)]
            line += f"; reference selection gap (K-th - (K+1)-th): last row {g[-1]:.2e}, least {g.min():.2e}"
        print(line)
    # the test's own path: the prompt's prefill, then one-row steps, against the reference's generation
    from workbench.engine.ar import engine_ar_generate
    gen = engine_ar_generate(Engine(CFG, None, max_len=len(PROMPT) + 4, max_rows=len(PROMPT), model=model),
                             PROMPT, 3, return_logits=True)
    want = greedy_generate(CFG, w, PROMPT, 3)
    for k in range(3):
        print(f"step {k}: engine token {gen.tokens[k]}, reference {want.tokens[k]}, logit error "
              f"{np.abs(gen.logits[k] - want.logits[k]).max():.3e}")
    print(f"reference forward over the {len(seq)} rows vs its generation's step 1: logit error "
          f"{np.abs(ref.logits[-1] - want.logits[1]).max():.3e}")
    eng.prefill(seq)
    last = eng.fetch(head_rows(eng.buf.logits, len(seq)))[-1]
    print(f"engine prefill over the {len(seq)} rows, last row: logit error "
          f"{np.abs(last - ref.logits[-1]).max():.3e} against the reference's forward, "
          f"{np.abs(last - gen.logits[1]).max():.3e} against its own step 1")


if __name__ == "__main__":
    main()
