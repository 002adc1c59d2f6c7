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


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype small reductions and rotations run in: float64 stays, everything else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (2i, 2i+1) of x [..., R] by cos/sin [..., R/2] (the reference's layout),
    in float32 (float64 stays float64), rounded once to x's dtype."""
    xs = x.to(_wide(x.dtype))
    c, s = cos.to(xs.dtype), sin.to(xs.dtype)
    x0, x1 = xs[..., 0::2], xs[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(-2).to(x.dtype)


def latent_rows(kv: torch.Tensor, kv_norm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                eps: float) -> torch.Tensor:
    """The latent cache rows [..., C+R] of kv_a's output kv [..., C+R]: c_kv normed, k_pe roped (one rope
    key for all heads); cos/sin [..., R/2]."""
    c = kv_norm.shape[0]
    return torch.cat([rmsnorm(kv[..., :c], kv_norm, eps), apply_rope(kv[..., c:], cos, sin)], dim=-1)


def visible_keys(s: int, t: int, start: int, mask: torch.Tensor | None, device) -> torch.Tensor:
    """[S, T] bool: new row i (at start + i) sees every cached key < start, the new keys mask[i] allows
    (None: causal), and none of the keys from start + S on (padding)."""
    rows = start + torch.arange(s, device=device)
    keys = torch.arange(t, device=device)
    if mask is None:
        return keys[None, :] <= rows[:, None]
    vis = (keys < start)[None, :].repeat(s, 1)
    vis[:, start:start + s] = mask
    return vis


def absorbed_attention(q: torch.Tensor, lat: torch.Tensor, wkv_b: torch.Tensor, n_nope: int, scale: float,
                       start: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """MLA in its absorbed form (DeepSeek-V3's decoding): the queries' nope half through wkv_b's key half
    into the latent space, one score GEMM of [q_lat || q_pe] against the latent rows [c_kv || k_pe],
    softmax in float32, the context back through wkv_b's value half.

    q [B, H, S, N+R] (rope applied); lat [B, T, C+R] latent rows, T >= start + S (rows from start + S on
    are padding, masked); wkv_b [H (N+Vh), C]; mask [S, S] bool over the new rows or None (causal).
    Returns o [B, H, S, Vh] in q's dtype.
    """
    b, h, s, _ = q.shape
    t, c = lat.shape[1], lat.shape[2] - (q.shape[-1] - n_nope)
    w = wkv_b.view(h, -1, c)                                                        # [H, N+Vh, C]
    q_lat = torch.matmul(q[..., :n_nope], w[:, :n_nope])                            # [B, H, S, C]
    qf = torch.cat((q_lat, q[..., n_nope:]), -1).reshape(b, h * s, -1)              # [B, H S, C+R]
    scores = torch.matmul(qf, lat.transpose(1, 2)).view(b, h, s, t)                 # [B, H, S, T]
    scores = scores.to(_wide(q.dtype)) * scale
    scores = scores.masked_fill(~visible_keys(s, t, start, mask, q.device), -math.inf)
    p = scores.softmax(-1).to(q.dtype)
    ctx = torch.matmul(p.view(b, h * s, t), lat[..., :c]).view(b, h, s, c)          # [B, H, S, C]
    return torch.matmul(ctx, w[:, n_nope:].transpose(1, 2))                         # [B, H, S, Vh]


def route(cfg: ModelConfig, x: torch.Tensor, gate: torch.Tensor,
          gate_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """noaux_tc: (idx [M, K], combine weights [M, K], routed_scaling_factor included) for x [M, D] with
    gate [E, D] and the correction bias [E] (selection only), in float32 (float64 for float64 x)."""
    dt = _wide(x.dtype)
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


# ---- the routed experts, three ways to the same sum: sum_k w[:, k] Expert_idx[:, k](x) -------------------

def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate/up outputs side by side [..., 2I] -> [..., I]."""
    i = gu.shape[-1] // 2
    return F.silu(gu[..., :i]) * gu[..., i:]


def experts_grouped(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, w13_t: torch.Tensor,
                    w2_t: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """By ``torch._grouped_mm`` over the M K (token, expert) pairs sorted by expert, group ends computed on
    the device (no host sync: capturable). x [M, D], idx/w [M, K], w13_t [E, D, 2I], w2_t [E, I, D]
    (column-major per expert, the second operand ``_grouped_mm`` takes), expert_ids = arange(E) on x's
    device -> [M, D] in x's dtype."""
    m, k = idx.shape
    flat = idx.reshape(-1)                                                          # [M K]
    expert, order = torch.sort(flat, stable=True)                                   # pairs sorted by expert
    offs = torch.searchsorted(expert, expert_ids, right=True, out_int32=True)       # [E] group ends
    gu = torch._grouped_mm(x[order // k], w13_t, offs=offs)                          # [M K, 2I]
    out = torch._grouped_mm(silu_mul(gu), w2_t, offs=offs)                          # [M K, D]
    out = out.float() * w.reshape(-1)[order, None]
    y = torch.empty_like(out).index_copy_(0, order, out)                            # back to (token, slot)
    return y.view(m, k, -1).sum(1).to(x.dtype)


def experts_loop(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, w13_t: torch.Tensor,
                 w2_t: torch.Tensor) -> torch.Tensor:
    """One expert at a time over the experts present (host syncs: not capturable); operands as
    ``experts_grouped``'s."""
    y = torch.zeros(x.shape[0], x.shape[1], device=x.device, dtype=torch.float32)
    for e in torch.unique(idx).tolist():
        rows, slot = torch.nonzero(idx == e, as_tuple=True)
        out = silu_mul(x[rows] @ w13_t[e]) @ w2_t[e]                                 # [n_e, D]
        y.index_add_(0, rows, out.float() * w[rows, slot, None])
    return y.to(x.dtype)


def experts_dense(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                  w2: torch.Tensor) -> torch.Tensor:
    """All E experts as one wide SwiGLU whose activations are scaled by the (mostly zero) combine weights:
    static shapes, every expert gets its gradient (training). w1/w3 [E, I, D], w2 [E, D, I]."""
    e, i, d = w1.shape
    combine = torch.zeros(x.shape[0], e, dtype=w.dtype, device=x.device).scatter(1, idx, w)   # [M, E]
    h = F.linear(x, torch.cat([w1.reshape(e * i, d), w3.reshape(e * i, d)]))      # [M, 2 E I]
    act = F.silu(h[:, :e * i]) * h[:, e * i:]                                       # [M, E I]
    act = (act.view(-1, e, i) * combine.to(act.dtype)[:, :, None]).view(-1, e * i)
    return F.linear(act, w2.permute(1, 0, 2).reshape(d, e * i))                     # [M, D]
