"""The published DFlash drafter (a Qwen3-style decoder stack, DFlashDraftModel) written plainly in torch
float64 from its description, over a config.json dict and HF tensor names, as a second opinion on
``workbench.ddtree.dflash``. Stateless: every call recomputes the context keys and values from all
context features (the published drafter caches them; the values are the same).

Legend: P context rows, Bs block rows, L = Bs - 1, D width, F tapped layers, H / Hkv query / KV heads,
d head dim, V vocabulary.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from workbench.reference.layers import as_array


def rope_inv_freq(c: dict) -> tuple[torch.Tensor, float]:
    """(inv_freq [d/2] float64, attention factor) of config.json ``c``: rope_theta, and rope_scaling
    None or YaRN (factor, original_max_position_embeddings, beta_fast / beta_slow, attention_factor),
    following the YaRN paper's ramp with a floored / ceiled correction range."""
    d = c["head_dim"]
    freq = c["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rs = c.get("rope_scaling")
    if rs is None:
        return freq, 1.0
    orig, factor = rs["original_max_position_embeddings"], rs["factor"]

    def dim_of(rot: float) -> float:
        return d * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(c["rope_theta"]))
    low, high = max(math.floor(dim_of(rs["beta_fast"])), 0), min(math.ceil(dim_of(rs["beta_slow"])), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / max(high - low, 0.001)).clamp(0, 1)
    return freq * (1 - ramp) + freq / factor * ramp, float(rs["attention_factor"])


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def drafter_forward(c: dict, sd: dict[str, torch.Tensor], ctx: torch.Tensor, noise: torch.Tensor,
                    positions: torch.Tensor) -> torch.Tensor:
    """The drafter's normalised output [Bs, D] for target features ctx [P, F*D], the embedded block
    noise [Bs, D] and positions [P + Bs] (context rows, then the block)."""
    eps, h, hkv, d = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    p, bs = ctx.shape[0], noise.shape[0]
    target = rms(ctx @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)                  # [P, D]
    inv, att = rope_inv_freq(c)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]                             # [P+Bs, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1) * att                                     # [P+Bs, d]
    sin = torch.cat([ang.sin(), ang.sin()], -1) * att
    x = noise
    for i in range(c["num_hidden_layers"]):
        pre = f"layers.{i}."
        a = pre + "self_attn."
        y = rms(x, sd[pre + "input_layernorm.weight"], eps)                               # [Bs, D]
        q = rms((y @ sd[a + "q_proj.weight"].T).view(bs, h, d), sd[a + "q_norm.weight"], eps)
        kv_in = torch.cat([target, y])                                                    # [P+Bs, D]
        k = rms((kv_in @ sd[a + "k_proj.weight"].T).view(p + bs, hkv, d), sd[a + "k_norm.weight"], eps)
        v = (kv_in @ sd[a + "v_proj.weight"].T).view(p + bs, hkv, d)
        q = q * cos[p:, None] + rotate_half(q) * sin[p:, None]                            # block positions
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        k, v = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))                     # [P+Bs, H, d]
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           scale=d ** -0.5)                               # [H, Bs, d] no mask
        x = x + o.transpose(0, 1).reshape(bs, h * d) @ sd[a + "o_proj.weight"].T
        m = pre + "mlp."
        y = rms(x, sd[pre + "post_attention_layernorm.weight"], eps)
        x = x + (F.silu(y @ sd[m + "gate_proj.weight"].T) * (y @ sd[m + "up_proj.weight"].T)) @ \
            sd[m + "down_proj.weight"].T
    return rms(x, sd["norm.weight"], eps)


def draft_logits(c: dict, sd: dict[str, torch.Tensor], embed, head, feats, bonus: int, start: int,
                 block_size: int, mask_id: int) -> np.ndarray:
    """Draft logits [L, V] float64 for the bonus at position ``start`` after ``start`` context rows
    feats [start, F*D]: the block [bonus, MASK x L] embedded with ``embed``, ``head`` over rows 1..L."""
    t = torch.from_numpy
    ids = torch.full((block_size,), mask_id, dtype=torch.long)
    ids[0] = bonus
    noise = t(as_array(embed, np.float64))[ids]
    out = drafter_forward(c, sd, t(np.asarray(feats, np.float64)), noise, torch.arange(start + block_size))
    return (out[1:] @ t(as_array(head, np.float64)).T).numpy()


def config_json(cfg, dcfg) -> dict:
    """The config.json fields this module reads, for a workbench target ``cfg`` and drafter ``dcfg``."""
    c = {"hidden_size": cfg.hidden_size, "num_hidden_layers": dcfg.n_layers,
         "num_attention_heads": dcfg.n_heads, "num_key_value_heads": dcfg.kv_heads, "head_dim": dcfg.head_dim,
         "intermediate_size": dcfg.intermediate_size, "rms_norm_eps": dcfg.rms_norm_eps,
         "rope_theta": dcfg.rope_theta, "rope_scaling": None}
    if dcfg.rope_scaling_type == "yarn":
        c["rope_scaling"] = {"rope_type": "yarn", "factor": dcfg.rope_factor,
                             "original_max_position_embeddings": dcfg.original_max_position_embeddings,
                             "beta_fast": dcfg.beta_fast, "beta_slow": dcfg.beta_slow,
                             "attention_factor": dcfg.rope_attention_factor}
    return c


_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj", "attn.wv": "self_attn.v_proj",
          "attn.wo": "self_attn.o_proj",
          "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm", "mlp.w1": "mlp.gate_proj",
          "mlp.w3": "mlp.up_proj", "mlp.w2": "mlp.down_proj"}


def hf_state(weights: dict) -> dict[str, torch.Tensor]:
    """The ``drafter.*`` tensors of ``weights`` under the published names, float64 torch tensors."""
    out = {}
    for name, w in weights.items():
        if not name.startswith("drafter."):
            continue
        rest = name[len("drafter."):]
        if rest.startswith("layers."):
            _, i, local = rest.split(".", 2)
            rest = f"layers.{i}.{_NAMES[local]}"
        out[rest + ".weight"] = torch.from_numpy(as_array(w, np.float64))
    return out
