"""One K2 decoder layer in stock PyTorch, written for speed at batch 1: the engine's baseline (``bench k2``).

Legend: N new tokens, T = start + N keys, D model width, H heads, Dn qk_nope, R qk_rope, V v_head,
C kv_lora_rank, Q q_lora_rank, E routed experts, K experts per token, I expert (or dense) width.

What a strong PyTorch user writes (DeepSeek-V3's inference ``model.py`` style, absorbed MLA):
- q_a (or q) and kv_a fused into one GEMM; q_nope absorbed through kv_b's key half, one GEMM of all
  H*N queries [c_kv || k_pe] against the latent cache rows [T, C+R]; softmax in float32; the
  context [H, N, C] through kv_b's value half, then o_proj. The N new cache rows are written at
  [start, start + N) first; new row i sees all cached rows and new row j iff ``mask[i, j]``
  (the DDTree ancestor-or-self mask; ``tril`` for a causal prefill).
- noaux_tc router in float32 (sigmoid, correction bias for selection only, group limit, top-k).
- routed experts by ``torch._grouped_mm`` over the N*K (token, expert) pairs sorted by expert, offsets
  computed on the device (no host sync, so it captures in a CUDA graph); gate/up fused, then down,
  weighted combine per token. Where ``_grouped_mm`` does not run (older torch builds) a per-expert
  loop computes the same, with host syncs (``moe_path`` says which ran).
- the shared expert (and the dense MLP of layers < first_k_dense_replace) as plain fused gate/up + down.
Everything is in the layer's dtype (bfloat16 on the GPU) with float32 norms, rope, router and softmax.
The maths are ``torchk2.layers``', which the trained model (``torchk2.model``) runs too: norms, rope,
latent rows, the absorbed attention core, the router and the routed experts; this file holds the
layer's fused weights, its latent cache and the parts ``bench k2`` times.
``forward(x, mask, positions, start)`` has static shapes per (N, start) and no host sync: capture it
(or any part) once per shape and replay.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..reference.layers import dense_weight, weight
from ..reference.rope import rope_attention_factor, yarn_inv_freq
from .int4 import dequantize_int4_torch, seeded_bf16_experts  # noqa: F401 - the layer's INT4 helpers
from .layers import (
    absorbed_attention,
    apply_rope,
    experts_grouped,
    experts_loop,
    latent_rows,
    rmsnorm,
    route,
    silu_mul,
)

MOE_IMPLS = ("auto", "grouped_mm", "loop")


def _torch():
    import torch
    return torch


def grouped_mm_supported(device: Any, dtype: Any) -> bool:
    """Whether ``torch._grouped_mm`` runs here for (device, dtype) (tried once on a tiny problem)."""
    torch = _torch()
    key = (str(device), str(dtype))
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                a = torch.ones(16, 16, device=device, dtype=dtype)
                b = torch.ones(2, 16, 16, device=device, dtype=dtype).transpose(1, 2)
                offs = torch.tensor([8, 16], device=device, dtype=torch.int32)
                ok = bool(torch._grouped_mm(a, b, offs=offs).float().eq(16).all())
            except (RuntimeError, NotImplementedError, TypeError, ValueError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


_GROUPED_OK: dict[tuple[str, str], bool] = {}


class TorchLayer:
    """Layer ``layer`` of ``cfg`` as torch tensors on one device (``from_weights`` / ``from_seeded``).

    ``cache`` [max_len, C+R] holds the latent rows, ``length`` of them valid; ``step`` appends.
    Parts (each capturable on its own): ``attention``, ``router``, ``routed_experts``, ``shared_expert``,
    ``dense_mlp``; ``ffn`` and ``forward`` compose them.
    """

    def __init__(self, cfg: ModelConfig, layer: int, params: dict[str, Any], max_len: int,
                 moe_impl: str = "auto"):
        torch = _torch()
        if moe_impl not in MOE_IMPLS:
            raise InputError(f"moe_impl must be one of {', '.join(MOE_IMPLS)}, got {moe_impl!r}")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise InputError(f"max_len must be a positive int, got {max_len!r}")
        self.cfg, self.layer, self.p = cfg, layer, params
        self.is_moe = cfg.is_moe_layer(layer)
        ref = params["wo"]
        self.device, self.dtype = ref.device, ref.dtype
        self.max_len = max_len                            # the cache has it rounded up to a multiple of 8
        self.cache = torch.zeros(_round8(max_len), cfg.kv_cache_dim, device=self.device, dtype=self.dtype)
        self.length = 0
        self.inv_freq = torch.tensor(yarn_inv_freq(cfg), dtype=torch.float64, device=self.device)  # [R/2]
        self.rope_m = rope_attention_factor(cfg)
        self.moe_path = None
        if self.is_moe:
            fast = grouped_mm_supported(self.device, self.dtype)
            if moe_impl == "grouped_mm" and not fast:
                raise InputError(f"torch._grouped_mm does not run on {self.device} / {self.dtype} here")
            use = moe_impl == "grouped_mm" or (moe_impl == "auto" and fast)
            self.moe_path = "grouped_mm" if use else "loop"
            self.expert_ids = torch.arange(cfg.n_routed_experts, device=self.device)   # once, not per step

    # ---- builders ---------------------------------------------------------------------------
    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: Mapping[str, Any], layer: int, *, device: Any = "cpu",
                     dtype: Any = None, max_len: int = 4096, moe_impl: str = "auto") -> TorchLayer:
        """From a weights dict with internal names (FP arrays: float32, float16 or BF16Array)."""
        torch = _torch()
        dtype = torch.float32 if dtype is None else dtype
        _check_layer(cfg, layer)

        def get(name: str, dt: Any = dtype):
            return _tensor(dense_weight(weights, name, np.float32)).to(device, dt)

        def get_1d(name: str):
            return _tensor(np.asarray(weight(weights, name), dtype=np.float32)).to(device)
        return cls(cfg, layer, _assemble(cfg, layer, get, get_1d, _experts_from(cfg, weights, layer, get)),
                   max_len, moe_impl)

    @classmethod
    def from_seeded(cls, cfg: ModelConfig, seed: int, layer: int, *, device: Any = "cuda", dtype: Any = None,
                    max_len: int = 4096, moe_impl: str = "auto", chunk: int = 32,
                    workers: int | None = None) -> TorchLayer:
        """The seeded model's layer (``workbench.seeded``, layout ``bf16``) built on ``device`` directly.

        Non-expert tensors upload their bf16 bits; routed experts upload their INT4 words and scales
        ``chunk`` experts at a time, generated on ``workers`` host threads (default: one per core, at
        most 16) while the device dequantizes the previous chunk: no float32 expert copy on the host.
        """
        torch = _torch()
        from .. import seeded
        dtype = torch.bfloat16 if dtype is None else dtype
        workers = workers or min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 4)
        _check_layer(cfg, layer)

        def bf16(name: str):
            bits = seeded.fp_bits(cfg, seed, name)
            return torch.from_numpy(bits.view(np.int16)).to(device).view(torch.bfloat16)

        def get(name: str, dt: Any = dtype):
            return bf16(name).to(dt)

        def get_1d(name: str):
            return bf16(name).float()

        def experts():
            return seeded_bf16_experts(cfg, seed, layer, device, dtype, chunk, workers)
        moe = experts if cfg.is_moe_layer(layer) else None
        return cls(cfg, layer, _assemble(cfg, layer, get, get_1d, moe), max_len, moe_impl)

    # ---- parts ------------------------------------------------------------------------------
    def rope_cos_sin(self, positions):
        """cos, sin [N, R/2] float32 (angles in float64, as the reference), times the YaRN factor."""
        ang = positions.double()[:, None] * self.inv_freq                       # [N, R/2]
        return (ang.cos() * self.rope_m).float(), (ang.sin() * self.rope_m).float()

    def attention(self, xn, mask, positions, start: int):
        """Absorbed MLA of the normed input xn [N, D]; writes cache rows [start, start+N); -> [N, D]."""
        cfg, p = self.cfg, self.p
        n, h, dn = xn.shape[0], cfg.num_attention_heads, cfg.qk_nope_head_dim
        a = xn @ p["w_qkv_a"].T                                                 # [N, Q (or H(Dn+R)) + C+R]
        split = p["w_qkv_a"].shape[0] - cfg.kv_cache_dim
        if cfg.q_lora_rank is not None:
            q = rmsnorm(a[:, :split], p["q_norm"], cfg.mla_norm_eps) @ p["wq_b"].T   # [N, H(Dn+R)]
        else:
            q = a[:, :split]
        q = q.view(n, h, cfg.qk_head_dim).transpose(0, 1)                       # [H, N, Dn+R]
        cos, sin = self.rope_cos_sin(positions)                                 # [N, R/2]
        self.cache[start:start + n] = latent_rows(a[:, split:], p["kv_norm"], cos, sin, cfg.mla_norm_eps)
        q = _torch().cat((q[..., :dn], apply_rope(q[..., dn:], cos, sin)), -1)  # [H, N, Dn+R]
        lat = self.cache[None, :_round8(start + n)]                             # [1, T8, C+R]
        o = absorbed_attention(q[None], lat, p["wkv_b"], dn, cfg.softmax_scale, start, mask)   # [1, H, N, V]
        return o[0].transpose(0, 1).reshape(n, -1) @ p["wo"].T                   # [N, D]

    def router(self, xn):
        """noaux_tc routing of xn [N, D]: (idx int64 [N, K], w float32 [N, K], scaling factor included)."""
        return route(self.cfg, xn, self.p["gate"], self.p["gate_bias"])

    def routed_experts(self, xn, idx, w):
        """sum_k w[:, k] Expert_idx[:, k](xn): [N, D] in the layer dtype."""
        if self.moe_path == "grouped_mm":
            return experts_grouped(xn, idx, w, self.p["w13_t"], self.p["w2_t"], self.expert_ids)
        return experts_loop(xn, idx, w, self.p["w13_t"], self.p["w2_t"])

    def _swiglu(self, xn, w13, w2):
        return silu_mul(xn @ w13.T) @ w2.T                                      # [N, 2I] -> [N, D]

    def shared_expert(self, xn):
        """The shared expert(s) of a MoE layer, one fused MLP: [N, D]."""
        return self._swiglu(xn, self.p["shared_w13"], self.p["shared_w2"])

    def dense_mlp(self, xn):
        """The dense SwiGLU of a layer < first_k_dense_replace: [N, D]."""
        return self._swiglu(xn, self.p["w13"], self.p["w2"])

    def ffn(self, xn):
        if not self.is_moe:
            return self.dense_mlp(xn)
        idx, w = self.router(xn)
        y = self.routed_experts(xn, idx, w)
        return y + self.shared_expert(xn) if "shared_w13" in self.p else y

    def forward(self, x, mask, positions, start: int):
        """The layer on x [N, D]: h = x + MLA(norm x), y = h + FFN(norm h); cache rows [start, start+N)
        written, ``length`` untouched. Static shapes per (N, start), no host sync (grouped_mm path)."""
        eps = self.cfg.rms_norm_eps
        h = x + self.attention(rmsnorm(x, self.p["attn_norm"], eps), mask, positions, start)
        return h + self.ffn(rmsnorm(h, self.p["ffn_norm"], eps))

    def normed(self, x, which: str = "attn_norm"):
        """RMSNorm of x with the layer's ``attn_norm`` or ``ffn_norm`` (the parts' input)."""
        return rmsnorm(x, self.p[which], self.cfg.rms_norm_eps)

    def step(self, x, ancestor_mask, positions):
        """N new tokens x [N, D] at ``positions`` [N] under ``ancestor_mask`` [N, N] (bool, row i sees
        new row j; all cached rows are visible): appends their cache rows, returns y [N, D]."""
        self.check_inputs(x, ancestor_mask, positions, self.length)
        y = self.forward(x, ancestor_mask, positions, self.length)
        self.length += x.shape[0]
        return y

    def check_inputs(self, x, mask, positions, start: int) -> None:
        """InputError (one line) unless the inputs fit this layer (shapes, dtypes, device, cache room)."""
        torch = _torch()
        d = self.cfg.hidden_size
        if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != d:
            raise InputError(f"x must be a [N, {d}] tensor, got {_desc(x)}")
        n = x.shape[0]
        if x.dtype != self.dtype or x.device != self.device:
            raise InputError(f"x must be {self.dtype} on {self.device}, got {x.dtype} on {x.device}")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (n, n) \
                or mask.device != self.device:
            raise InputError(f"ancestor_mask must be a bool [{n}, {n}] tensor on {self.device}, "
                             f"got {_desc(mask)}")
        if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 \
                or tuple(positions.shape) != (n,) or positions.device != self.device:
            raise InputError(f"positions must be an int64 [{n}] tensor on {self.device}, "
                             f"got {_desc(positions)}")
        if start + n > self.max_len:
            raise InputError(f"latent cache full: {start} + {n} rows exceed max_len {self.max_len}")


def _round8(n: int) -> int:
    """n rounded up to a multiple of 8: a key count that keeps cuBLAS on its aligned kernels (the
    padding keys are masked)."""
    return -(-n // 8) * 8


def _tensor(a: np.ndarray):
    """A CPU tensor of ``a`` (copied when ``a`` is read-only or not contiguous, e.g. a memmap)."""
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, order="C")
    return _torch().from_numpy(a)


def _desc(t: Any) -> str:
    shape = getattr(t, "shape", None)
    return f"{getattr(t, 'dtype', type(t).__name__)} {tuple(shape) if shape is not None else ''}".strip()


def _check_layer(cfg: ModelConfig, layer: int) -> None:
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < cfg.num_hidden_layers:
        raise InputError(f"layer must be an int in [0, {cfg.num_hidden_layers}), got {layer!r}")


def _experts_from(cfg: ModelConfig, weights: Mapping[str, Any], layer: int,
                  get: Callable[..., Any]) -> Callable[[], tuple[Any, Any]] | None:
    if not cfg.is_moe_layer(layer):
        return None

    def experts():
        torch = _torch()
        p = f"layers.{layer}.ffn.experts."
        ids = range(cfg.n_routed_experts)
        w13 = torch.stack([torch.cat((get(f"{p}{e}.w1"), get(f"{p}{e}.w3"))) for e in ids])
        w2 = torch.stack([get(f"{p}{e}.w2") for e in ids])
        return w13, w2                                                          # [E, 2Mi, D], [E, D, Mi]
    return experts


def _assemble(cfg: ModelConfig, layer: int, get: Callable[..., Any], get_1d: Callable[[str], Any],
              experts: Callable[[], tuple[Any, Any]] | None) -> dict[str, Any]:
    """The layer's tensors in compute form: fused gate/up and q_a/kv_a, kv_b split, expert stacks
    viewed [E, in, out] (column-major per expert, what ``_grouped_mm`` takes as its second operand)."""
    torch = _torch()
    a, f = f"layers.{layer}.attn.", f"layers.{layer}.ffn."
    p: dict[str, Any] = {"attn_norm": get_1d(f"layers.{layer}.attn_norm"),
                         "ffn_norm": get_1d(f"layers.{layer}.ffn_norm"), "kv_norm": get_1d(a + "kv_norm")}
    if cfg.q_lora_rank is not None:
        p["w_qkv_a"] = torch.cat((get(a + "wq_a"), get(a + "wkv_a")))          # [Q + C + R, D]
        p["q_norm"], p["wq_b"] = get_1d(a + "q_norm"), get(a + "wq_b")
    else:
        p["w_qkv_a"] = torch.cat((get(a + "wq"), get(a + "wkv_a")))            # [H(Dn+R) + C + R, D]
    p["wkv_b"] = get(a + "wkv_b")                                               # [H (Dn+V), C]
    p["wo"] = get(a + "wo")                                                     # [D, H V]
    if experts is None:
        p["w13"], p["w2"] = torch.cat((get(f + "w1"), get(f + "w3"))), get(f + "w2")
        return p
    p["gate"], p["gate_bias"] = get(f + "gate", torch.float32), get_1d(f + "gate_bias")
    w13, w2 = experts()
    p["w13_t"], p["w2_t"] = w13.transpose(1, 2), w2.transpose(1, 2)             # [E, D, 2Mi], [E, Mi, D]
    if cfg.n_shared_experts > 0:
        p["shared_w13"] = torch.cat((get(f + "shared.w1"), get(f + "shared.w3")))
        p["shared_w2"] = get(f + "shared.w2")
    return p
