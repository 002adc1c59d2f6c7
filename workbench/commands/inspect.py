"""``python -m workbench inspect BUNDLE [--json]``: validate a bundle and summarise it.

Prints the key config fields (one per line), the tensor table (count and bytes by dtype, then every
tensor in file order with dtype, shape and size; ``largest`` in the JSON keeps the five largest), the
INT4 matrices and their group sizes, prompt, golden tokens with their margins (the smallest
marked), where the golden first departs from ``meta["fp32_golden"]`` if present, and provenance.
A bad bundle raises BundleFormatError, which the CLI reports as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

from ..bundle import Bundle, BundleFormatError, read_bundle
from ..cli import existing_file
from ..reference.generate import divergence

_CONFIG_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "first_k_dense_replace",
                "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group", "rope_scaling_type")
_LARGEST = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", type=existing_file, help="path to a .kdtr bundle")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def summarize(b: Bundle) -> dict[str, Any]:
    """Everything ``inspect`` prints, as plain JSON-able values."""
    by_dtype: Counter[str] = Counter()
    count_by_dtype: Counter[str] = Counter()
    rows = [e for e in b.entries if e.name in b.tensors]
    for e in rows:
        by_dtype[e.dtype_name] += e.nbytes
        count_by_dtype[e.dtype_name] += 1
    largest = sorted(rows, key=lambda e: (-e.nbytes, e.name))[:_LARGEST]
    table = [{"name": e.name, "dtype": e.dtype_name, "shape": list(e.shape), "nbytes": e.nbytes}
             for e in rows]
    margins = [float(m) for m in b.margins]
    out: dict[str, Any] = {
        "path": b.path, "format_version": f"{b.version[0]}.{b.version[1]}", "file_bytes": b.file_bytes,
        "config": {k: getattr(b.config, k) for k in _CONFIG_KEYS},
        "tensors": {"count": len(rows), "total_bytes": sum(by_dtype.values()),
                    "bytes_by_dtype": dict(sorted(by_dtype.items())),
                    "count_by_dtype": dict(sorted(count_by_dtype.items())),
                    "largest": [{"name": e.name, "dtype": e.dtype_name, "shape": list(e.shape),
                                 "nbytes": e.nbytes} for e in largest],
                    "table": table},
        "int4": {"matrices": len(b.int4), "group_sizes": sorted({m.group_size for m in b.int4})},
        "prompt": b.prompt.tolist(), "golden": b.golden.tolist(), "margins": margins,
        "min_margin": None, "meta_keys": sorted(b.meta), "provenance": b.provenance,
    }
    if margins:
        i = min(range(len(margins)), key=margins.__getitem__)
        out["min_margin"] = {"step": i, "value": margins[i]}
    if "fp32_golden" in b.meta:
        ref = b.meta["fp32_golden"]
        if not isinstance(ref, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ref):
            raise BundleFormatError("bad_meta", "meta.fp32_golden must be a list of token ids", b.path)
        out["fp32_golden_divergence"] = divergence(out["golden"], ref)
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.3f} MB" if n >= 100_000 else f"{n} B"


def _text(s: dict[str, Any]) -> str:
    c, t = s["config"], s["tensors"]
    lines = [f"bundle      {s['path']}  (KDTR {s['format_version']}, {s['file_bytes']} bytes): valid",
             "config"]
    width = max(map(len, c))
    lines += [f"  {k:<{width}}  {v}" for k, v in c.items()]
    lines.append(f"tensors     {t['count']} tensors, {_mb(t['total_bytes'])}")
    for d, n in t["bytes_by_dtype"].items():
        lines.append(f"  {d:<9} {t['count_by_dtype'][d]:>6} tensors  {_mb(n)}")
    if t["table"]:
        shapes = ["x".join(map(str, e["shape"])) or "scalar" for e in t["table"]]
        nw, sw = max(len(e["name"]) for e in t["table"]), max(map(len, shapes))
        lines.append(f"  {'name':<{nw}}  {'dtype':<9} {'shape':>{sw}}  {'size':>10}")
        lines += [f"  {e['name']:<{nw}}  {e['dtype']:<9} {sh:>{sw}}  {_mb(e['nbytes']):>10}"
                  for e, sh in zip(t["table"], shapes, strict=True)]
    q = s["int4"]
    lines.append(f"int4        {q['matrices']} quantized matrices"
                 + (f", group size {', '.join(map(str, q['group_sizes']))}" if q["matrices"] else ""))
    lines.append(f"prompt      {len(s['prompt'])} tokens: {s['prompt']}")
    lines.append(f"golden      {len(s['golden'])} tokens (step, token, top1-top2 margin):")
    low = s["min_margin"]["step"] if s["min_margin"] else -1
    for i, (tok, m) in enumerate(zip(s["golden"], s["margins"], strict=True)):
        lines.append(f"  {i:>4} {tok:>8} {m:>12.6f}" + ("   <-- min margin" if i == low else ""))
    if "fp32_golden_divergence" in s:
        d = s["fp32_golden_divergence"]
        lines.append("fp32 golden " + ("identical" if d is None else f"first divergence at step {d}"))
    lines.append(f"meta        keys: {', '.join(s['meta_keys']) or '(none)'}")
    lines.append("provenance  " + " ".join(f"{k}={v}" for k, v in sorted(s["provenance"].items())))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    s = summarize(read_bundle(args.bundle))
    sys.stdout.write((json.dumps(s, sort_keys=True) if args.json else _text(s)) + "\n")
    return 0
