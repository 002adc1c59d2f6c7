"""What one K2 layer's parts weigh, per layout: the byte counts ``bench k2``, ``bench ep`` and ``bench depth``
set their floors by. The layers themselves are built by ``workbench.engine.build`` (``SeededSource`` for
the seeded model, ``MappingSource`` for a checkpoint), whose ``DenseKind`` / ``ExpertKind`` name the layouts.
"""

from __future__ import annotations

from typing import Any

from .. import seeded
from ..config import ModelConfig
from ..engine.kinds import DenseKind

DENSE_KINDS = tuple(k.value for k in DenseKind)   # what ``bench k2 --dense`` takes


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
