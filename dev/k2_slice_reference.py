"""Time the numpy reference on the seeded k2_slice model (no weights file) and check its magnitudes.

    .venv/bin/python dev/k2_slice_reference.py [--layout experts] [--seed 0] [--prompt 8] [--decode 8]
        [--tree 16] [--dense fp32|bf16] [--experts layout|bf16] [--out results.npz]

Runs, each timed: the activation statistics of the prompt (hidden RMS after every layer, logit
spread, distinct experts per MoE layer), a prefill of the prompt + ``--decode`` greedy steps, and one
verify of a random ``--tree``-node tree (+ root) after the same prompt. Prints peak RSS and how many
routed experts were generated. ``--out`` saves every reference array (npz) for the engine's checks.
"""

from __future__ import annotations

import argparse
import io
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config import preset  # noqa: E402
from workbench.ddtree.scenarios import (  # noqa: E402
    activation_stats,
    decode_reference,
    random_prompt,
    random_tree,
    tree_verify_reference,
)
from workbench.fileio import write_bytes_atomic  # noqa: E402
from workbench.quant.w16a16 import w16a16  # noqa: E402
from workbench.seeded import LAYOUTS, SeededWeights  # noqa: E402


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20   # Linux: KiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="k2_slice")
    ap.add_argument("--layout", default="experts", choices=LAYOUTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--decode", type=int, default=8)
    ap.add_argument("--tree", type=int, default=16)
    ap.add_argument("--dense", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: the W16A16 reference (dense projections and attention core in bf16)")
    ap.add_argument("--experts", choices=("layout", "bf16"), default="layout",
                    help="bf16: the bf16 layout's experts as W16A16 with bf16 outputs (the engine's BF16 "
                         "experts on grouped GEMMs); layout: as --layout stores them")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    cfg = preset(args.model)
    seeded = SeededWeights(cfg, args.seed, "bf16" if args.experts == "bf16" else args.layout)
    w = seeded
    if args.dense == "bf16" or args.experts == "bf16":
        w = w16a16(cfg, seeded, dense=args.dense == "bf16", experts=args.experts == "bf16")
    prompt = random_prompt(cfg, args.prompt, args.seed)
    print(f"{args.model} layout {args.layout} dense {args.dense} experts {args.experts} seed {args.seed}: "
          f"prompt {prompt.tolist()}")

    t = time.perf_counter()
    st = activation_stats(cfg, w, prompt)
    print(f"stats forward ({args.prompt} tokens, includes generating the dense weights): "
          f"{time.perf_counter() - t:.1f} s, peak RSS {_rss_gib():.2f} GiB")
    print("  hidden RMS after each layer:", " ".join(f"{r:.3f}" for r in st.layer_rms))
    print(f"  last logits: std {st.logit_std:.3f}, range {st.logit_range:.2f}, "
          f"top-2 margin {st.last_margin:.3f}")
    for k in sorted(st.distinct_experts):
        print(f"  layer {k}: {st.distinct_experts[k]} distinct experts over {args.prompt} tokens x "
              f"{cfg.num_experts_per_tok}, top expert on {st.max_expert_share[k]:.0%} of tokens")

    t = time.perf_counter()
    dec = decode_reference(cfg, w, prompt, args.decode)
    print(f"prefill {args.prompt} + {args.decode} decode steps: {time.perf_counter() - t:.1f} s, "
          f"peak RSS {_rss_gib():.2f} GiB")
    print(f"  tokens {dec.tokens.tolist()}")
    print(f"  margins {' '.join(f'{m:.3f}' for m in dec.margins)}")

    parents, tokens = random_tree(cfg, args.tree, args.seed)
    moe_layers = range(cfg.first_k_dense_replace, cfg.num_hidden_layers)
    n_before = {k: len(seeded.generated_experts(k)) for k in moe_layers}
    t = time.perf_counter()
    ver = tree_verify_reference(cfg, w, prompt, parents, tokens)
    print(f"tree verify ({args.tree} nodes + root, after a {args.prompt}-token prefill): "
          f"{time.perf_counter() - t:.1f} s, peak RSS {_rss_gib():.2f} GiB")
    print(f"  parents {parents.tolist()}")
    for k, r in sorted(ver.routes.items()):
        print(f"  layer {k}: the tree touched {np.unique(r).size} distinct experts "
              f"({len(seeded.generated_experts(k))} generated so far, {n_before[k]} before)")
    print(f"  node margins {' '.join(f'{m:.3f}' for m in ver.margins)}")
    print(f"routed experts generated: {sum(len(seeded.generated_experts(k)) for k in n_before)} of "
          f"{cfg.n_moe_layers * cfg.n_routed_experts}; peak RSS {_rss_gib():.2f} GiB")
    if args.out:
        buf = io.BytesIO()
        np.savez(buf, prompt=prompt, dec_tokens=dec.tokens, dec_logits=dec.logits, dec_margins=dec.margins,
                 dec_latents=np.stack([b[:dec.cache.length] for b in dec.cache.layers]),
                 tree_parents=ver.parents, tree_input_ids=ver.input_ids, tree_positions=ver.positions,
                 tree_logits=ver.logits, tree_latents=ver.latents, tree_margins=ver.margins,
                 **{f"tree_routes_{k}": r for k, r in ver.routes.items()})
        write_bytes_atomic(args.out, buf.getvalue())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
