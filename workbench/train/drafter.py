"""The DFlash drafter in torch, twin of workbench/ddtree/dflash.py, trained with many anchors per sequence.

Legend: B sequences, T tokens per sequence, A anchors per sequence, Bs block size, L = Bs - 1, D width,
F tapped target layers, H heads, d head dim, V vocabulary.

One forward handles A blocks of one sequence at once (the DFlash training layout): keys are
[context rows 0..T-1 || block rows of every anchor]; a row of block j (anchor a_j, the bonus token at
position a_j) sees the context rows at positions < a_j and every row of its own block, nothing else.
That is exactly what ``dflash_propose`` computes for a bonus at ``start = a_j`` with the drafter cache
holding rows 0..a_j-1, so each block's logits equal the numpy drafter's at that anchor. The target's
embedding, final norm and head are shared and frozen (passed in, never trained here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..ddtree.config import DrafterConfig
from ..ddtree.dflash import drafter_shapes
from ..errors import InputError
from ..torchk2.layers import apply_rope, rmsnorm
from ..torchk2.model import SwiGLU, TorchTarget, _param


class DraftLayer(nn.Module):
    def __init__(self, d: int, dcfg: DrafterConfig) -> None:
        super().__init__()
        hd = dcfg.n_heads * dcfg.head_dim
        self.attn_norm, self.ffn_norm = _param(d), _param(d)
        self.wq, self.wk, self.wv, self.wo = _param(hd, d), _param(hd, d), _param(hd, d), _param(d, hd)
        self.q_norm, self.k_norm = _param(dcfg.head_dim), _param(dcfg.head_dim)
        self.mlp = SwiGLU(d, dcfg.intermediate_size)


class TorchDrafter(nn.Module):
    def __init__(self, cfg: ModelConfig, dcfg: DrafterConfig) -> None:
        super().__init__()
        dcfg.check_target(cfg)
        self.cfg, self.dcfg = cfg, dcfg
        d = cfg.hidden_size
        self.fc = _param(d, dcfg.n_features * d)
        self.hidden_norm = _param(d)
        self.layers = nn.ModuleList(DraftLayer(d, dcfg) for _ in range(dcfg.n_layers))
        inv = dcfg.rope_theta ** (-np.arange(0, dcfg.head_dim, 2, dtype=np.float64) / dcfg.head_dim)
        ang = np.arange(cfg.max_position_embeddings, dtype=np.float64)[:, None] * inv[None, :]
        self.register_buffer("rope_cos", torch.from_numpy(np.cos(ang)), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(np.sin(ang)), persistent=False)

    def _heads(self, w: torch.Tensor, x: torch.Tensor, norm: torch.Tensor | None,
               pos: torch.Tensor | None) -> torch.Tensor:
        """x [B, S, D] -> [B, H, S, d]; with ``norm``: per-head RMSNorm, then RoPE at pos [B, S]."""
        b, s, _ = x.shape
        y = F.linear(x, w).view(b, s, self.dcfg.n_heads, self.dcfg.head_dim).transpose(1, 2)
        if norm is None:
            return y
        y = rmsnorm(y, norm, self.dcfg.rms_norm_eps)
        return apply_rope(y, self.rope_cos[pos][:, None], self.rope_sin[pos][:, None])

    def forward(self, target: TorchTarget, tokens: torch.Tensor, feats: torch.Tensor,
                anchors: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, A, L, V] for positions a+1..a+L of every anchor a.

        tokens [B, T] (token at each position; the anchor's token is the block's bonus), feats [B, T, F*D]
        tapped target features per position, anchors [B, A] ints with 0 <= a and a + L < T.
        """
        dcfg = self.dcfg
        b, t = tokens.shape
        a_n, bs = anchors.shape[1], dcfg.block_size
        if int(anchors.min()) < 0 or int(anchors.max()) + dcfg.n_drafted >= t:
            raise InputError(f"anchors must lie in [0, {t - dcfg.n_drafted}), got "
                             f"{int(anchors.min())}..{int(anchors.max())}")
        dev = tokens.device
        ctx = rmsnorm(F.linear(feats, self.fc), self.hidden_norm, dcfg.rms_norm_eps)           # [B, T, D]
        offs = torch.arange(bs, device=dev)
        pos_b = (anchors[:, :, None] + offs).reshape(b, a_n * bs)                             # [B, A*Bs]
        blk = torch.full((b, a_n, bs), dcfg.mask_token_id, dtype=torch.long, device=dev)
        blk[:, :, 0] = tokens.gather(1, anchors)
        x = target.embed[blk.reshape(b, a_n * bs)]                                             # [B, A*Bs, D]
        pos_c = torch.arange(t, device=dev).expand(b, t)                                       # [B, T]
        # row of block j sees context rows < a_j and the rows of block j
        see_ctx = pos_c[:, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]        # [B, A*Bs, T]
        j = torch.arange(a_n, device=dev).repeat_interleave(bs)
        see_blk = (j[:, None] == j[None, :]).expand(b, -1, -1)                       # [B, A*Bs, A*Bs]
        mask = torch.cat([see_ctx, see_blk], dim=2)[:, None]                         # [B, 1, A*Bs, T+A*Bs]
        scale = dcfg.head_dim ** -0.5
        for layer in self.layers:
            h = rmsnorm(x, layer.attn_norm, dcfg.rms_norm_eps)
            q = self._heads(layer.wq, h, layer.q_norm, pos_b)
            k = torch.cat([self._heads(layer.wk, ctx, layer.k_norm, pos_c),
                           self._heads(layer.wk, h, layer.k_norm, pos_b)], dim=2)
            v = torch.cat([self._heads(layer.wv, ctx, None, None),
                           self._heads(layer.wv, h, None, None)], dim=2)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)      # [B, H, A*Bs, d]
            x = x + F.linear(o.transpose(1, 2).reshape(b, a_n * bs, -1), layer.wo)
            x = x + layer.mlp(rmsnorm(x, layer.ffn_norm, dcfg.rms_norm_eps))
        x = x.view(b, a_n, bs, -1)[:, :, 1:]                                                   # [B, A, L, D]
        return F.linear(rmsnorm(x, target.norm, self.cfg.rms_norm_eps), target.head)          # [B, A, L, V]

    # ---- internal names <-> tensors -----------------------------------------------------------
    def tensor(self, name: str) -> torch.Tensor:
        parts = name.split(".")
        if parts[0] != "drafter":
            raise InputError(f"no drafter tensor for weight {name!r}")
        obj: Any = self
        try:
            for p in parts[1:]:
                obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        except (IndexError, AttributeError):
            raise InputError(f"no drafter tensor for weight {name!r}") from None
        return obj

    def weights_dict(self) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {name: self.tensor(_torch_name(name)).detach().to("cpu", torch.float32).numpy().copy()
                    for name in drafter_shapes(self.cfg, self.dcfg)}

    def load_weights_dict(self, weights: dict[str, Any]) -> None:
        from ..reference.layers import as_array
        with torch.no_grad():
            for name, shape in drafter_shapes(self.cfg, self.dcfg).items():
                if name not in weights:
                    raise InputError(f"missing drafter weight {name!r}")
                a = as_array(weights[name], np.float64)
                if a.shape != shape:
                    raise InputError(f"{name} has shape {a.shape}, the drafter config wants {shape}")
                t = self.tensor(_torch_name(name))
                t.copy_(torch.from_numpy(a).to(t.dtype))

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in self.named_parameters():
                p.copy_(torch.ones_like(p) if p.ndim == 1 else torch.randn(p.shape, generator=g) * std)


def _torch_name(name: str) -> str:
    """drafter.layers.0.attn.wq -> drafter.layers.0.wq (the torch layer has no attn sub-module)."""
    return name.replace(".attn.", ".")


def block_loss(logits: torch.Tensor, labels: torch.Tensor, gamma: float) -> torch.Tensor:
    """Cross-entropy over the L drafted positions, weighted exp(-(k-1)/gamma) (k = 1..L), weighted mean.

    logits [B, A, L, V], labels [B, A, L]."""
    n = logits.shape[2]
    w = torch.exp(-torch.arange(n, device=logits.device, dtype=torch.float32) / gamma)          # [L]
    ce = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
    return (ce * w).sum() / (w.sum() * labels.shape[0] * labels.shape[1])


def anchor_labels(tokens: torch.Tensor, anchors: torch.Tensor, n_drafted: int) -> torch.Tensor:
    """labels [B, A, L]: tokens at a+1..a+L for every anchor a."""
    idx = anchors[:, :, None] + torch.arange(1, n_drafted + 1, device=tokens.device)
    return tokens.gather(1, idx.flatten(1)).view(idx.shape)
