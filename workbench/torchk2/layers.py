"""The K2 layer's pieces in torch, shared by the trained target (``torchk2.model``) and the stock-PyTorch
baseline layer ``bench k2`` times (``torchk2.layer``): the numpy reference's maths.

Legend: M rows, D width, R rope dim, E routed experts, G expert groups, K experts per token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import ModelConfig


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """w * x / sqrt(mean(x^2) + eps), normalised in float32 (float64 stays float64), x's dtype out."""
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w.to(y.dtype) * y).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, float32: bool = False) -> torch.Tensor:
    """Rotate interleaved pairs (2i, 2i+1) of x [..., R] by cos/sin [..., R/2] (the reference's layout),
    in x's dtype, or with ``float32`` in float32 rounded once to x's dtype (the baseline layer's bf16)."""
    xs = x.float() if float32 else x
    c, s = cos.to(xs.dtype), sin.to(xs.dtype)
    x0, x1 = xs[..., 0::2], xs[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2).to(x.dtype)


def route(cfg: ModelConfig, x: torch.Tensor, gate: torch.Tensor,
          gate_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """noaux_tc: (idx [M, K], combine weights [M, K], routed_scaling_factor included) for x [M, D] with
    gate [E, D] and the correction bias [E] (selection only), in float32 (float64 for float64 x)."""
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=x.device.type, enabled=False):
        scores = torch.sigmoid(F.linear(x.to(dt), gate.to(dt)))                     # [M, E]
    choice = scores + gate_bias.to(dt)                                              # selection only
    if cfg.n_group > 1:
        m, g = x.shape[0], cfg.n_group
        grouped = choice.view(m, g, -1)                                             # [M, G, E/G]
        gscore = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)     # [M, G]
        keep = torch.zeros_like(gscore, dtype=torch.bool).scatter(
            1, gscore.topk(cfg.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), -math.inf)
    idx = choice.topk(cfg.num_experts_per_tok, dim=-1).indices                      # [M, K]
    w = scores.gather(1, idx)                                                       # unbiased scores
    if cfg.norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * cfg.routed_scaling_factor
