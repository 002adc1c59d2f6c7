"""Load a weights dict onto the device as the ops' prepared weights (once per engine).

Legend: D model width, H heads, N qk_nope, R rope, V v_head, C kv_lora_rank, Q q_lora_rank,
E routed experts, I expert/MLP width, Vo vocabulary.

- projections of the attention and the head are FP32 ``ops.Dense`` (BF16 tensors widen exactly),
  or bf16 ones on the BLAS path where the weights mark them W16A16 (``workbench.quant.w16a16``),
  the absorbed attention ``ops.MLA``, both on cuBLAS or the portable kernels as ops decides;
  ``a1`` fuses the two projections of the layer input, [wq_a; wkv_a] [Q+C+R, D] (or [wq; wkv_a]
  without q_lora), one launch instead of two;
- ``wkv_b`` stays [H*(N+V), C]: the attention kernel reads W_UK / W_UV rows from it in place;
- each SwiGLU (dense MLP, routed experts, shared experts) follows the weights dict: INT4 where it
  holds ``.packed`` / ``.scale``, FP otherwise, on the fast or portable kernels as ``kernels_numba.ops``
  decides from the shapes (INT4 repacked here, once). ``DeviceModel.paths()`` names the choices;
- ``experts=False`` uploads no MoE layer's FFN: the caller sets ``moe_block`` of those layers (the
  expert-parallel block of ``workbench.parallel.ep_stack`` holds only its rank's experts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels_numba import ops

from ..config import ModelConfig
from ..errors import InputError
from ..reference.layers import as_array
from .kinds import DenseKind, ExpertKind


def _f32(weights: dict[str, Any], name: str) -> np.ndarray:
    if name not in weights:
        if name + ".packed" in weights:
            raise InputError(f"{name} is INT4-packed; the engine runs it unquantized only")
        raise InputError(f"missing weight tensor {name!r}")
    return as_array(weights[name], np.float32)


def dense_matrix(weights: dict[str, Any], name: str):
    """Unquantized linear ``name`` as the ops take it: FP32 [N, K], or ``ops.Bf16Host`` for a W16A16 one
    (``workbench.quant.w16a16``; with its bf16-output flag, set on routed experts)."""
    w = weights[name] if name in weights else None
    if hasattr(w, "round_input"):
        return ops.Bf16Host(w.w.bits, w.out16)
    return _f32(weights, name)


def matrix(weights: dict[str, Any], name: str):
    """Linear ``name`` as the ops take it: ``dense_matrix`` or ``ops.Int4Host`` (packed, scale)."""
    if name + ".packed" in weights:
        if name + ".scale" not in weights:
            raise InputError(f"missing weight tensor {name + '.scale'!r}")
        return ops.Int4Host(np.asarray(weights[name + ".packed"]), weights[name + ".scale"])
    return dense_matrix(weights, name)


def stack_rows(parts: list) -> Any:
    """[A; B; ...] of dense matrices of one kind (all FP32 or all W16A16), one product's rows: the fused
    a1 projection, the drafter's wq || wk || wv."""
    n16 = sum(isinstance(m, ops.Bf16Host) for m in parts)
    if n16 == len(parts):
        return ops.Bf16Host(np.concatenate([np.asarray(m.bits) for m in parts], axis=0))
    if n16:
        raise InputError("projections stacked into one product are W16A16 in all or in none")
    return np.concatenate(parts, axis=0)


def swiglu(weights: dict[str, Any], prefix: str) -> tuple:
    """(w1, w3, w2) of the SwiGLU at ``prefix``."""
    return tuple(matrix(weights, f"{prefix}.{p}") for p in ("w1", "w3", "w2"))


@dataclass
class DeviceLayer:
    attn_norm: Any
    ffn_norm: Any
    a1: ops.Dense
    q_norm: Any
    kv_norm: Any
    wq_b: ops.Dense | None
    attn: ops.MLA                                # wkv_b [H*(N+V), C]
    wo: ops.Dense
    moe: ops.MoE | None = None
    mlp: ops.SwiGLU | None = None                # the dense MLP (layers < first_k_dense_replace)
    moe_block: Callable | None = None            # fn(h, x, rows, stream): h += moe(x) in place of ``moe``
    dense_kind: DenseKind = DenseKind.FP32       # set by ``build.build_layer`` from the parts it built
    expert_kind: ExpertKind | None = None        # ... None without routed experts here


@dataclass
class DeviceModel:
    cfg: ModelConfig
    embed: Any
    norm: Any
    head: ops.Dense
    layers: list[DeviceLayer]
    a1_width: int

    def paths(self) -> list[dict[str, str]]:
        """Per layer, the kernels each FFN part runs on: {"mlp": path} for a dense layer, {"experts":
        path, "shared": path} for a MoE layer (shared: "fused_moe" when inside the fused MoE)."""
        out = []
        for lay in self.layers:
            if lay.moe is None:
                out.append({"mlp": lay.mlp.path} if lay.mlp is not None else {"experts": "moe_block"})
                continue
            d = {"experts": lay.moe.path}
            if lay.moe.shared is not None:
                d["shared"] = lay.moe.shared.path
            elif lay.moe.fused is not None and lay.moe.fused.n_shared:
                d["shared"] = ops.FUSED_MOE
            out.append(d)
        return out

    def swiglus(self) -> list[ops.SwiGLU]:
        return [lay.mlp for lay in self.layers if lay.mlp is not None]

    def moes(self) -> list[ops.MoE]:
        return [lay.moe for lay in self.layers if lay.moe is not None]


def moe_experts(weights: dict[str, Any], f: str, ids) -> list[tuple]:
    """(w1, w3, w2) of the routed experts ``ids`` under ``f`` (one kind and one INT4 group size)."""
    experts = [swiglu(weights, f"{f}.experts.{e}") for e in ids]
    kinds = {isinstance(m, ops.Int4Host) for e in experts for m in e}
    if len(kinds) > 1:
        raise InputError(f"mixed FP32 / INT4 experts under {f}.experts: the engine wants one kind per stack")
    groups = {ops.group_size(m) for e in experts for m in e if isinstance(m, ops.Int4Host)}
    if len(groups) > 1:
        raise InputError(f"{f}.experts: the engine wants one INT4 group size per stack, got {sorted(groups)}")
    return experts


def moe_router(cfg: ModelConfig, weights: dict[str, Any], f: str, fast: bool) -> ops.Router:
    return ops.router(_f32(weights, f + ".gate"), _f32(weights, f + ".gate_bias"), cfg.num_experts_per_tok,
                      cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor, fast)
