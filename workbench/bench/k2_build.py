"""One layer of the seeded model as the engine's prepared device weights (``engine.weights.DeviceLayer``).

Built by ``engine.build.build_layer`` (the builder of every engine model) from ``SeededSource``:
attention, norms, router and shared expert (or dense MLP) are the seeded bf16 values widened to
float32 (exact) or W16A16, prepared as ``engine.build.upload_model`` prepares a bundle's. Routed
experts are ``int4`` (the seeded W4A16 words; ``fused_moe`` where the layout allows), ``bf16`` (grouped
GEMMs) or ``fp32`` (the same weights dequantized, exact: the portable FFN kernels). At K2 width the
host tile repack is the slow step (about half a second per expert on one core), so INT4 experts are
generated and repacked in chunks on ``workers`` processes; a stack of chunks in the tile layout is
the chunks' arrays one after another (the expert index is the outermost dimension).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import SIMULATED, to_device
from kernels_numba.int4_layout import Int4Weight, LayoutError
from kernels_numba.moe import MoEWeights, prepare_moe
from numformats.bf16 import BF16Array

from .. import seeded
from ..config import ModelConfig
from ..engine.build import MappingSource, build_layer
from ..engine.weights import DeviceLayer, DeviceModel, moe_router, swiglu
from ..errors import InputError
from ..quant.int4 import scales_to_float32
from ..quant.w16a16 import w16a16

EXPERT_KINDS = ("int4", "fp32", "bf16")   # routed experts: fused_moe, portable FFN, grouped GEMMs
DENSE_KINDS = ("fp32", "bf16")     # dense projections widened to FP32, or W16A16 (workbench.quant.w16a16)
CHUNK = 4  # experts per repack task (~0.7 GB of temporaries at K2 width)


def _fp(cfg: ModelConfig, seed: int, name: str) -> np.ndarray:
    return BF16Array(seeded.fp_bits(cfg, seed, name)).float32()


def _proj(cfg: ModelConfig, seed: int, name: str, dense: str):
    """A dense projection as the ops take it: FP32 values, or its bf16 bits as a W16A16 ``Bf16Host``."""
    return ops.Bf16Host(seeded.fp_bits(cfg, seed, name)) if dense == "bf16" else _fp(cfg, seed, name)


def _swiglu_fp(cfg: ModelConfig, seed: int, prefix: str, dense: str = "fp32") -> tuple:
    return tuple(_proj(cfg, seed, f"{prefix}.{p}", dense) for p in ("w1", "w3", "w2"))


def _expert_stack(cfg: ModelConfig, seed: int | Mapping, layer: int, proj: str, ids: range) -> tuple:
    """(packed int32 [E, N, K/8], scale float16 [E, N, K/G]) of experts ``ids``: seeded, or read from a
    weights mapping (bf16 scales must be float16 values: fused_moe's tile layout stores float16)."""
    if not isinstance(seed, Mapping):
        return seeded.expert_stack(cfg, seed, layer, proj, experts=ids)
    names = [f"layers.{layer}.ffn.experts.{e}.{proj}" for e in ids]
    packed = np.stack([np.asarray(seed[n + ".packed"]) for n in names])
    s32 = np.stack([scales_to_float32(seed[n + ".scale"]) for n in names])
    scale = s32.astype(np.float16)
    if not np.array_equal(scale.astype(np.float32), s32):
        raise InputError(f"layer {layer} {proj}: INT4 scales float16 cannot hold (fused_moe stores float16)")
    return packed, scale


def _repack_chunk(cfg: ModelConfig, seed: int | Mapping, layer: int, e0: int, e1: int) -> tuple:
    """Experts [e0, e1) of ``layer`` in the fused_moe tile layout: (w13 wq, w13 sq, w2 wq, w2 sq)."""
    st = [_expert_stack(cfg, seed, layer, p, range(e0, e1)) for p in ("w1", "w3", "w2")]
    w = prepare_moe(st[0][0], st[0][1], st[1][0], st[1][1], st[2][0], st[2][1])
    return w.w13.wq, w.w13.sq, w.w2.wq, w.w2.sq


def int4_experts(cfg: ModelConfig, seed: int | Mapping, layer: int, workers: int = 1, log=None,
                 experts: range | None = None) -> MoEWeights:
    """The routed experts ``experts`` (default all) of ``layer`` repacked for fused_moe (host arrays,
    local ids 0.. in order), no shared expert inside."""
    ex = range(cfg.n_routed_experts) if experts is None else experts
    e, chunk = len(ex), CHUNK
    tasks = [(e0, min(e0 + chunk, ex.stop)) for e0 in range(ex.start, ex.stop, chunk)]
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futs = [pool.submit(_repack_chunk, cfg, seed, layer, a, b) for a, b in tasks]
            parts = [f.result() for f in futs]
    else:
        parts = [_repack_chunk(cfg, seed, layer, a, b) for a, b in tasks]
    cat = [np.concatenate([p[j] for p in parts]) for j in range(4)]
    del parts
    d, i = cfg.hidden_size, cfg.moe_intermediate_size
    g = seeded.EXPERT_GROUP
    return MoEWeights(
        Int4Weight(cat[0], cat[1], i, d, g, e, pair=True), Int4Weight(cat[2], cat[3], d, i, g, e), e, 0
    )


def fp32_stack(cfg: ModelConfig, seed: int, layer: int, workers: int = 1, chunk: int = 8) -> dict:
    """The portable kernels' FP32 expert stack (ffn.py: w1t, w3t [E, D, I], w2t [E, I, D]), dequantized
    from the seeded INT4 words by torch where the kernels read it (the GPU; the host in the simulator),
    ``chunk`` experts at a time: no host copy of the whole 4-byte stack."""
    import torch

    from .torch_layer import dequantize_int4_torch
    dev = "cpu" if SIMULATED else "cuda"
    e, d, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    t = {"w1t": torch.empty(e, d, i, device=dev), "w3t": torch.empty(e, d, i, device=dev),
         "w2t": torch.empty(e, i, d, device=dev)}
    for e0 in range(0, e, chunk):
        ids = range(e0, min(e0 + chunk, e))
        for p in ("w1", "w3", "w2"):
            packed, scale = seeded.expert_stack(cfg, seed, layer, p, experts=ids, workers=workers)
            w = dequantize_int4_torch(torch.from_numpy(packed).to(dev), torch.from_numpy(scale).to(dev),
                                      torch.float32)                                  # [c, N, K]
            t[p + "t"][e0:e0 + len(ids)] = w.transpose(1, 2)
    if SIMULATED:
        return {"int4": False, **{k: to_device(v.numpy()) for k, v in t.items()}, "width": i}
    from numba import cuda
    return {"int4": False, **{k: cuda.as_cuda_array(v) for k, v in t.items()}, "width": i,
            "tensors": t}                                      # the torch tensors own the device memory


def router_and_shared(cfg: ModelConfig, seed: int, layer: int,
                      dense: str = "fp32") -> tuple[ops.Router, ops.SwiGLU | None]:
    """A MoE layer's router (bf16 widened to FP32) and shared expert (FP32 or W16A16 as ``dense``) as the
    engine prepares them."""
    f = f"layers.{layer}.ffn"
    rt = ops.router(_fp(cfg, seed, f + ".gate"), _fp(cfg, seed, f + ".gate_bias"), cfg.num_experts_per_tok,
                    cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor)
    shared = None
    if cfg.n_shared_experts:
        shared = ops.swiglu_weights(*_swiglu_fp(cfg, seed, f + ".shared", dense))
    return rt, shared


class SeededSource(MappingSource):
    """The seeded model's parts for ``engine.build.build_layer``: dense projections widened to FP32 or
    W16A16 (``dense`` "bf16"), router and norms FP32, routed experts ``experts`` ("int4": repacked for
    fused_moe on ``workers`` processes; "bf16": grouped GEMMs; "fp32": the portable kernels)."""

    def __init__(self, cfg: ModelConfig, seed: int | Mapping, experts: str = "int4", workers: int = 1,
                 dense: str = "fp32") -> None:
        from ..seeded import SeededWeights
        if isinstance(seed, Mapping) and experts != "int4":
            raise InputError(f"a checkpoint's layer runs the experts it holds (int4), not {experts}")
        w = seed if isinstance(seed, Mapping) else SeededWeights(cfg, seed, "experts")
        if dense == "bf16":
            w = w16a16(cfg, w)
        super().__init__(cfg, w)
        self.seed, self.kind, self.workers, self.dense_kind = seed, experts, workers, dense

    def moe(self, prefix: str) -> ops.MoE:
        cfg, seed = self.cfg, self.seed
        layer = int(prefix.split(".")[1])
        if isinstance(seed, Mapping):                    # a checkpoint's router and shared expert
            rt = moe_router(cfg, self.w, prefix, True)
            shared = ops.swiglu_weights(*swiglu(self.w, prefix + ".shared")) if cfg.n_shared_experts else None
        else:
            rt, shared = router_and_shared(cfg, seed, layer, self.dense_kind)
        d, i = cfg.hidden_size, cfg.moe_intermediate_size
        if self.kind == "int4":
            try:
                fused = int4_experts(cfg, seed, layer, self.workers)
            except LayoutError as e:
                raise InputError(f"layer {layer}: the experts do not fit fused_moe's layout: {e}") from None
            if cfg.n_routed_experts > ops.MAX_FUSED_EXPERTS:
                raise InputError(f"fused_moe takes at most {ops.MAX_FUSED_EXPERTS} experts")
            return ops.MoE(ops.FUSED_MOE, rt, i, d, fused=fused if SIMULATED else fused.to_device(),
                           shared=shared)
        if self.kind == "bf16":
            if not ops.BLAS:
                raise InputError("bf16 experts run on the BLAS path (torch): a GPU, or ops.BLAS on")
            from .torch_layer import seeded_bf16_experts
            w13, w2 = seeded_bf16_experts(cfg, seed, layer, "cpu" if SIMULATED else "cuda",
                                          workers=self.workers)
            return ops.MoE(ops.GROUPED_MM, rt, i, d, grouped=ops.Bf16Experts(w13, w2), shared=shared)
        return ops.MoE(ops.PORTABLE, rt, i, d, stack=fp32_stack(cfg, seed, layer, self.workers),
                       shared=shared)


def device_layer(
    cfg: ModelConfig, seed: int | Mapping, layer: int, experts: str = "int4", workers: int = 1, log=None,
    dense: str = "fp32",
) -> DeviceLayer:
    """Layer ``layer`` of the seeded model (or of the weights mapping ``seed``: a lazy checkpoint,
    ``workbench.checkpoint``) on the device, built by ``engine.build.build_layer`` (what every engine
    model is built by) from ``SeededSource``; ``dense="bf16"``: the attention projections, dense MLP and
    shared expert W16A16 (BLAS path)."""
    if experts not in EXPERT_KINDS:
        raise InputError(f"experts must be one of {', '.join(EXPERT_KINDS)}, got {experts!r}")
    if dense not in DENSE_KINDS:
        raise InputError(f"dense must be one of {', '.join(DENSE_KINDS)}, got {dense!r}")
    if not 0 <= layer < cfg.num_hidden_layers:
        raise InputError(f"layer {layer} outside the model's {cfg.num_hidden_layers} layers")
    if cfg.q_lora_rank is None:
        raise InputError("the layer builder wants a q_lora model (K2's)")
    return build_layer(cfg, SeededSource(cfg, seed, experts, workers, dense), layer)


def device_model(cfg: ModelConfig, seed: int, workers: int = 1, dense: str = "fp32", log=None,
                 experts: str = "int4") -> DeviceModel:
    """The whole seeded model on the device (every layer by ``device_layer`` with ``experts``, embed,
    final norm and head FP32), for ``engine.runtime.Engine(model=...)``."""
    layers = [device_layer(cfg, seed, i, experts, workers, log, dense=dense)
              for i in range(cfg.num_hidden_layers)]
    return DeviceModel(cfg=cfg, embed=to_device(_fp(cfg, seed, "embed")),
                       norm=to_device(_fp(cfg, seed, "norm")), head=ops.dense(_fp(cfg, seed, "head")),
                       layers=layers, a1_width=int(layers[0].a1.wt.shape[1]))


def layer_bytes(cfg: ModelConfig, layer: int) -> dict[str, Any]:
    """Parameter counts and bytes per part: attention (wkv_b among them), INT4 experts with f16 scales,
    FP32 and BF16 experts, latent cache rows, router, shared expert or dense MLP (``k2_layer._floor_bytes``
    weighs them as each layout holds them)."""
    d, h = cfg.hidden_size, cfg.num_attention_heads
    q, c, r = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    attn = (
        d * (q + c + r)
        + q * h * cfg.qk_head_dim
        + c * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        + h * cfg.v_head_dim * d
    )
    i = cfg.moe_intermediate_size
    expert_int4 = 3 * d * i // 2 + 3 * d * (i // seeded.EXPERT_GROUP) * 2
    out = {
        "attention_params": attn,
        "expert_int4": expert_int4,
        "expert_fp32": 3 * d * i * 4,
        "expert_bf16": 3 * d * i * 2,
        "kv_row_fp32": cfg.kv_cache_dim * 4,
        "kv_row_bf16": cfg.kv_cache_dim * 2,
    }
    if cfg.is_moe_layer(layer):
        out["router_params"] = cfg.n_routed_experts * d
        out["shared_params"] = 3 * d * i * cfg.n_shared_experts
    else:
        out["mlp_params"] = 3 * d * cfg.intermediate_size
    return out


def dense_kind(lay: DeviceLayer) -> str:
    """"bf16" where the layer's projections run W16A16 (bf16 weights on the BLAS path), else "fp32"."""
    return "bf16" if str(getattr(lay.wo.wt, "dtype", "")) == "torch.bfloat16" else "fp32"
