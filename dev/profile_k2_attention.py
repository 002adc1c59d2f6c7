"""Where a k2_slice attention step's time goes, kernel by kernel (GPU only).

    python dev/profile_k2_attention.py [--rows 1,17] [--context 4096] [--dense bf16] [--reps 20]

Builds the dense layer 0 as ``bench k2`` does (``k2_layer.layer``), loads a step of ``--rows``
rows over a ``--context``-row latent cache, and runs the engine's attention part (the norm, the
projections, mla_prep, the attention core, wo) ``--reps`` times eagerly under torch's profiler,
then the stock-torch BF16 MLA on the same shapes; prints each one's kernels by total device time, then
the torch ops that launched device work (a memcpy or a copy kernel named by the op that made it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,17")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--dense", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--top", type=int, default=18)
    a = ap.parse_args()

    import torch

    from kernels_numba.device import head_rows, upload
    from workbench.bench.common import kernel_table
    from workbench.bench.k2_layer import layer
    from workbench.config import preset
    from workbench.ddtree.scenarios import ancestor_inputs, random_tree
    from workbench.engine.buffers import latents_for
    from workbench.engine.layer import LayerRig
    from workbench.torchk2.layer import TorchLayer

    cfg = preset("k2_slice")
    rows = [int(v) for v in a.rows.split(",")]
    max_len = a.context + max(rows)
    rig = LayerRig(cfg, 0, layer(cfg, 0, 0, "int4", a.dense), max(rows), max_len)
    rng = np.random.default_rng(0)
    upload(head_rows(rig.cache, a.context), latents_for(rig.cache, rng.standard_normal((a.context,
                                                                                       cfg.kv_cache_dim))))
    tl = TorchLayer.from_seeded(cfg, 0, 0, max_len=max_len)
    tl.cache[:a.context].normal_()

    def table(fn, title: str) -> None:
        print(f"\n== {title}: per step, device time by kernel ({a.reps} steps)")
        for line in kernel_table(fn, a.reps, a.top, ops=10):
            print(f"   {line}")

    for n in rows:
        parents, _ = random_tree(cfg, n - 1, seed=n)
        vis, pos = ancestor_inputs(parents, a.context)
        rig.load(rng.standard_normal((n, cfg.hidden_size)).astype(np.float32), a.context, pos - a.context,
                 vis.astype(np.uint8))
        attention = rig.parts(n)["attention"]
        table(lambda attention=attention: attention(0), f"engine attention, {a.dense} dense, {n} rows")
        with torch.no_grad():
            x = tl.normed(torch.randn(n, cfg.hidden_size, device="cuda").to(tl.dtype))
            mask, positions = torch.from_numpy(vis).cuda(), torch.from_numpy(pos).cuda()
            table(lambda x=x, m=mask, p=positions: tl.attention(x, m, p, a.context),
                  f"torch bf16 MLA, {n} rows")


if __name__ == "__main__":
    main()
