"""The K2-architecture model in torch, the twin of the numpy reference (workbench/reference/), trained by
``workbench.train``.

Legend: B batch, S new tokens, T keys, D width, H heads, N qk_nope, R qk_rope, Vh v_head, C kv_lora,
Q q_lora, E routed experts, K experts per token, I expert width, V vocabulary.

Same maths as the reference, laid out for a GPU: MLA in its naive form (keys/values expanded per head
from the latent, one fused attention call; training) or, with ``absorbed=True``, the absorbed form
(``layers.absorbed_attention``, which decoding and the baseline layer ``torchk2.layer`` run), a latent
cache [B, max_len, C+R] for generation, the noaux_tc sigmoid router in float32 with the correction bias
as a buffer (updated outside autograd, ``update_router_bias``), and the routed experts as one wide
SwiGLU over all E experts (``layers.experts_dense``): the reference's sparse sum with static shapes.
Parameters keep the reference's [out, in] layout; experts are stacked [E, I, D] / [E, D, I];
``weights_dict`` / ``load_weights_dict`` convert to and from internal names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import InputError
from ..reference.rope import rope_attention_factor, yarn_inv_freq
from ..weights import expected_shapes
from .layers import absorbed_attention, apply_rope, experts_dense, latent_rows, rmsnorm, route, visible_keys


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


class MLA(nn.Module):
    def __init__(self, cfg: ModelConfig, absorbed: bool = False) -> None:
        super().__init__()
        self.cfg, self.absorbed = cfg, absorbed
        h, d, c, r = cfg.num_attention_heads, cfg.hidden_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            self.wq = _param(h * cfg.qk_head_dim, d)
        else:
            self.wq_a = _param(cfg.q_lora_rank, d)
            self.q_norm = _param(cfg.q_lora_rank)
            self.wq_b = _param(h * cfg.qk_head_dim, cfg.q_lora_rank)
        self.wkv_a = _param(c + r, d)
        self.kv_norm = _param(c)
        self.wkv_b = _param(h * (cfg.qk_nope_head_dim + cfg.v_head_dim), c)
        self.wo = _param(d, h * cfg.v_head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: torch.Tensor | None,
                start: int) -> torch.Tensor:
        """x [B, S, D] at positions start..start+S-1 (cos/sin [S, R/2]); cache [B, max_len, C+R] or None."""
        cfg = self.cfg
        b, s, _ = x.shape
        h, n, c = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank
        if cfg.q_lora_rank is None:
            q = F.linear(x, self.wq)
        else:
            q = F.linear(rmsnorm(F.linear(x, self.wq_a), self.q_norm, cfg.mla_norm_eps), self.wq_b)
        q = q.view(b, s, h, cfg.qk_head_dim).transpose(1, 2)                        # [B, H, S, N+R]
        q = torch.cat([q[..., :n], apply_rope(q[..., n:], cos, sin)], dim=-1)
        lat = latent_rows(F.linear(x, self.wkv_a), self.kv_norm, cos, sin, cfg.mla_norm_eps)  # [B, S, C+R]
        if cache is not None:
            cache[:, start:start + s] = lat.to(cache.dtype)
            lat = cache[:, :start + s].to(lat.dtype)                                # [B, T, C+R]
        t = lat.shape[1]
        if self.absorbed:                           # the new rows' keys begin at start (at 0 without a cache)
            o = absorbed_attention(q, lat, self.wkv_b, n, cfg.softmax_scale, t - s)
            return F.linear(o.transpose(1, 2).reshape(b, s, h * cfg.v_head_dim), self.wo)
        kv = F.linear(lat[..., :c], self.wkv_b).view(b, t, h, n + cfg.v_head_dim).transpose(1, 2)
        k_pe = lat[..., c:].unsqueeze(1).expand(b, h, t, cfg.qk_rope_head_dim)      # one rope key, all heads
        k = torch.cat([kv[..., :n], k_pe], dim=-1)                                  # [B, H, T, N+R]
        v = kv[..., n:]                                                             # [B, H, T, Vh]
        if cache is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=cfg.softmax_scale)
        else:       # every cached row is visible, causal among the new ones
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible_keys(s, t, start, None, x.device),
                                               scale=cfg.softmax_scale)
        return F.linear(o.transpose(1, 2).reshape(b, s, h * cfg.v_head_dim), self.wo)


class SwiGLU(nn.Module):
    def __init__(self, d: int, width: int) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = _param(width, d), _param(width, d), _param(d, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.w1)) * F.linear(x, self.w3), self.w2)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e, i, d = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.gate = _param(e, d)
        self.register_buffer("gate_bias", torch.zeros(e))
        self.w1, self.w3, self.w2 = _param(e, i, d), _param(e, i, d), _param(e, d, i)
        self.shared = SwiGLU(d, cfg.n_shared_experts * i) if cfg.n_shared_experts else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """noaux_tc: (idx [M, K], combine weights [M, K]) for x [M, D], in float32 (float64 for float64 x)."""
        return route(self.cfg, x, self.gate, self.gate_bias)

    def forward(self, x: torch.Tensor, counts: list | None = None) -> torch.Tensor:
        cfg = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])                                                # [M, D]
        idx, w = self.route(x)
        if counts is not None:
            counts.append(torch.bincount(idx.flatten(), minlength=cfg.n_routed_experts))
        y = experts_dense(x, idx, w, self.w1, self.w3, self.w2)                     # [M, D]
        if self.shared is not None:
            y = y + self.shared(x)
        return y.view(shape)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, absorbed: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_norm, self.ffn_norm = _param(cfg.hidden_size), _param(cfg.hidden_size)
        self.attn = MLA(cfg, absorbed)
        self.ffn = MoE(cfg) if cfg.is_moe_layer(layer) else SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h, cos, sin, cache, start, counts):
        h = h + self.attn(rmsnorm(h, self.attn_norm, self.cfg.rms_norm_eps), cos, sin, cache, start)
        x = rmsnorm(h, self.ffn_norm, self.cfg.rms_norm_eps)
        return h + (self.ffn(x, counts) if isinstance(self.ffn, MoE) else self.ffn(x))


@dataclass
class TargetOut:
    logits: torch.Tensor                                           # [B, S, V]
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer k -> its output [B, S, D]
    counts: list[torch.Tensor] = field(default_factory=list)       # per MoE layer, tokens per expert [E]


class TorchTarget(nn.Module):
    def __init__(self, cfg: ModelConfig, absorbed: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i, absorbed) for i in range(cfg.num_hidden_layers))
        self.norm = _param(cfg.hidden_size)
        self.head = _param(cfg.vocab_size, cfg.hidden_size)
        inv = yarn_inv_freq(cfg)                                                    # [R/2] float64
        ang = np.arange(cfg.max_position_embeddings, dtype=np.float64)[:, None] * inv[None, :]
        m = rope_attention_factor(cfg)
        self.register_buffer("rope_cos", torch.from_numpy(np.cos(ang) * m), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(np.sin(ang) * m), persistent=False)

    def forward(self, tokens: torch.Tensor, cache: LatentCache | None = None, capture: tuple[int, ...] = (),
                count_experts: bool = False) -> TargetOut:
        """tokens [B, S] at positions cache.length.. (0.. without a cache); cache.length += S."""
        start = cache.length if cache is not None else 0
        s = tokens.shape[1]
        if start + s > self.cfg.max_position_embeddings:
            raise InputError(f"positions up to {start + s} exceed max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}")
        cos, sin = self.rope_cos[start:start + s], self.rope_sin[start:start + s]
        h = self.embed[tokens]                                                      # [B, S, D]
        hidden: dict[int, torch.Tensor] = {}
        counts: list[torch.Tensor] | None = [] if count_experts else None
        for i, block in enumerate(self.layers):
            h = block(h, cos, sin, None if cache is None else cache.layers[i], start, counts)
            if i in capture:
                hidden[i] = h
        if cache is not None:
            cache.length += s
        logits = F.linear(rmsnorm(h, self.norm, self.cfg.rms_norm_eps), self.head)
        return TargetOut(logits, hidden, counts or [])

    def moe_blocks(self) -> list[MoE]:
        return [b.ffn for b in self.layers if isinstance(b.ffn, MoE)]

    # ---- internal names <-> tensors -----------------------------------------------------------
    def tensor(self, name: str) -> torch.Tensor:
        """The tensor (or expert slice) behind internal weight ``name``; InputError for an unknown name."""
        parts = name.split(".")
        if name in ("embed", "norm", "head"):
            return getattr(self, name)
        try:
            block = self.layers[int(parts[1])]
            if parts[2] == "ffn" and parts[3] == "experts":
                return getattr(block.ffn, parts[5])[int(parts[4])]
            if parts[2] == "ffn" and parts[3] == "gate_bias":
                return block.ffn.gate_bias
            obj: Any = block
            for p in parts[2:]:
                obj = getattr(obj, p)
            return obj
        except (IndexError, ValueError, AttributeError):
            raise InputError(f"no torch tensor for weight {name!r}") from None

    def weights_dict(self) -> dict[str, np.ndarray]:
        """Every reference weight as a float32 numpy array (internal names, [out, in])."""
        with torch.no_grad():
            return {name: self.tensor(name).detach().to("cpu", torch.float32).numpy().copy()
                    for name in expected_shapes(self.cfg)}

    def load_weights_dict(self, weights: dict[str, Any]) -> None:
        """Copy a reference weights dict (FP arrays; bf16 bundle arrays widen) into the parameters."""
        from ..reference.layers import as_array
        with torch.no_grad():
            for name, shape in expected_shapes(self.cfg).items():
                if name not in weights:
                    raise InputError(f"missing weight tensor {name!r} (the torch target needs FP weights)")
                a = as_array(weights[name], np.float64)
                if a.shape != shape:
                    raise InputError(f"{name} has shape {a.shape}, expected {shape}")
                t = self.tensor(name)
                t.copy_(torch.from_numpy(a).to(t.dtype))

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """Training init: linears and embeddings N(0, std^2) (output projections / sqrt(2 L)), norms 1,
        router bias 0, from one seeded generator in a fixed order."""
        g = torch.Generator().manual_seed(seed)
        out_std = std / math.sqrt(2 * self.cfg.num_hidden_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if p.ndim == 1:
                    p.fill_(1.0)
                else:
                    s = out_std if leaf in ("wo", "w2") else std
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * s)
            for m in self.moe_blocks():
                m.gate_bias.zero_()


@dataclass
class LatentCache:
    """Per-layer latent rows [B, max_len, C+R] (positions 0..length-1 valid), as the reference's cache."""
    layers: list[torch.Tensor]
    length: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, max_len: int, dtype: torch.dtype,
              device: torch.device | str = "cpu") -> LatentCache:
        return cls([torch.zeros(batch, max_len, cfg.kv_cache_dim, dtype=dtype, device=device)
                    for _ in range(cfg.num_hidden_layers)])


@torch.no_grad()
def greedy(model: TorchTarget, prompts: torch.Tensor, n_tokens: int,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """Greedy continuations [B, n_tokens] of equal-length prompts [B, P] (argmax, first index on ties)."""
    b, p = prompts.shape
    cache = LatentCache.empty(model.cfg, b, p + n_tokens, dtype or model.embed.dtype, prompts.device)
    out = torch.empty(b, n_tokens, dtype=torch.long, device=prompts.device)
    step = prompts
    for i in range(n_tokens):
        logits = model(step, cache).logits[:, -1]
        out[:, i] = logits.argmax(-1)
        step = out[:, i:i + 1]
    return out


def update_router_bias(model: TorchTarget, counts: list[torch.Tensor], rate: float) -> None:
    """Aux-loss-free balancing (DeepSeek-V3): bias_e += rate * sign(mean load - load_e), per MoE layer."""
    with torch.no_grad():
        for moe, c in zip(model.moe_blocks(), counts, strict=True):
            c = c.to(moe.gate_bias.dtype)
            moe.gate_bias.add_(rate * torch.sign(c.mean() - c))
