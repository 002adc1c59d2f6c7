"""The one builder of the engine's device layers (``DeviceLayer`` / ``DeviceModel``) from a source.

Legend: D model width, H heads, N qk_nope, R rope, V v_head, C kv_lora_rank, Q q_lora_rank,
E routed experts, I expert width, Vo vocabulary, G INT4 group size, S distinct MoE weight sets.

A source hands out each part in the form the ops prepare (``kernels_numba.ops``):
- ``MappingSource(weights)``: a weights mapping (bundle weights, ``SeededWeights``, a lazy checkpoint, a
  dict), FP32 or W16A16 where the mapping marks it (``dense=DenseKind.BF16`` marks the dense projections
  itself), INT4 experts repacked for fused_moe (``upload_model`` uses it); with ``workers`` the INT4
  routed experts are repacked in chunks of ``CHUNK`` on that many processes (at K2 width the host
  repack takes about half a second per expert on one core);
- ``SeededSource(cfg, seed, dense, experts, workers)``: the seeded model (``workbench.seeded``) through
  ``MappingSource``, its routed experts in any ``ExpertKind``: INT4 (the seeded words, repacked on
  ``workers`` processes), FP32 (dequantized exactly where the kernels read them: the portable FFN) or
  BF16 (rounded to bf16 on the device: grouped GEMMs);
- ``RandomSource(cfg, seed)``: random weights drawn where the kernels read them, already in their
  layouts, as serving engines' "dummy" load formats do: K2's layout (routed experts INT4 G = 32 in
  fused_moe's tile layout, INT4 codes uniform in [-7, 7] with float16 group scales;
  attention, shared expert, dense MLP and lm_head bf16 W16A16; router and norms float32), with the
  magnitudes of ``workbench.seeded`` (linears RMS 1 / sqrt(in), norms 1 +- 0.1, embedding RMS 1, head
  logits of RMS ~3). A random model: its tokens mean nothing and its routing is near uniform.

``build_model(cfg, src, sets=S)`` lets the MoE layers cycle over S distinct layers (position i holds
source layer ``source_layer(cfg, i, S)``): the same ``DeviceLayer`` at several positions, each position
with its own latent cache rows in the engine. Every set is far beyond the L2 at K2 size, so each
position reads its weights from HBM as distinct layers would. ``layer_weights`` downloads a built
layer back into a weights mapping (the numpy reference's names) for checks.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import SIMULATED, download, to_device
from numformats.int4 import scales_to_float32

from ..config import ModelConfig
from ..errors import InputError
from ..weights import HEAD_LOGIT_STD
from .kinds import DenseKind, ExpertKind, kind
from .weights import DeviceLayer, DeviceModel, _f32, dense_matrix, moe_experts, moe_router, stack_rows, swiglu

GROUP = 32                                 # K2's INT4 group size (routed experts)
CHUNK = 4                                  # experts per repack task (~0.7 GB of temporaries at K2 width)
_CODE_POWER = 280.0 / 15.0 * 13.0 / 12.0   # E[q^2] of codes uniform in [-7, 7] x E[(1/2 + v)^2], v ~ U[0, 1)
_CHUNK = 1 << 28                           # bytes drawn at a time (two uint8 temporaries of this size)


def source_layer(cfg: ModelConfig, i: int, sets: int | None) -> int:
    """The source layer position i holds: itself, or with ``sets`` the MoE layers' (i - k) mod S + k
    (k = first_k_dense_replace)."""
    k = cfg.first_k_dense_replace
    return i if sets is None or i < k else k + (i - k) % sets


# ---- sources ----------------------------------------------------------------------------------------

def _expert_stack(cfg: ModelConfig, stacks: int | Mapping, layer: int, proj: str, ids: range) -> tuple:
    """(packed int32 [E, N, K/8], scale float16 [E, N, K/G]) of experts ``ids``: seeded (``stacks`` a
    seed), or read from a weights mapping (scales must be float16 values: fused_moe stores float16)."""
    from .. import seeded
    if not isinstance(stacks, Mapping):
        return seeded.expert_stack(cfg, stacks, layer, proj, experts=ids)
    names = [f"layers.{layer}.ffn.experts.{e}.{proj}" for e in ids]
    packed = np.stack([np.asarray(stacks[n + ".packed"]) for n in names])
    s32 = np.stack([scales_to_float32(stacks[n + ".scale"]) for n in names])
    scale = s32.astype(np.float16)
    if not np.array_equal(scale.astype(np.float32), s32):
        raise InputError(f"layer {layer} {proj}: INT4 scales float16 cannot hold (fused_moe stores float16)")
    return packed, scale


def _repack_chunk(cfg: ModelConfig, stacks: int | Mapping, layer: int, e0: int, e1: int) -> tuple:
    """Experts [e0, e1) of ``layer`` in fused_moe's tile layout (``ops.repack_experts``)."""
    ids = range(e0, e1)
    return ops.repack_experts(*(_expert_stack(cfg, stacks, layer, p, ids) for p in ("w1", "w3", "w2")))


def int4_experts(cfg: ModelConfig, stacks: int | Mapping, layer: int, workers: int = 1,
                 experts: range | None = None):
    """The routed experts ``experts`` (default all) of ``layer`` (seeded, or of a weights mapping) in
    fused_moe's layout, host arrays, local ids 0.. in order, no shared expert inside; repacked in chunks
    on ``workers`` processes."""
    ex = range(cfg.n_routed_experts) if experts is None else experts
    tasks = [(e0, min(e0 + CHUNK, ex.stop)) for e0 in range(ex.start, ex.stop, CHUNK)]
    try:
        if workers > 1:
            with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
                futs = [pool.submit(_repack_chunk, cfg, stacks, layer, a, b) for a, b in tasks]
                parts = [f.result() for f in futs]
        else:
            parts = [_repack_chunk(cfg, stacks, layer, a, b) for a, b in tasks]
    except ops.KernelInputError as e:
        raise InputError(f"layer {layer}: {e}") from None
    return ops.fused_experts(parts, len(ex), cfg.hidden_size, cfg.moe_intermediate_size)


def _layer_of(prefix: str) -> int:
    return int(prefix.split(".")[1])                                  # "layers.{i}.ffn"


class MappingSource:
    """Parts from a weights mapping through ``engine.weights``' helpers; ``fast`` as ``upload_model``;
    ``experts=False``: no MoE layer's FFN (the caller sets ``moe_block``); ``dense``: BF16 marks the dense
    projections W16A16 (``workbench.quant.w16a16``); ``workers``: INT4 routed experts repacked on that
    many processes (fused_moe; the mapping travels to them, so a lazy checkpoint reads there)."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, Any], fast: bool = True,
                 experts: bool = True, dense: DenseKind | str | None = None, workers: int = 0) -> None:
        from ..quant.w16a16 import w16a16
        self.cfg, self.fast, self.experts, self.workers = cfg, fast, experts, workers
        self.stacks: int | Mapping = weights                          # where the routed experts come from
        dense = None if dense is None else kind(DenseKind, dense, "dense")
        self.w = w16a16(cfg, weights) if dense == DenseKind.BF16 else weights

    def vector(self, name: str, n: int):
        return to_device(_f32(self.w, name))

    def dense(self, parts: list[tuple[str, tuple[int, int]]]) -> ops.Dense:
        """The rows of ``parts`` [(name, (N, K))] stacked into one projection."""
        mats = [dense_matrix(self.w, name) for name, _ in parts]
        return ops.dense(mats[0] if len(mats) == 1 else stack_rows(mats), self.fast)

    def mla(self, name: str, shape: tuple[int, int]) -> ops.MLA:
        cfg = self.cfg
        return ops.mla_weights(dense_matrix(self.w, name), self.fast, cfg.num_attention_heads,
                               cfg.qk_nope_head_dim)

    def mlp(self, prefix: str, width: int) -> ops.SwiGLU:
        return ops.swiglu_weights(*swiglu(self.w, prefix), fast=self.fast)

    def moe(self, prefix: str) -> ops.MoE | None:
        if not self.experts:
            return None
        cfg = self.cfg
        rt = self.router(prefix)
        if self.workers:
            return self.routed(rt, self.shared(prefix), _layer_of(prefix))
        experts = moe_experts(self.w, prefix, range(cfg.n_routed_experts))
        shared = swiglu(self.w, prefix + ".shared") if cfg.n_shared_experts > 0 else None
        return ops.moe_weights(rt, experts, shared, self.fast)   # an INT4 shared expert may go inside

    def router(self, prefix: str) -> ops.Router:
        return moe_router(self.cfg, self.w, prefix, self.fast)

    def shared(self, prefix: str) -> ops.SwiGLU | None:
        """The shared expert on its own (None without one)."""
        if self.cfg.n_shared_experts == 0:
            return None
        return ops.swiglu_weights(*swiglu(self.w, prefix + ".shared"), fast=self.fast)

    def routed(self, rt: ops.Router, shared: ops.SwiGLU | None, layer: int) -> ops.MoE:
        """The MoE with its INT4 routed experts repacked on ``workers`` processes."""
        return ops.moe_fused(rt, int4_experts(self.cfg, self.stacks, layer, self.workers), shared)

    def embed(self):
        return to_device(_f32(self.w, "embed"))

    def head(self) -> ops.Dense:
        return ops.dense(dense_matrix(self.w, "head"), self.fast)


class SeededSource(MappingSource):
    """The seeded model (``workbench.seeded.SeededWeights``: attention, norms, router, shared expert and
    dense MLP bf16, widened to FP32 or W16A16 as ``dense``) with its routed experts as ``experts``: INT4
    repacked for fused_moe on ``workers`` processes, FP32 (portable FFN) or BF16 (grouped GEMMs), the
    latter two dequantized by torch where the kernels run (no host copy of a whole stack)."""

    def __init__(self, cfg: ModelConfig, seed: int, dense: DenseKind | str = DenseKind.FP32,
                 experts: ExpertKind | str = ExpertKind.INT4, workers: int = 1) -> None:
        from ..seeded import SeededWeights
        super().__init__(cfg, SeededWeights(cfg, seed), dense=dense, workers=max(1, workers))
        self.seed, self.kind = int(seed), kind(ExpertKind, experts, "experts")
        self.stacks = self.seed

    def routed(self, rt: ops.Router, shared: ops.SwiGLU | None, layer: int) -> ops.MoE:
        if self.kind == ExpertKind.INT4:
            return super().routed(rt, shared, layer)
        from ..torchk2.int4 import seeded_bf16_experts, seeded_fp32_stack
        dev = "cpu" if SIMULATED else "cuda"
        if self.kind == ExpertKind.BF16:
            if not ops.BLAS:
                raise InputError("bf16 experts run on the BLAS path (torch): a GPU, or ops.BLAS on")
            w13, w2 = seeded_bf16_experts(self.cfg, self.seed, layer, dev, workers=self.workers)
            return ops.moe_grouped(rt, ops.Bf16Experts(w13, w2), shared)
        t = seeded_fp32_stack(self.cfg, self.seed, layer, dev, self.workers)
        stack = {"int4": False, "width": self.cfg.moe_intermediate_size, "tensors": t,  # they own the memory
                 **{k: _numba_view(v) for k, v in t.items()}}
        return ops.moe_portable(rt, stack, shared)


def _numba_view(t):
    """A torch tensor as the kernels read it (a numba device array; the array itself in the simulator)."""
    if SIMULATED:
        return to_device(t.numpy())
    from numba import cuda
    return cuda.as_cuda_array(t)


class RandomSource:
    """Random K2-layout parts drawn on the device (torch's generator; the host's under the simulator),
    one independent stream per call. ``describe()`` says what it is."""

    def __init__(self, cfg: ModelConfig, seed: int = 0) -> None:
        import torch
        if not ops.BLAS:
            raise ops.KernelInputError("the random source's W16A16 parts run on the BLAS path (torch), "
                                       "which is off here")
        self.cfg, self.seed = cfg, int(seed)
        self.dev = "cpu" if SIMULATED else "cuda"
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False   # W16A16: float32 sums
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(self.seed)
        self.host = np.random.default_rng(self.seed)
        self.tensors: list[Any] = []                  # torch tensors the numba views read (kept alive)

    def describe(self) -> str:
        return ("random weights drawn on the device in the kernels' layouts (K2's layout: routed experts "
                f"INT4 G={GROUP}, the rest bf16 W16A16, router and norms float32), seed {self.seed}")

    def _uniform(self, shape, half: float, dtype=None, mean: float = 0.0):
        import torch
        t = torch.empty(shape, dtype=dtype or torch.bfloat16, device=self.dev)
        return t.uniform_(mean - half, mean + half, generator=self.gen)

    def _linear_t(self, k: int, n: int):
        """W.T [K, N] bf16 of a linear with K inputs: uniform with RMS 1 / sqrt(K)."""
        return self._uniform((k, n), math.sqrt(3.0 / k))

    def vector(self, name: str, n: int):
        return to_device(self.host.uniform(0.9, 1.1, n).astype(np.float32))          # norms: 1 +- 0.1

    def dense(self, parts: list[tuple[str, tuple[int, int]]]) -> ops.Dense:
        k = parts[0][1][1]
        return ops.dense_w16(self._linear_t(k, sum(s[0] for _, s in parts)))

    def mla(self, name: str, shape: tuple[int, int]) -> ops.MLA:
        n, c = shape
        return ops.mla_w16(self._linear_t(c, n).T.contiguous(), self.cfg.num_attention_heads,   # [H*(N+V), C]
                           self.cfg.qk_nope_head_dim)

    def mlp(self, prefix: str, width: int) -> ops.SwiGLU:
        d = self.cfg.hidden_size
        return ops.swiglu_w16(width, d, self._linear_t(d, 2 * width), self._linear_t(width, d))

    def _words(self, count: int):
        """``count`` uint32 words of INT4 codes uniform in [-7, 7] (nibbles u = q + 8 in 1..15, as the seeded
        model's: zero-mean, so no expert carries a common offset that would pull every token's hidden
        state one way) where the kernels read them."""
        import torch
        t = torch.empty(4 * count, dtype=torch.uint8, device=self.dev)
        for a in range(0, t.numel(), _CHUNK):
            part = t[a:a + _CHUNK]
            lo = torch.randint(1, 16, part.shape, dtype=torch.uint8, device=self.dev, generator=self.gen)
            hi = torch.randint(1, 16, part.shape, dtype=torch.uint8, device=self.dev, generator=self.gen)
            torch.bitwise_or(lo, hi << 4, out=part)
        return self._u32(t)

    def _scales(self, count: int, k: int):
        """``count`` uint32 words, each two float16 group scales s0 (1/2 + v), v ~ U[0, 1): weights of RMS
        1 / sqrt(K) with uniform codes."""
        import torch
        s0 = 1.0 / math.sqrt(_CODE_POWER * k)
        t = self._uniform(2 * count, 0.5 * s0, torch.float16, mean=s0)
        return self._u32(t.view(torch.uint8))

    def _u32(self, t):
        self.tensors.append(t)
        if SIMULATED:
            return t.numpy().view(np.uint32)
        from numba import cuda
        return cuda.as_cuda_array(t).view(np.uint32)

    def experts(self) -> ops.MoEWeights:
        """E routed experts in fused_moe's tile layout (int4_layout.py, moe.prepare_moe): w13 [E, I16, 2,
        D/64, 32, 4] words and [E, I16, 2, D/G, 8] scale words, w2 [E, D16, I/64, 32, 4] and [E, D16, I/G,
        8]."""
        cfg = self.cfg
        e, d, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        if d % 64 or i % 64 or d % 16 or i % 16:
            raise ops.KernelInputError(f"fused_moe's tile layout wants D and I multiples of 64, got {d}, {i}")
        w13 = ops.Int4Weight(self._words(e * (i // 16) * 2 * (d // 64) * 128),
                         self._scales(e * (i // 16) * 2 * (d // GROUP) * 8, d), i, d, GROUP, e, pair=True)
        w2 = ops.Int4Weight(self._words(e * (d // 16) * (i // 64) * 128),
                        self._scales(e * (d // 16) * (i // GROUP) * 8, i), d, i, GROUP, e)
        return ops.MoEWeights(w13, w2, e, 0)

    def moe(self, prefix: str) -> ops.MoE:
        cfg = self.cfg
        d, e = cfg.hidden_size, cfg.n_routed_experts
        a = math.sqrt(3.0 / d)
        gate = self.host.uniform(-a, a, (e, d)).astype(np.float32)                           # [E, D]
        bias = self.host.uniform(-0.01, 0.01, e).astype(np.float32)
        rt = ops.router(gate, bias, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob,
                        cfg.routed_scaling_factor)
        shared = self.mlp(prefix + ".shared", cfg.n_shared_experts * cfg.moe_intermediate_size) \
            if cfg.n_shared_experts else None
        return ops.MoE(ops.FUSED_MOE, rt, cfg.moe_intermediate_size, d, fused=self.experts(), shared=shared)

    def embed(self):
        import torch
        t = self._uniform((self.cfg.vocab_size, self.cfg.hidden_size), math.sqrt(3.0), torch.float32)
        self.tensors.append(t)
        if SIMULATED:
            return memoryview(t.numpy())
        from numba import cuda
        return cuda.as_cuda_array(t)

    def head(self) -> ops.Dense:
        d = self.cfg.hidden_size
        half = math.sqrt(3.0) * HEAD_LOGIT_STD / math.sqrt(d)                         # logits RMS ~3
        return ops.dense_w16(self._uniform((d, self.cfg.vocab_size), half))


# ---- the builder ------------------------------------------------------------------------------------

def upload_model(cfg: ModelConfig, weights: Mapping[str, Any], fast: bool = True,
                 experts: bool = True) -> DeviceModel:
    """All target weights on the device (drafter.* weights are uploaded per generation by
    ``engine.dflash.DeviceDFlash``); InputError for weights the engine cannot take. ``fast=False``
    keeps every INT4 matrix on the portable kernels; ``experts=False`` leaves the MoE layers' FFN
    to the caller (``DeviceLayer.moe_block``)."""
    try:
        return build_model(cfg, MappingSource(cfg, weights, fast, experts))
    except ops.KernelInputError as e:
        raise InputError(str(e)) from None


def upload_layer(cfg: ModelConfig, weights: Mapping[str, Any], i: int, fast: bool = True,
                 experts: bool = True) -> DeviceLayer:
    """Layer ``i`` of the weights on the device, as ``upload_model`` prepares each layer (InputError from
    the kernels' own checks left to the caller, see there)."""
    return build_layer(cfg, MappingSource(cfg, weights, fast, experts), i)


def build_layer(cfg: ModelConfig, src, i: int) -> DeviceLayer:
    """Layer i from ``src`` as ``engine.model.launch_layer`` runs it, its kinds recorded."""
    if not 0 <= i < cfg.num_hidden_layers:
        raise InputError(f"layer {i} outside the model's {cfg.num_hidden_layers} layers")
    d, h = cfg.hidden_size, cfg.num_attention_heads
    c, r = cfg.kv_lora_rank, cfg.qk_rope_head_dim
    p, a = f"layers.{i}.", f"layers.{i}.attn."
    if cfg.q_lora_rank is not None:
        q = cfg.q_lora_rank
        first = (a + "wq_a", (q, d))
        wq_b = src.dense([(a + "wq_b", (h * cfg.qk_head_dim, q))])
        q_norm = src.vector(a + "q_norm", q)
    else:
        first = (a + "wq", (h * cfg.qk_head_dim, d))
        wq_b = None
        q_norm = to_device(np.zeros(1, np.float32))
    lay = DeviceLayer(attn_norm=src.vector(p + "attn_norm", d), ffn_norm=src.vector(p + "ffn_norm", d),
                      a1=src.dense([first, (a + "wkv_a", (c + r, d))]),                 # [Q+C+R, D]
                      q_norm=q_norm, kv_norm=src.vector(a + "kv_norm", c), wq_b=wq_b,
                      attn=src.mla(a + "wkv_b", (h * (cfg.qk_nope_head_dim + cfg.v_head_dim), c)),
                      wo=src.dense([(a + "wo", (d, h * cfg.v_head_dim))]))
    if cfg.is_moe_layer(i):
        lay.moe = src.moe(p + "ffn")
    else:
        lay.mlp = src.mlp(p + "ffn", cfg.intermediate_size)
    lay.dense_kind, lay.expert_kind = layer_kinds(lay)
    return lay


def layer_kinds(lay: DeviceLayer) -> tuple[DenseKind, ExpertKind | None]:
    """(dense kind, routed experts' kind) of a built layer, read from its prepared parts."""
    dense = DenseKind.BF16 if lay.attn.a16 else DenseKind.FP32
    m = lay.moe
    if m is None:
        return dense, None
    if m.path == ops.GROUPED_MM:
        return dense, ExpertKind.BF16
    if m.path == ops.PORTABLE and not m.stack["int4"]:
        return dense, ExpertKind.FP32
    return dense, ExpertKind.INT4


def build_model(cfg: ModelConfig, src, sets: int | None = None, log=None) -> DeviceModel:
    """Every layer from ``src`` (with ``sets``: the MoE layers cycling over that many distinct ones), the
    embedding, final norm and head."""
    if sets is not None and sets < 1:
        raise ops.KernelInputError(f"sets must be >= 1, got {sets}")
    built: dict[int, DeviceLayer] = {}
    layers = []
    for i in range(cfg.num_hidden_layers):
        j = source_layer(cfg, i, sets)
        if j not in built:
            built[j] = build_layer(cfg, src, j)
            if log is not None:
                log(f"  built layer {j}")
        layers.append(built[j])
    return DeviceModel(cfg=cfg, embed=src.embed(), norm=src.vector("norm", cfg.hidden_size), head=src.head(),
                       layers=layers, a1_width=layers[0].a1.n)


# ---- back to the host (checks) ----------------------------------------------------------------------

def host_array(x) -> np.ndarray:
    """A device array, memoryview or torch tensor as a host array."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy() if str(x.dtype) != "torch.bfloat16" else \
            x.detach().cpu().view(__import__("torch").int16).numpy().view(np.uint16)
    return np.asarray(x) if SIMULATED or isinstance(x, (np.ndarray, memoryview)) else download(x)


def _w16(bits: np.ndarray) -> Any:
    from numformats.bf16 import BF16Array

    from ..quant.w16a16 import W16A16
    return W16A16(BF16Array(np.ascontiguousarray(bits)))


def _matrix(w_t) -> Any:
    """A projection's W.T [K, N] (device) or repacked W16A16 weight as the reference's [N, K]: W16A16 for
    bf16, else float32."""
    if isinstance(w_t, ops.Bf16Weight):
        return _w16(ops.unrepack_w16(w_t))
    a = host_array(w_t)
    if a.dtype == np.uint16:
        return _w16(a.T)
    return np.ascontiguousarray(a.T, np.float32)


def _rows_of(m: Any, lo: int, hi: int) -> Any:
    from numformats.bf16 import BF16Array

    from ..quant.w16a16 import W16A16
    if isinstance(m, W16A16):
        return W16A16(BF16Array(np.ascontiguousarray(m.w.bits[lo:hi])), m.out16)
    return m[lo:hi]


def fused_expert(fw: ops.MoEWeights, e: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(packed int32 [N, K/8], scale float16 [N, K/G]) of w1, w3, w2 of expert ``e`` of a fused stack
    (downloads that expert's words only)."""
    out = []
    x = fw.w13.experts
    q13, s13 = len(fw.w13.wq) // x, len(fw.w13.sq) // x
    wq = host_array(fw.w13.wq[e * q13:(e + 1) * q13]).reshape(fw.w13.n16, 2, -1)
    sq = host_array(fw.w13.sq[e * s13:(e + 1) * s13]).reshape(fw.w13.n16, 2, -1)
    for half in (0, 1):
        out.append(ops.unrepack_int4(ops.Int4Weight(np.ascontiguousarray(wq[:, half]).reshape(-1),
                                            np.ascontiguousarray(sq[:, half]).reshape(-1),
                                            fw.w13.n, fw.w13.k, fw.w13.group_size)))
    q2, s2 = len(fw.w2.wq) // x, len(fw.w2.sq) // x
    out.append(ops.unrepack_int4(ops.Int4Weight(host_array(fw.w2.wq[e * q2:(e + 1) * q2]),
                                        host_array(fw.w2.sq[e * s2:(e + 1) * s2]),
                                        fw.w2.n, fw.w2.k, fw.w2.group_size)))
    return out


def layer_weights(cfg: ModelConfig, lay: DeviceLayer, i: int, experts=None) -> dict[str, Any]:
    """A built layer (RandomSource's or MappingSource's W16A16 / FP32 projections, fused INT4 experts)
    downloaded under the reference's names for layer i; ``experts``: the routed experts to include
    (default all)."""
    p, a = f"layers.{i}.", f"layers.{i}.attn."
    q = cfg.q_lora_rank
    a1 = _matrix(lay.a1.wt)                                                           # [Q+C+R, D]
    w: dict[str, Any] = {p + "attn_norm": host_array(lay.attn_norm), p + "ffn_norm": host_array(lay.ffn_norm),
                         a + "kv_norm": host_array(lay.kv_norm), a + "wo": _matrix(lay.wo.wt)}
    if q is not None:
        w.update({a + "wq_a": _rows_of(a1, 0, q), a + "wkv_a": _rows_of(a1, q, None),
                  a + "q_norm": host_array(lay.q_norm), a + "wq_b": _matrix(lay.wq_b.wt)})
    else:
        w.update({a + "wq": _rows_of(a1, 0, cfg.num_attention_heads * cfg.qk_head_dim),
                  a + "wkv_a": _rows_of(a1, cfg.num_attention_heads * cfg.qk_head_dim, None)})
    kvb = host_array(lay.attn.wkv_b)                                                  # [H*(N+V), C]
    w[a + "wkv_b"] = _w16(kvb) if kvb.dtype == np.uint16 else np.asarray(kvb, np.float32)
    f = p + "ffn"
    if lay.mlp is not None:
        w.update(_swiglu_weights(lay.mlp, f))
        return w
    m = lay.moe
    gate_t = host_array(m.router.gate_t)                                              # [D, E]
    w[f + ".gate"] = np.ascontiguousarray(gate_t.T, np.float32)
    w[f + ".gate_bias"] = host_array(m.router.bias)
    if m.shared is not None:
        w.update(_swiglu_weights(m.shared, f + ".shared"))
    if m.path != ops.FUSED_MOE or m.fused.n_shared:
        raise ops.KernelInputError("layer_weights reads fused_moe experts without a shared expert inside")
    for e in range(cfg.n_routed_experts) if experts is None else experts:
        for proj, (packed, scale) in zip(("w1", "w3", "w2"), fused_expert(m.fused, int(e)), strict=True):
            w[f"{f}.experts.{e}.{proj}.packed"] = packed
            w[f"{f}.experts.{e}.{proj}.scale"] = scale
    return w


def _swiglu_weights(s: ops.SwiGLU, prefix: str) -> dict[str, Any]:
    if s.path not in (ops.BLAS_PATH, ops.W16A16):
        raise ops.KernelInputError(f"layer_weights reads BLAS-path and W16A16 SwiGLUs, got {s.path}")
    w13 = _matrix(s.w13)                                                              # [2I, D]
    return {prefix + ".w1": _rows_of(w13, 0, s.width), prefix + ".w3": _rows_of(w13, s.width, None),
            prefix + ".w2": _matrix(s.w2)}


def model_weights(model: DeviceModel, sets: int | None = None) -> dict[str, Any]:
    """A whole built model downloaded as a weights mapping of its source layers (small models: every
    expert), for ``cycled``."""
    cfg = model.cfg
    w: dict[str, Any] = {"embed": host_array(model.embed), "norm": host_array(model.norm),
                         "head": _matrix(model.head.wt)}
    for i, lay in enumerate(model.layers):
        j = source_layer(cfg, i, sets)
        if j == i:
            w.update(layer_weights(cfg, lay, i))
    return w


class Cycled(Mapping):
    """``weights`` of the source layers seen as the whole model's: ``layers.i.*`` reads
    ``layers.source_layer(i).*`` (the reference's view of ``build_model(..., sets)``)."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, Any], sets: int) -> None:
        self.cfg, self.w, self.sets = cfg, weights, sets

    def _name(self, name: str) -> str:
        if name.startswith("layers."):
            i, rest = name[7:].split(".", 1)
            return f"layers.{source_layer(self.cfg, int(i), self.sets)}.{rest}"
        return name

    def __getitem__(self, name: str) -> Any:
        return self.w[self._name(name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._name(name) in self.w

    def __iter__(self) -> Iterator[str]:
        for name in self.w:
            if not name.startswith("layers."):
                yield name
        for i in range(self.cfg.num_hidden_layers):
            j = source_layer(self.cfg, i, self.sets)
            pre = f"layers.{j}."
            for name in self.w:
                if name.startswith(pre):
                    yield f"layers.{i}." + name[len(pre):]

    def __len__(self) -> int:
        return sum(1 for _ in self)
