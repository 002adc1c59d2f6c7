"""Where a k2_slice layer step's time goes, kernel by kernel, and how much of it is idle (GPU only).

    python dev/profile_k2_step.py [--rows 1,17] [--layer 1] [--context 4096] [--dense bf16] [--reps 20]
                                  [--parts attention,moe_block,moe_block_shared_after,layer]
                                  [--switch NAME=0|1 ...]

Builds the layer as ``bench k2`` does (``k2_layer.layer``, INT4 experts), loads a step of ``--rows``
rows over a ``--context``-row latent cache, then:
- the attention part run ``--reps`` times eagerly under torch's profiler, then the stock-torch BF16 MLA
  on the same shapes: each one's kernels by total device time, then the torch ops that launched device
  work (a memcpy or a copy kernel named by the op that made it);
- each of ``--parts`` (``LayerRig.parts``: the MoE block with its shared expert beside the routed
  experts and after them, the whole layer) captured in a CUDA graph and replayed under the profiler
  (``bench.common.graph_profile``): the step's launches, its span, the time some kernel ran (PDL's and
  the second stream's overlap counted once) and the idle rest, then its kernels by device time.
``--switch`` sets kernel-path switches of ``kernels_numba.ops`` first, as ``bench --switch`` does (a
kernel not yet a default: the step's launches and gaps before and after it).
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
    ap.add_argument("--layer", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--dense", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--parts", default="attention,moe_block,moe_block_shared_after,layer")
    ap.add_argument("--workers", type=int, default=16, help="processes repacking the INT4 experts")
    ap.add_argument("--switch", action="append", default=[], metavar="NAME=0|1")
    a = ap.parse_args()
    from workbench.cli import UserError
    from workbench.commands.bench import apply_switches, parse_switches
    try:
        apply_switches(parse_switches(a.switch))
    except UserError as e:
        raise SystemExit(str(e)) from None

    import torch
    from numba import cuda

    from kernels_numba.device import head_rows, upload
    from workbench.bench.common import graph_profile, kernel_table
    from workbench.bench.k2_layer import layer
    from workbench.config import preset
    from workbench.ddtree.scenarios import ancestor_inputs, random_tree
    from workbench.engine.buffers import latents_for
    from workbench.engine.layer import LayerRig
    from workbench.torchk2.layer import TorchLayer

    cfg = preset("k2_slice")
    rows = [int(v) for v in a.rows.split(",")]
    max_len = a.context + max(rows)
    rig = LayerRig(cfg, a.layer, layer(cfg, 0, a.layer, "int4", a.dense, a.workers), max(rows), max_len)
    rng = np.random.default_rng(0)
    upload(head_rows(rig.cache, a.context), latents_for(rig.cache, rng.standard_normal((a.context,
                                                                                       cfg.kv_cache_dim))))
    tl = TorchLayer.from_seeded(cfg, 0, 0, max_len=max_len)
    tl.cache[:a.context].normal_()

    def table(lines, title: str) -> None:
        print(f"\n== {title}")
        for line in lines:
            print(f"   {line}")

    for n in rows:
        parents, _ = random_tree(cfg, n - 1, seed=n)
        vis, pos = ancestor_inputs(parents, a.context)
        rig.load(rng.standard_normal((n, cfg.hidden_size)).astype(np.float32), a.context, pos - a.context,
                 vis.astype(np.uint8))
        rig.step(n)                                   # the FFN input and the router's routing in place
        parts = rig.parts(n, own_routing=True, moe_block=True)
        attention = parts["attention"]
        table(kernel_table(lambda attention=attention: attention(0), a.reps, a.top, ops=10),
              f"engine attention, {a.dense} dense, {n} rows, eager: per step, device time by kernel")
        with torch.no_grad():
            x = tl.normed(torch.randn(n, cfg.hidden_size, device="cuda").to(tl.dtype))
            mask, positions = torch.from_numpy(vis).cuda(), torch.from_numpy(pos).cuda()
            table(kernel_table(lambda x=x, m=mask, p=positions: tl.attention(x, m, p, a.context), a.reps,
                               a.top, ops=10), f"torch bf16 MLA, {n} rows, eager")
        for name in a.parts.split(","):
            if name not in parts:
                print(f"\n== {name}: not a part of layer {a.layer} here ({', '.join(parts)})")
                continue
            def on_capture(fn=parts[name], name=name, n=n):   # the capturing stream: numba's external one
                s = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
                rig.reset(name, n, s)                 # inside the graph: the layer's row copy is a line
                fn(s)                                 # of its table here
            table(graph_profile(on_capture, a.reps, a.top),
                  f"engine {name}, layer {a.layer}, {n} rows, CUDA graph")


if __name__ == "__main__":
    main()
