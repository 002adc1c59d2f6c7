"""``python -m workbench quantize BUNDLE OUT [--group 32] [--policy mlp|experts]``

Quantizes an FP bundle's MLP weights to INT4 W4A16 (workbench/quant/policy.py), recomputes the
golden tokens and margins with the INT4 reference (float32, as many tokens as the input golden)
and writes OUT atomically. meta keeps the input's meta (drafter config, seed, ...) and adds
``quant`` = {policy, group_size, n_quantized}, ``fp32_golden`` / ``fp32_margins`` (the input's
golden) and an updated ``min_margin``; ``fp32_noise`` (measured on the FP32 model) is dropped.
Untouched tensors are written as stored (bfloat16 stays bfloat16). An already quantized input,
a bad option or a weight the policy cannot quantize is a one-line error, exit code 2.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..cli import UserError, check_out_file, existing_file
from ..quant.int4 import GROUP_SIZES
from ..quant.policy import POLICIES
from . import progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=existing_file, help="FP32 (or bf16) input bundle")
    p.add_argument("out", metavar="OUT", help="output bundle path (written atomically)")
    p.add_argument("--group", type=int, default=32, choices=GROUP_SIZES,
                   help="INT4 group size: input channels sharing one scale")
    p.add_argument("--policy", default="mlp", choices=POLICIES,
                   help="mlp: every MLP/expert projection; experts: routed experts only")


def run(args: argparse.Namespace) -> int:
    from ..bundle import read_bundle, write_bundle
    from ..quant.policy import quantize_weights
    from ..reference.generate import greedy_generate

    check_out_file(args.out)
    b = read_bundle(args.bundle, model=True)
    if b.int4 or "quant" in b.meta:
        raise UserError(f"{args.bundle} is already quantized ({len(b.int4)} INT4 linears); "
                        "quantize an FP bundle")
    cfg = b.config
    progress.status(f"quantize: {args.bundle}, policy {args.policy}, group size {args.group} ...")
    weights, info = quantize_weights(cfg, b.weights(), policy=args.policy, group_size=args.group)
    n = int(b.golden.size)
    if n:
        progress.status(f"quantize: {info['n_quantized']} INT4 linears; INT4 golden, {n} greedy tokens ...")
        res = greedy_generate(cfg, weights, b.prompt, n, dtype=np.float32)
        golden, margins = res.tokens.astype(np.int32), res.margins.astype(np.float32)
    else:
        golden, margins = np.zeros(0, np.int32), np.zeros(0, np.float32)
    meta = {k: v for k, v in b.meta.items() if k != "fp32_noise"}
    meta.update(quant=info, fp32_golden=b.golden.tolist(), fp32_margins=b.margins.tolist())
    if n:
        meta["min_margin"] = float(margins.min())
    tensors = {k: (b.tensors[k] if k in b.tensors else v) for k, v in weights.items()}
    write_bundle(args.out, config=cfg, tensors=tensors, prompt=b.prompt, golden=golden, margins=margins,
                 meta=meta, provenance={"quantized_from": b.provenance})
    first = next((i for i in range(n) if golden[i] != b.golden[i]), None)
    where = "same as the FP32 golden" if first is None else f"departs from the FP32 golden at step {first}"
    print(f"wrote {args.out}: {info['n_quantized']} INT4 linears (policy {info['policy']}, "
          f"G={info['group_size']}); {n} golden tokens, {where}")
    return 0
