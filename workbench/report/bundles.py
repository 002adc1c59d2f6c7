"""Golden-bundle views for the notebooks: validation against the reference, a rebuild
check, config and tensor summaries, and FP32 vs INT4 goldens side by side."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle, read_bundle
from ..errors import InputError
from ..reference.generate import divergence, greedy_generate
from ..refs import REFS, build_ref, golden_bundle, rebuild_differences

CONFIG_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "first_k_dense_replace",
                 "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                 "n_shared_experts", "num_experts_per_tok", "routed_scaling_factor", "rope_theta",
                 "rope_scaling_type", "rope_factor")


def load(refs_dir: str | Path, names: list[str]) -> dict[str, Bundle]:
    """``workbench.refs.golden_bundle`` (all CRCs checked) for refs_dir/<name>.kdtr, in the given order."""
    return {n: golden_bundle(n, refs_dir) for n in names}


def validate(name: str, b: Bundle) -> dict[str, Any]:
    """Re-run greedy decoding on the bundle's own weights; compare tokens and margins with the golden."""
    g = greedy_generate(b.config, b.weights(), b.prompt, len(b.golden), dtype=np.float32)
    stored = np.asarray(b.margins, dtype=np.float64)
    return {"bundle": name, "file_MB": b.file_bytes / 1e6, "tensors": len(b.tensors),
            "int4_matrices": len(b.int4),
            "golden_tokens": len(b.golden), "golden_reproduced": bool(np.array_equal(g.tokens, b.golden)),
            "max_margin_diff": float(np.abs(g.margins - stored).max()) if stored.size else 0.0,
            "min_margin": float(stored.min()) if stored.size else float("nan"),
            "fp32_noise": float(b.meta.get("fp32_noise", float("nan")))}


def rebuild(name: str, committed: Bundle) -> dict[str, Any]:
    """Rebuild ``name`` with workbench.refs into a temp folder; compare it with the committed bundle.

    Tensors, tokens and config must be identical; margins agree within ``refs.MARGIN_TOL`` (see
    ``refs.rebuild_differences``: float sums differ across CPUs, so bytes may too).
    """
    spec = next((s for s in REFS if s.name == name), None)
    if spec is None:
        raise InputError(f"{name} is not one of workbench.refs ({', '.join(s.name for s in REFS)})")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_ref(spec, Path(tmp))
        fresh = read_bundle(path)
        diffs, worst = rebuild_differences(committed, fresh)
        same_bytes = committed.path is not None and Path(committed.path).read_bytes() == path.read_bytes()
        return {"bundle": name, "reproduced": not diffs, "differences": "; ".join(diffs) or "none",
                "max_margin_diff": worst, "identical_file": same_bytes}


def config_rows(bundles: dict[str, Bundle]) -> list[dict[str, Any]]:
    """One row per config field, one column per bundle."""
    return [{"field": f, **{n: getattr(b.config, f) for n, b in bundles.items()}} for f in CONFIG_FIELDS]


def tensor_group(name: str) -> str:
    """Coarse family of a tensor name (embedding, attention (MLA), norms, dense MLP, router, ...)."""
    parts = name.split(".")
    if parts[0] == "drafter":
        return "drafter"
    if parts[0] in ("embed", "head", "norm"):
        return {"embed": "embedding", "head": "lm head", "norm": "norms"}[parts[0]]
    if parts[-1].endswith("norm") or "norm" in parts[-1]:
        return "norms"
    if "attn" in parts:
        return "attention (MLA)"
    if "experts" in parts:
        return "routed experts"
    if "shared" in parts:
        return "shared experts"
    if parts[-1] in ("gate", "gate_bias"):
        return "router"
    return "dense MLP"


def tensor_rows(name: str, b: Bundle) -> list[dict[str, Any]]:
    """Per tensor family: count, elements, bytes, dtypes (INT4 = packed int32 + float16 scale tensors)."""
    acc: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tensors": 0, "elements": 0, "bytes": 0, "dtypes": set()})
    for e in b.entries:
        if e.name not in b.tensors:
            continue
        row = acc[tensor_group(e.name)]
        row["tensors"] += 1
        row["elements"] += int(np.prod(e.shape))
        row["bytes"] += e.nbytes
        row["dtypes"].add(e.dtype_name)
    return [{"bundle": name, "family": k, **{**v, "dtypes": " ".join(sorted(v["dtypes"]))}}
            for k, v in sorted(acc.items())]


def golden_side_by_side(fp32: Bundle, int4: Bundle) -> tuple[list[dict[str, Any]], int | None]:
    """Rows (step, tokens, margins, same?) for an FP32 bundle and its INT4 twin; and the first divergence."""
    if not np.array_equal(fp32.prompt, int4.prompt):
        raise InputError("the FP32 and INT4 bundles have different prompts")
    a, b = fp32.golden.tolist(), int4.golden.tolist()
    rows = [{"step": i, "fp32_token": a[i], "int4_token": b[i], "same": a[i] == b[i],
             "fp32_margin": float(fp32.margins[i]), "int4_margin": float(int4.margins[i])}
            for i in range(min(len(a), len(b)))]
    return rows, divergence(b, a)


def load_model(spec: dict[str, Any], refs_dir: str | Path) -> tuple[str, Any, dict[str, Any], np.ndarray]:
    """(name, config, FP weights, prompt) from {"bundle": NAME} or {"preset", "overrides", "seed", "name"}.

    A preset model gets seeded random weights (workbench.weights.random_weights) and the golden prompt.
    """
    from ..config import preset
    from ..refs import PROMPT
    from ..weights import random_weights

    if not isinstance(spec, dict) or ("bundle" in spec) == ("preset" in spec):
        raise InputError(f"model spec needs exactly one of 'bundle' or 'preset', got {spec!r}")
    if "bundle" in spec:
        b = load(refs_dir, [spec["bundle"]])[spec["bundle"]]
        return spec.get("name", spec["bundle"]), b.config, b.weights(), np.asarray(b.prompt, dtype=np.int64)
    cfg = preset(spec["preset"]).replace(**spec.get("overrides", {}))
    name = spec.get("name", spec["preset"])
    return name, cfg, random_weights(cfg, int(spec.get("seed", 0))), np.asarray(PROMPT, dtype=np.int64)


def quant_text(meta: dict[str, Any]) -> str:
    """meta["quant"] in words: 'INT4 policy mlp, group size 32, 84 matrices'; 'not quantized' without it."""
    q = meta.get("quant") or {}
    if not q:
        return "not quantized"
    return (f"INT4 policy {q.get('policy', '?')}, group size {q.get('group_size', '?')}, "
            f"{q.get('n_quantized', '?')} matrices")
