"""DFlash-style block drafter (docs/ddtree.md): a few non-causal layers in the target's width D that
turn [bonus, MASK x L] into per-position draft logits, conditioned on the target's own hidden states.

Legend: D target hidden size, V vocabulary, Bs block size, L = Bs - 1 drafted positions,
F tapped target layers, H drafter heads, d drafter head dim, I drafter MLP width,
P context rows already in the drafter cache, n new context rows this call, T = P + n + Bs keys.

Weights (``drafter.*``; stored [out, in], applied ``x @ W.T`` through the one ``linear`` dispatch):
  fc [D, F*D], hidden_norm [D];
  layers.{l}.attn_norm [D], layers.{l}.attn.wq / wk / wv [H*d, D], .wo [D, H*d], .q_norm / .k_norm [d],
  layers.{l}.ffn_norm [D], layers.{l}.mlp.w1 / w3 [I, D], .w2 [D, I].
No embedding or head of its own: the block is embedded with the target ``embed`` and the logits are
the target ``head(rmsnorm(h, target norm))``.

Attention (KV injection): queries come from the block only; keys/values are the drafter cache (one
entry per committed token: context features -> fc -> hidden_norm -> this layer's wk/wv, k_norm, RoPE at
the token's absolute position) followed by the block's own K/V. Non-causal: every block row sees every
key. RoPE is plain (theta^(-2i/d), no YaRN) on interleaved pairs (2i, 2i+1), the target's layout,
applied to q and k after q_norm / k_norm. Scale d^-0.5.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..reference.layers import as_array, linear, rmsnorm, swiglu, weight
from ..reference.rope import apply_rope
from .config import DrafterConfig

PARAM_LIMIT = 350_000          # default_drafter_config keeps a 2-layer drafter only under this size


def default_drafter_config(cfg: ModelConfig) -> DrafterConfig:
    """The drafter preset for a target (used for the golden bundles' random drafters).

    Taps layer ids spread evenly (rounded) over [1, N - 3], F = min(5, N - 1) of them, like DFlash,
    when the target has N >= 8 layers; over [0, N - 2], F = min(3, N), for smaller ones (tiny: 0, 1, 2;
    tiny2: 0, 2, 4; k2: 1, 15, 30, 44, 58). Head dim 32 (128 for D >= 1024), D / (2 head_dim) heads, MLP
    width D, block 8, mask id V - 1; two layers when that stays under ``PARAM_LIMIT`` parameters,
    else one. A size rule for random-weight tests, not a trained architecture.
    """
    n = cfg.num_hidden_layers
    lo, hi, f = (1, n - 3, min(5, n - 1)) if n >= 8 else (0, max(n - 2, 0), min(3, n))
    ids = sorted({round(lo + i * (hi - lo) / (f - 1)) for i in range(f)}) if f > 1 else [lo]
    head_dim = 128 if cfg.hidden_size >= 1024 else 32
    base = DrafterConfig(block_size=8, n_layers=2, n_heads=max(1, cfg.hidden_size // (2 * head_dim)),
                         head_dim=head_dim, intermediate_size=cfg.hidden_size,
                         target_layer_ids=tuple(int(i) for i in ids), mask_token_id=cfg.vocab_size - 1,
                         rope_theta=10000.0, rms_norm_eps=cfg.rms_norm_eps)
    if drafter_param_count(cfg, base) > PARAM_LIMIT:
        base = dataclasses.replace(base, n_layers=1)
    return base


def drafter_shapes(cfg: ModelConfig, dcfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every ``drafter.*`` tensor."""
    dm, hd, i = cfg.hidden_size, dcfg.n_heads * dcfg.head_dim, dcfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"drafter.fc": (dm, dcfg.n_features * dm),
                                          "drafter.hidden_norm": (dm,)}
    for layer in range(dcfg.n_layers):
        p = f"drafter.layers.{layer}."
        hdim = (dcfg.head_dim,)
        shapes.update({p + "attn_norm": (dm,), p + "attn.wq": (hd, dm), p + "attn.wk": (hd, dm),
                       p + "attn.wv": (hd, dm), p + "attn.wo": (dm, hd), p + "attn.q_norm": hdim,
                       p + "attn.k_norm": hdim, p + "ffn_norm": (dm,), p + "mlp.w1": (i, dm),
                       p + "mlp.w3": (i, dm), p + "mlp.w2": (dm, i)})
    return shapes


def drafter_param_count(cfg: ModelConfig, dcfg: DrafterConfig) -> int:
    return int(sum(np.prod(s) for s in drafter_shapes(cfg, dcfg).values()))


def random_drafter_weights(cfg: ModelConfig, dcfg: DrafterConfig, seed: int) -> dict[str, np.ndarray]:
    """Deterministic random ``drafter.*`` weights, float32 arrays whose values are float16-exact.

    Each tensor has its own stream keyed by (seed, name). Linears ~ N(0, 1/fan_in); norm weights
    1 + N(0, 0.1^2) (not all ones, so a missing norm shows).
    Storing them as float16 (halving the bundle bytes) changes no value and so no result.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative int, got {seed!r}")
    dcfg.check_target(cfg)
    out: dict[str, np.ndarray] = {}
    for name, shape in drafter_shapes(cfg, dcfg).items():
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])    # one stream per tensor
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = w.astype(np.float16).astype(np.float32)
    return out


def check_drafter_weights(cfg: ModelConfig, dcfg: DrafterConfig, weights: dict[str, Any]) -> None:
    """InputError when a ``drafter.*`` tensor is missing or has the wrong shape (INT4-packed is allowed)."""
    if "drafter.fc" not in weights and "drafter.fc.packed" not in weights:
        raise InputError("the dflash drafter needs drafter.* weights, and these weights have none")
    for name, shape in drafter_shapes(cfg, dcfg).items():
        if name in weights:
            got = tuple(np.shape(getattr(weights[name], "bits", weights[name])))    # bf16 arrays keep .bits
            if got != shape:
                raise InputError(f"{name} has shape {got}, the drafter config wants {shape}")
        elif name + ".packed" not in weights:
            raise InputError(f"missing drafter weight {name!r}")


@dataclass
class DraftCache:
    """Per drafter layer, the rotated keys and the values of every committed token's context feature.

    k, v: [n_layers, max_len, H, d] in the compute dtype; rows [0, length) are valid, row p holds the
    token at absolute position p.
    """
    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, dcfg: DrafterConfig, max_len: int, dtype: Any) -> DraftCache:
        shape = (dcfg.n_layers, max_len, dcfg.n_heads, dcfg.head_dim)
        return cls(k=np.zeros(shape, dtype=dtype), v=np.zeros(shape, dtype=dtype))


def rope_plain(dcfg: DrafterConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [S, d/2] float64 for the drafter's plain RoPE at integer positions [S]."""
    inv = dcfg.rope_theta ** (-np.arange(0, dcfg.head_dim, 2, dtype=np.float64) / dcfg.head_dim)  # [d/2]
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]                         # [S, d/2]
    return np.cos(ang), np.sin(ang)


def _heads(dcfg: DrafterConfig, weights: dict[str, Any], name: str, x: np.ndarray,
           norm: str | None, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Project x [S, D] -> [S, H, d]; with ``norm``, per-head RMSNorm then RoPE at the rows' positions."""
    y = linear(weights, name, x).reshape(x.shape[0], dcfg.n_heads, dcfg.head_dim)    # [S, H, d]
    if norm is None:
        return y
    y = rmsnorm(y, weights[norm], dcfg.rms_norm_eps)                                 # [S, H, d]
    return apply_rope(y.transpose(1, 0, 2), cos, sin).transpose(1, 0, 2)             # [S, H, d]


def dflash_propose(cfg: ModelConfig, dcfg: DrafterConfig, weights: dict[str, Any], cache: DraftCache,
                   bonus: int, start: int, new_features: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """Draft logits [L, V] for positions start+1 .. start+L given the bonus token at position ``start``.

    new_features: [n, F*D] target features (tapped layers concatenated in ``target_layer_ids`` order)
    of the tokens at positions start-n .. start-1, committed since the last call; their context K/V is
    appended to ``cache`` (which must then hold exactly ``start`` rows). Block K/V are never kept.
    """
    feats = np.asarray(new_features, dtype=dtype)
    n = feats.shape[0]
    if cache.length + n != start:
        raise InputError(f"drafter cache holds {cache.length} rows + {n} new, but the bonus sits at {start}")
    if start > cache.k.shape[1]:
        raise InputError(f"drafter cache full: {start} rows exceed max_len {cache.k.shape[1]}")
    p0 = cache.length
    ctx = linear(weights, "drafter.fc", feats)                                       # [n, D]
    ctx = rmsnorm(ctx, weights["drafter.hidden_norm"], dcfg.rms_norm_eps)            # [n, D]
    cos_c, sin_c = rope_plain(dcfg, np.arange(p0, start))                            # [n, d/2]
    pos_b = start + np.arange(dcfg.block_size)                                       # [Bs]
    cos_b, sin_b = rope_plain(dcfg, pos_b)                                           # [Bs, d/2]
    block = np.full(dcfg.block_size, dcfg.mask_token_id, dtype=np.int64)
    block[0] = bonus
    emb = weight(weights, "embed")                                                   # [V, D]
    rows = emb[block] if isinstance(emb, np.ndarray) else as_array(emb, np.float32)[block]
    x = as_array(rows, dtype)                                                        # [Bs, D]
    scale = x.dtype.type(dcfg.head_dim ** -0.5)
    for layer in range(dcfg.n_layers):
        p = f"drafter.layers.{layer}."
        cache.k[layer, p0:start] = _heads(dcfg, weights, p + "attn.wk", ctx, p + "attn.k_norm", cos_c, sin_c)
        cache.v[layer, p0:start] = _heads(dcfg, weights, p + "attn.wv", ctx, None, cos_c, sin_c)
        h = rmsnorm(x, weights[p + "attn_norm"], dcfg.rms_norm_eps)                  # [Bs, D]
        q = _heads(dcfg, weights, p + "attn.wq", h, p + "attn.q_norm", cos_b, sin_b)  # [Bs, H, d]
        k_b = _heads(dcfg, weights, p + "attn.wk", h, p + "attn.k_norm", cos_b, sin_b)  # [Bs, H, d]
        v_b = _heads(dcfg, weights, p + "attn.wv", h, None, cos_b, sin_b)            # [Bs, H, d]
        k = np.concatenate([cache.k[layer, :start], k_b])                           # [T, H, d]
        v = np.concatenate([cache.v[layer, :start], v_b])                           # [T, H, d]
        s = np.einsum("shd,thd->hst", q, k) * scale                                 # [H, Bs, T]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        a = s / s.sum(axis=-1, keepdims=True)                                       # [H, Bs, T] non-causal
        o = np.einsum("hst,thd->shd", a, v).reshape(dcfg.block_size, -1)            # [Bs, H*d]
        x = x + linear(weights, p + "attn.wo", o)                                   # [Bs, D]
        x = x + swiglu(weights, p + "mlp", rmsnorm(x, weights[p + "ffn_norm"], dcfg.rms_norm_eps))  # [Bs, D]
    cache.length = start
    h = rmsnorm(x[1:], weights["norm"], cfg.rms_norm_eps)                           # [L, D]
    return linear(weights, "head", h)                                               # [L, V]


class DFlashDrafter:
    """The dflash drafter bound to one generation: weights, config and its context cache.

    ``propose(state)`` reads ``state.bonus``, ``state.start`` and ``state.new_features`` (see
    ``dflash_propose``) and returns draft logits [L, V].
    """

    def __init__(self, cfg: ModelConfig, weights: dict[str, Any], dcfg: DrafterConfig, max_len: int,
                 dtype: Any = np.float32) -> None:
        dcfg.check_target(cfg)
        check_drafter_weights(cfg, dcfg, weights)
        self.cfg, self.weights, self.dcfg, self.dtype = cfg, weights, dcfg, dtype
        self.block_size = dcfg.block_size
        self.capture = dcfg.target_layer_ids
        self.cache = DraftCache.empty(dcfg, max_len, dtype)

    def propose(self, state: Any) -> np.ndarray:
        return dflash_propose(self.cfg, self.dcfg, self.weights, self.cache, state.bonus, state.start,
                              state.new_features, self.dtype)
