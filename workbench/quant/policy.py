"""Which linears become INT4, as an offline transform of a weights dict.

Policies (names as in docs/conventions.md):
- ``mlp``:     every MLP projection: dense ``layers.{i}.ffn.w{1,2,3}``, routed experts
               ``layers.{i}.ffn.experts.{e}.w{1,2,3}`` and shared experts ``layers.{i}.ffn.shared.w{1,2,3}``.
- ``experts``: routed experts only (what Kimi-K2-Thinking ships).
MLA projections, the router (``ffn.gate``, ``ffn.gate_bias``), embed, norms, head and ``drafter.*``
always stay as they are. A quantized ``X`` becomes ``X.packed`` (int32 [N, K/8]) + ``X.scale``
(float16 [N, K/G]) and ``X`` is removed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from workbench.config import ModelConfig
from workbench.errors import InputError
from workbench.quant.int4 import pack_int4, quantize_int4

POLICIES = ("mlp", "experts")
_PROJ = ("w1", "w2", "w3")


def policy_names(cfg: ModelConfig, policy: str) -> list[str]:
    """The weight names ``policy`` quantizes for ``cfg``, in layer order."""
    if policy not in POLICIES:
        raise InputError(f"unknown quantization policy {policy!r} (choose from {', '.join(POLICIES)})")
    names: list[str] = []
    for i in range(cfg.num_hidden_layers):
        ffn = f"layers.{i}.ffn"
        if not cfg.is_moe_layer(i):
            if policy == "mlp":
                names += [f"{ffn}.{p}" for p in _PROJ]
            continue
        for e in range(cfg.n_routed_experts):
            names += [f"{ffn}.experts.{e}.{p}" for p in _PROJ]
        if policy == "mlp" and cfg.n_shared_experts > 0:
            names += [f"{ffn}.shared.{p}" for p in _PROJ]
    return names


def is_quantized(weights: dict[str, Any], name: str) -> bool:
    """True when linear ``name`` is stored as ``name.packed`` + ``name.scale``."""
    return f"{name}.packed" in weights and f"{name}.scale" in weights


def quantized_names(weights: dict[str, Any]) -> list[str]:
    """Sorted base names of every INT4 linear in ``weights`` (those with a ``.packed`` tensor)."""
    return sorted(k[: -len(".packed")] for k in weights if k.endswith(".packed"))


def quantize_weights(cfg: ModelConfig, weights: dict[str, Any], policy: str = "mlp",
                     group_size: int = 32) -> tuple[dict[str, Any], dict[str, Any]]:
    """Quantize the linears ``policy`` selects; returns ``(new_weights, info)``.

    ``weights`` is not modified; untouched arrays are shared, not copied. ``info`` is
    ``{"policy", "group_size", "n_quantized"}``. Raises InputError if the dict already holds INT4
    linears, a selected weight is missing or not a 2-D float array of the config's shape family,
    or its input dim is not a multiple of ``group_size``.
    """
    already = quantized_names(weights)
    if already:
        raise InputError(f"weights are already quantized ({len(already)} INT4 linears, e.g. {already[0]})")
    names = policy_names(cfg, policy)
    out = dict(weights)
    for name in names:
        if name not in weights:
            raise InputError(f"weight {name!r} is missing (needed by policy {policy!r})")
        w = np.asarray(weights[name])
        if w.ndim != 2:
            raise InputError(f"weight {name!r} must be 2-D [out, in], got shape {w.shape}")
        try:
            codes, scales = quantize_int4(w, group_size)
        except InputError as e:
            raise InputError(f"{name}: {e}") from None
        del out[name]
        out[f"{name}.packed"] = pack_int4(codes)
        out[f"{name}.scale"] = scales
    return out, {"policy": policy, "group_size": int(group_size), "n_quantized": len(names)}
