"""Upload a weights dict to the device in the engine's layouts (once per engine).

Legend: D model width, H heads, N qk_nope, R rope, V v_head, C kv_lora_rank, Q q_lora_rank,
E routed experts, I expert/MLP width, Vo vocabulary.

- projections are stored transposed (W.T, [K, N]) so a block's threads read consecutive columns;
- ``a1t`` fuses the two projections of the layer input: [wq_a; wkv_a].T [D, Q+C+R]
  (or [wq; wkv_a].T [D, H*(N+R)+C+R] without q_lora), one launch instead of two;
- ``wkv_b`` stays [H*(N+V), C]: the attention kernel reads W_UK / W_UV rows from it in place;
- every SwiGLU (routed experts, shared experts, dense MLP) becomes an expert stack
  (kernels_numba.ffn layouts), FP32 or W4A16 per stack, following the weights dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..reference.layers import as_array
from .devarray import to_device


def _f32(weights: dict[str, Any], name: str) -> np.ndarray:
    if name not in weights:
        raise InputError(f"missing weight tensor {name!r}")
    return as_array(weights[name], np.float32)


def _dev(a: np.ndarray):
    return to_device(a)


def _stack(weights: dict[str, Any], prefixes: list[str]) -> dict[str, Any]:
    """Expert stack of the SwiGLUs at ``prefixes`` (each with .w1/.w3/.w2), FP32 or W4A16."""
    int4 = prefixes[0] + ".w1.packed" in weights
    if any((p + ".w1.packed" in weights) != int4 for p in prefixes):
        raise InputError(f"mixed FP32 / INT4 experts under {prefixes[0]}: "
                         "the engine wants one kind per stack")
    if not int4:
        w1 = np.stack([_f32(weights, p + ".w1").T for p in prefixes])       # [E, D, I]
        w3 = np.stack([_f32(weights, p + ".w3").T for p in prefixes])       # [E, D, I]
        w2 = np.stack([_f32(weights, p + ".w2").T for p in prefixes])       # [E, I, D]
        return {"int4": False, "w1t": _dev(w1), "w3t": _dev(w3), "w2t": _dev(w2), "width": w1.shape[2]}
    from ..quant.int4 import scales_to_float32
    out: dict[str, Any] = {"int4": True}
    groups = set()
    for proj in ("1", "3", "2"):
        packed = np.stack([np.asarray(weights[f"{p}.w{proj}.packed"]).view(np.int32).T for p in prefixes])
        scale = np.stack([scales_to_float32(weights[f"{p}.w{proj}.scale"]).T for p in prefixes])
        k = packed.shape[1] * 8                                              # [E, K/8, N], [E, K/G, N]
        if k % scale.shape[1]:
            raise InputError(f"{prefixes[0]}.w{proj}: K={k} is not a multiple of the scale columns")
        groups.add(k // scale.shape[1])
        out[f"p{proj}t"] = _dev(packed)
        out[f"s{proj}t"] = _dev(scale.astype(np.float32))
    if len(groups) != 1:
        raise InputError(f"{prefixes[0]}: the engine wants one INT4 group size per stack, "
                         f"got {sorted(groups)}")
    out["group"] = np.int32(groups.pop())
    out["width"] = int(out["p1t"].shape[2])
    return out


@dataclass
class DeviceLayer:
    attn_norm: Any
    ffn_norm: Any
    a1t: Any
    q_norm: Any
    kv_norm: Any
    wq_bt: Any
    wkv_b: Any
    wot: Any
    moe: bool
    gate_t: Any = None
    gate_bias: Any = None
    experts: dict = field(default_factory=dict)
    mlp: dict = field(default_factory=dict)      # shared experts (MoE layer) or the dense MLP


@dataclass
class DeviceModel:
    cfg: ModelConfig
    embed: Any
    norm: Any
    headt: Any
    layers: list[DeviceLayer]
    a1_width: int
    mlp_width: int                               # widest shared/dense MLP (hid_sh buffer)
    any_int4: bool


def upload_model(cfg: ModelConfig, weights: dict[str, Any]) -> DeviceModel:
    """All target weights on the device (drafter.* weights are uploaded per generation by
    ``engine.dflash.DeviceDFlash``)."""
    layers = []
    mlp_width = 1
    any_int4 = False
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        a = p + "attn."
        if cfg.q_lora_rank is not None:
            first = _f32(weights, a + "wq_a")
            wq_bt = _dev(_f32(weights, a + "wq_b").T)
            q_norm = _dev(_f32(weights, a + "q_norm"))
        else:
            first = _f32(weights, a + "wq")
            wq_bt = None
            q_norm = _dev(np.zeros(1, np.float32))
        a1t = np.concatenate([first, _f32(weights, a + "wkv_a")], axis=0).T      # [D, Q+C+R]
        lay = DeviceLayer(attn_norm=_dev(_f32(weights, p + "attn_norm")),
                          ffn_norm=_dev(_f32(weights, p + "ffn_norm")), a1t=_dev(a1t), q_norm=q_norm,
                          kv_norm=_dev(_f32(weights, a + "kv_norm")), wq_bt=wq_bt,
                          wkv_b=_dev(_f32(weights, a + "wkv_b")), wot=_dev(_f32(weights, a + "wo").T),
                          moe=cfg.is_moe_layer(i))
        f = p + "ffn"
        if lay.moe:
            lay.gate_t = _dev(_f32(weights, f + ".gate").T)                    # [D, E]
            lay.gate_bias = _dev(_f32(weights, f + ".gate_bias"))
            lay.experts = _stack(weights, [f"{f}.experts.{e}" for e in range(cfg.n_routed_experts)])
            any_int4 |= lay.experts["int4"]
            if cfg.n_shared_experts > 0:
                lay.mlp = _stack(weights, [f + ".shared"])
        else:
            lay.mlp = _stack(weights, [f])
        if lay.mlp:
            any_int4 |= lay.mlp["int4"]
            mlp_width = max(mlp_width, lay.mlp["width"])
        layers.append(lay)
    return DeviceModel(cfg=cfg, embed=_dev(_f32(weights, "embed")), norm=_dev(_f32(weights, "norm")),
                       headt=_dev(_f32(weights, "head").T), layers=layers, a1_width=a1t.shape[1],
                       mlp_width=mlp_width, any_int4=any_int4)
