"""DFlash-style block drafter (docs/drafter.md): a few non-causal layers in the target's width D that
turn [bonus, MASK x L] into per-position draft logits, conditioned on the target's own hidden states.

Legend: D target hidden size, V vocabulary, Bs block size, L = Bs - 1 drafted positions,
F tapped target layers, H query heads, Hkv KV heads, G = H / Hkv query heads per KV head, d head dim,
I drafter MLP width, P context rows already in the drafter cache, n new context rows this call,
T = P + n + Bs keys. Einsum letters: s block rows, t keys, k KV heads, g query heads of one KV head.

Weights (``drafter.*``; stored [out, in], applied ``x @ W.T`` through the one ``linear`` dispatch):
  fc [D, F*D], hidden_norm [D], norm [D] (``own_norm`` only);
  layers.{l}.attn_norm [D], layers.{l}.attn.wq [H*d, D], .wk / .wv [Hkv*d, D], .wo [D, H*d],
  .q_norm / .k_norm [d], layers.{l}.ffn_norm [D], layers.{l}.mlp.w1 / w3 [I, D], .w2 [D, I].
No embedding or head of its own: the block is embedded with the target ``embed`` and the logits are
the target ``head`` of the final norm (the drafter's own ``norm``, or the target's).

Attention (KV injection): queries come from the block only; keys/values are the drafter cache (one
entry per committed token: the tapped target features of layers ``target_layer_ids`` concatenated,
-> fc -> hidden_norm -> this layer's wk/wv, k_norm, RoPE at the token's absolute position) followed
by the block's own K/V. Non-causal: every block row sees every key. Query head h reads KV head
h // G (GQA). q_norm / k_norm are RMSNorms over d per head (values are not normalised), applied before
RoPE. RoPE pairs dims (2i, 2i+1) ("interleaved", the target's layout) or (i, i + d/2) ("rotate_half",
Qwen3's), with frequencies theta^(-2i/d), YaRN-blended when configured. Scale d^-0.5.
The layer is Qwen3's: x += wo(attn(attn_norm(x))); x += SwiGLU(ffn_norm(x)).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ConfigError, ModelConfig
from ..errors import InputError
from ..quant.w16a16 import w16a16_marked
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


def kimi_k26_dflash(cfg: ModelConfig) -> DrafterConfig:
    """The shape of the public Kimi-K2.5 / K2.6 DFlash drafter for a target of the K2 family ``cfg`` (its
    width D is the drafter's): 6 Qwen3 layers, 64 query / 8 KV heads of 128, MLP 18,432, block 8, taps
    [1, 12, 24, 35, 47, 58], mask id 163838, rotate-half RoPE theta 5e4 with YaRN factor 64 over 4,096
    positions (transformers' attention factor for mscale = mscale_all_dim = 1: 1.0), eps 1e-6 (Qwen3's),
    its own final norm. ConfigError where ``cfg`` has no row 163838; a shortened target (``k2_slice``)
    is allowed here, and ``dcfg.check_target(cfg)`` says whether it holds the tapped layers."""
    if cfg.vocab_size <= 163838:
        raise ConfigError(f"the Kimi DFlash mask id 163838 is not below vocab_size {cfg.vocab_size}")
    return DrafterConfig(block_size=8, n_layers=6, n_heads=64, n_kv_heads=8, head_dim=128,
                         intermediate_size=18432, target_layer_ids=(1, 12, 24, 35, 47, 58),
                         mask_token_id=163838, rope_theta=50000.0, rms_norm_eps=1e-6,
                         rope_layout="rotate_half", rope_scaling_type="yarn", rope_factor=64.0,
                         original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
                         rope_attention_factor=1.0, own_norm=True)


def drafter_shapes(cfg: ModelConfig, dcfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every ``drafter.*`` tensor."""
    dm, i = cfg.hidden_size, dcfg.intermediate_size
    hq, hkv = dcfg.n_heads * dcfg.head_dim, dcfg.kv_heads * dcfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"drafter.fc": (dm, dcfg.n_features * dm),
                                          "drafter.hidden_norm": (dm,)}
    for layer in range(dcfg.n_layers):
        p = f"drafter.layers.{layer}."
        hdim = (dcfg.head_dim,)
        shapes.update({p + "attn_norm": (dm,), p + "attn.wq": (hq, dm), p + "attn.wk": (hkv, dm),
                       p + "attn.wv": (hkv, dm), p + "attn.wo": (dm, hq), p + "attn.q_norm": hdim,
                       p + "attn.k_norm": hdim, p + "ffn_norm": (dm,), p + "mlp.w1": (i, dm),
                       p + "mlp.w3": (i, dm), p + "mlp.w2": (dm, i)})
    if dcfg.own_norm:
        shapes["drafter.norm"] = (dm,)
    return shapes


def drafter_linear_names(dcfg: DrafterConfig) -> list[str]:
    """The drafter's linears (fc and every layer's projections): what W16A16 marks."""
    proj = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w3", "mlp.w2")
    return ["drafter.fc"] + [f"drafter.layers.{i}.{p}" for i in range(dcfg.n_layers) for p in proj]


def w16a16_drafter(weights: Mapping[str, Any], dcfg: DrafterConfig) -> Mapping[str, Any]:
    """``weights`` with the drafter's linears marked W16A16 (bf16 weights and activations,
    ``workbench.quant.w16a16``): a read-only view; InputError on access where a value is not bf16."""
    return w16a16_marked(weights, [n for n in drafter_linear_names(dcfg) if n in weights])


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

    k, v: [n_layers, max_len, Hkv, d] in the compute dtype; rows [0, length) are valid, row p holds the
    token at absolute position p.
    """
    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @classmethod
    def empty(cls, dcfg: DrafterConfig, max_len: int, dtype: Any) -> DraftCache:
        shape = (dcfg.n_layers, max_len, dcfg.kv_heads, dcfg.head_dim)
        return cls(k=np.zeros(shape, dtype=dtype), v=np.zeros(shape, dtype=dtype))


def drafter_inv_freq(dcfg: DrafterConfig) -> np.ndarray:
    """Per-pair angular frequency [d/2] float64: theta^(-2i/d); with YaRN, pairs below the correction
    range keep it, pairs above use it / factor, a linear ramp in between (range floored / ceiled on
    the original context, as HF computes it)."""
    d = dcfg.head_dim
    freq = dcfg.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)                 # [d/2]
    if dcfg.rope_scaling_type is None:
        return freq

    def pair(n_rotations: float) -> float:   # the pair whose wavelength fits n_rotations times
        return d * math.log(dcfg.original_max_position_embeddings / (n_rotations * 2 * math.pi)) / (
            2 * math.log(dcfg.rope_theta))
    low = max(math.floor(pair(dcfg.beta_fast)), 0)
    high = min(math.ceil(pair(dcfg.beta_slow)), d - 1)
    span = (high - low) if high != low else 0.001                                         # no 0/0
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / span, 0.0, 1.0)          # [d/2] 1 = interp.
    return freq / dcfg.rope_factor * ramp + freq * (1.0 - ramp)


def drafter_rope(dcfg: DrafterConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [S, d/2] float64 for the drafter's RoPE at integer positions [S] (times the YaRN
    attention factor)."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * drafter_inv_freq(dcfg)[None, :]  # [S, d/2]
    return np.cos(ang) * dcfg.rope_attention_factor, np.sin(ang) * dcfg.rope_attention_factor


def apply_rope_half(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (i, i + d/2) of x [..., S, d] by cos/sin [S, d/2] (HF ``rotate_half``); x's dtype."""
    c = cos.astype(x.dtype, copy=False)                                         # [S, d/2]
    s = sin.astype(x.dtype, copy=False)
    h = x.shape[-1] // 2
    x0, x1 = x[..., :h], x[..., h:]                                             # [..., S, d/2] each
    return np.concatenate([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)          # [..., S, d]


def _heads(dcfg: DrafterConfig, weights: dict[str, Any], name: str, x: np.ndarray, n_heads: int,
           norm: str | None, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Project x [S, D] -> [S, h, d]; with ``norm``, per-head RMSNorm then RoPE at the rows' positions."""
    y = linear(weights, name, x).reshape(x.shape[0], n_heads, dcfg.head_dim)          # [S, h, d]
    if norm is None:
        return y
    y = rmsnorm(y, weights[norm], dcfg.rms_norm_eps)                                  # [S, h, d]
    rope = apply_rope_half if dcfg.rope_layout == "rotate_half" else apply_rope
    return rope(y.transpose(1, 0, 2), cos, sin).transpose(1, 0, 2)                    # [S, h, d]


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
    hq, hkv, g, hd = dcfg.n_heads, dcfg.kv_heads, dcfg.group, dcfg.head_dim
    ctx = linear(weights, "drafter.fc", feats)                                       # [n, D]
    ctx = rmsnorm(ctx, weights["drafter.hidden_norm"], dcfg.rms_norm_eps)            # [n, D]
    cos_c, sin_c = drafter_rope(dcfg, np.arange(p0, start))                          # [n, d/2]
    pos_b = start + np.arange(dcfg.block_size)                                       # [Bs]
    cos_b, sin_b = drafter_rope(dcfg, pos_b)                                         # [Bs, d/2]
    block = np.full(dcfg.block_size, dcfg.mask_token_id, dtype=np.int64)
    block[0] = bonus
    emb = weight(weights, "embed")                                                   # [V, D]
    rows = emb[block] if isinstance(emb, np.ndarray) else as_array(emb, np.float32)[block]
    x = as_array(rows, dtype)                                                        # [Bs, D]
    scale = x.dtype.type(hd ** -0.5)
    for layer in range(dcfg.n_layers):
        p = f"drafter.layers.{layer}."
        cache.k[layer, p0:start] = _heads(dcfg, weights, p + "attn.wk", ctx, hkv, p + "attn.k_norm",
                                          cos_c, sin_c)                              # [n, Hkv, d]
        cache.v[layer, p0:start] = _heads(dcfg, weights, p + "attn.wv", ctx, hkv, None, cos_c, sin_c)
        h = rmsnorm(x, weights[p + "attn_norm"], dcfg.rms_norm_eps)                  # [Bs, D]
        q = _heads(dcfg, weights, p + "attn.wq", h, hq, p + "attn.q_norm", cos_b, sin_b)   # [Bs, H, d]
        k_b = _heads(dcfg, weights, p + "attn.wk", h, hkv, p + "attn.k_norm", cos_b, sin_b)  # [Bs, Hkv, d]
        v_b = _heads(dcfg, weights, p + "attn.wv", h, hkv, None, cos_b, sin_b)       # [Bs, Hkv, d]
        k = np.concatenate([cache.k[layer, :start], k_b])                           # [T, Hkv, d]
        v = np.concatenate([cache.v[layer, :start], v_b])                           # [T, Hkv, d]
        qg = q.reshape(dcfg.block_size, hkv, g, hd)                       # [Bs, Hkv, G, d]: head h = k*G + g
        s = np.einsum("skgd,tkd->kgst", qg, k) * scale                              # [Hkv, G, Bs, T]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        a = s / s.sum(axis=-1, keepdims=True)                                       # [Hkv, G, Bs, T], no mask
        o = np.einsum("kgst,tkd->skgd", a, v).reshape(dcfg.block_size, hq * hd)     # [Bs, H*d]
        x = x + linear(weights, p + "attn.wo", o)                                   # [Bs, D]
        x = x + swiglu(weights, p + "mlp", rmsnorm(x, weights[p + "ffn_norm"], dcfg.rms_norm_eps))  # [Bs, D]
    cache.length = start
    if dcfg.own_norm:                                                               # the drafter's own
        h = rmsnorm(x[1:], weights["drafter.norm"], dcfg.rms_norm_eps)              # [L, D]
    else:                                                                           # the target's
        h = rmsnorm(x[1:], weights["norm"], cfg.rms_norm_eps)                       # [L, D]
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
