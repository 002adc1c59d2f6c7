"""The one dispatch from the model's operations to kernels: the engine and the benchmarks call these.

Legend: T rows of the buffers, ``rows`` the grid's rows (n = meta[1] <= rows live), D model width,
I SwiGLU width, E routed experts, K experts per token, S shared experts, G INT4 group size.

Weights are prepared once (``dense``, ``router``, ``swiglu_weights``, ``moe_weights``). INT4 matrices
whose shape the tensor-core tile layout holds are repacked (``repack_int4`` / ``prepare_moe``) and run
on ``int4_matmul`` / ``fused_moe``; everything else runs on the portable kernels (any shape, FP32 or
W4A16). The choice is made at preparation and recorded in ``.path``, which the ops follow:

| op | INT4, shape allows | FP32, large, on a GPU | otherwise |
|---|---|---|---|
| ``linear`` | - | SGEMM | linear |
| ``mla_attention`` | - | batched SGEMMs, masked softmax | mla.py |
| ``swiglu`` (dense MLP, shared) | f16(x), int4_matmul [gate; up], act, int4_matmul down, + h | SGEMMs | ffn |
| ``moe`` (router, experts, shared) | f16(x), fused_moe (+ INT4 shared expert), + h | sliced logits | ffn |

``Bf16Host`` matrices (W16A16: ``linear``, ``swiglu``) run on the W16A16 tensor-core kernel
(``w16a16.py``: each row summed as it would be alone, so a verify's rows equal decode's) where a GPU is
present (``W16_KERNEL``) and N, K are multiples of 16, else on the BLAS path as bf16 GEMMs; the W16A16
attention core (``mla_attention``) runs its projections and scores on the BLAS path and its softmax and
p @ c_kv on ``mla.make_mla_core_bf16`` (``W16_CORE_KERNEL``: every key summed at its position in the
sequence, so a verify row equals its token's decode row whatever slots its ancestors took); bf16
routed experts (``Bf16Host`` with ``out16``) as grouped GEMMs over the (token, expert) pairs sorted by
expert (``GROUPED_MM``: ``blas.experts_grouped``).
FP32 ops take the BLAS path (``blas.py``: torch over the same buffers, cuBLAS on a GPU) where a GPU
is present (``BLAS``) and the weight has at least ``BLAS_MIN_ELEMENTS`` elements: there one
thread per output column of the portable kernels reads far below the copy rate, while at toy
sizes one portable launch beats several library launches.

"Shape allows" is the layout's own rule (``repack_int4`` raises ``LayoutError`` otherwise): every
matrix with K % 64 == 0 and G in (32, 64, 128), float16 scales (or scales float16 holds exactly);
fused_moe needs it of all routed experts (and E + S <= 1024). Both paths compute the reference's
W4A16 (``workbench.quant.int4.int4_linear``): activations rounded to float16, weights (u - 8) * scale,
float32 sums, SwiGLU's silu(gate) * up rounded to float16 before down; they differ in summation order.

The dflash drafter's kernels (``draft_attention.py``) are re-exported as ``draft_gather_rows``,
``draft_head_norm_rope`` (interleaved or rotate-half pairs) and ``draft_attention`` (GQA).

Code outside the package reaches kernels through this module only (``dev/import_map.py --check``): the
kernel ladders (``dev/kernels/``) take the kernels' builders from the last import group.

The ops launch only: no host synchronisation and no allocation (``Scratch`` holds every work buffer
and the MoE workspaces, made before any capture), so a sequence of ops can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blas, ffn, mla, mla_flash, persistent, w16a16
from ._validate import KernelInputError, flat, warps
from .blas import padded_keys  # noqa: F401 - the key rows the BLAS attention pads to
from .blas import view as torch_view  # noqa: F401 - a torch tensor over a device array (no copy)
from .blockops import KS, TPB, col_blocks, row_slices
from .device import SIMULATED, SideStream, head_rows, kernel_array, on_gpu, rows_view, to_device, zeros
from .draft_attention import draft_attention  # the dflash drafter's attention (GQA), draft_attention.py
from .draft_attention import gather_rows as draft_gather_rows  # its context input from the tap buffer
from .draft_attention import head_norm_rope as draft_head_norm_rope  # per-head q/k norm + RoPE (2 layouts)
from .draft_attention import workspace_shape as draft_attention_workspace  # ... and its workspace's shape
from .int4_layout import Int4Weight, LayoutError, repack_int4, unrepack_int4  # noqa: F401 - re-exported
from .int4_matmul import GemmWorkspace, Staged, choose_config, gemm_workspace, int4_matmul, tiled_config  # noqa: F401 - bench kernels' launch configs
from .kv import kv_compact_kernel
from .launch import launch
from .linear import linear as _linear
from .mla import (
    make_mla_attention,
    make_mla_prep_kernel,
    mla_prep_kernel,  # noqa: F401 - K2's instance (its registers: dev/kernels/sass.py --glue)
    prep_counts,
)
from .mla_flash import flash_mla
from .moe import (  # noqa: F401 - bench kernels' configs and per-stage times
    GEMV_TOKENS,
    TILE_ROWS,
    MoEWeights,
    choose_moe_config,
    fused_moe,
    moe_stages,
    moe_workspace,
    prepare_moe,
    stream_k_config,
)
from .moe_align import expert_tiles  # noqa: F401 - the tiled MoE path's expert reads of a routing
from .moe_gemv import moe_act_kernel
from .persistent import persistent_swiglu  # noqa: F401 - the SwiGLU in one cooperative launch
from .rmsnorm import norm_slices, rmsnorm  # out [T, K] = rmsnorm(x) * w (rmsnorm.py's wrapper)
from .router import SLICE_WARPS, logit_slice_count, logit_slices_f16_kernel, logit_slices_kernel, make_route
from .rows import add_rows_kernel, to_f16_kernel
from .sim import sim_speed  # noqa: F401 - the simulator's faster executor around a block of ops
from .tokens import advance_kernel, argmax_kernel, argmax_slices, copy_rows_kernel, embed_kernel
from .tree import topk_logprobs, tree_compile_kernel
from .w16a16 import Bf16Weight, Groups, repack_w16, row_tiles, tiles_per_block, unrepack_w16  # noqa: F401 - re-exported

# isort: split
# The kernel ladders (dev/kernels/) check, time and disassemble the package kernels through ops: the
# kernels' builders and the staged tiling's split-K sizes here, the calls the ops wrap in __all__'s group.
from .int4_matmul import (
    make_int4_matmul_kernel,  # noqa: F401 - the tiled kernel's builder
    wgmma_config,  # noqa: F401 - the wgmma tiling int4_matmul would take (not yet)
)
from .int4_staged import make_int4_staged_kernel  # noqa: F401 - the staged kernel's builder
from .int4_staged import partials as staged_partials  # noqa: F401 - split-K workspace words of a tiling
from .int4_wgmma import Wgmma  # noqa: F401 - the wgmma kernel's tilings (not a default: not timed yet)
from .moe_gemm import make_moe_gemm_kernel  # noqa: F401 - fused_moe's stream-K GEMM builder
from .resources import sm90_build  # noqa: F401 - a kernel's PTX, cubin and registers for sm_90, offline
from .rmsnorm import rmsnorm_kernel  # noqa: F401 - the norm kernel (its registers: dev/kernels/sass.py --glue)
from .router import make_logit_slices  # noqa: F401 - the sliced router logits' builder
from .w16a16 import make_w16a16_kernel, w16_tiling  # noqa: F401 - the W16A16 builder and its K split

PORTABLE = "portable"
INT4_MATMUL = "int4_matmul"
FUSED_MOE = "fused_moe"
BLAS_PATH = "blas"
GROUPED_MM = "grouped_mm"
SLICED = "sliced"             # a large router gate: logits in slices of D by many blocks (router.py)
BLAS = on_gpu()                              # FP32 ops may take the BLAS path (tests turn it on on CPU)
BLAS_MIN_ELEMENTS = 1 << 20                  # ... for weights of at least this many elements (4 MB)
W16A16 = "w16a16"
W16_KERNEL = on_gpu()                        # bf16 weights on the W16A16 kernel (tests turn it on on CPU)
W16_MULTI_TILE = True                        # its NT column tiles a block where they measured faster
                                             # (the same bits): ``multi_tiles``
W16_CORE_KERNEL = False                      # the W16A16 attention core's softmax and p @ c_kv on mla.py's
                                             # core kernels (keys in logical order), else torch + cuBLAS:
                                             # off until v2 (key chunks) is timed (v1: 1.2-23x slower)
W16_ABSORB = True                            # the W16A16 core's W_UK / W_UV products on the W16A16 kernel
                                             # (grouped by head, PDL) where it runs, else cuBLAS's bmm
W16_SOFTMAX = False                          # ... and then its masked softmax on mla.softmax16_kernel:
                                             # off, torch's softmax measured faster (mla_core_9f3c2313bae9)
W16_FLASH = False                            # ... or scores, softmax and p @ c_kv in one pass over the live
                                             # keys (mla_flash.py): off until dev/kernels/mla_core.py times it
W16_NORM = True                              # an RMSNorm before a W16A16 projection inside it ...
FOLD_ROWS = 16                               # ... up to this many rows (then as many registers as fit)
W16_GLU_FOLD = False                         # silu(g) * u formed inside the W16A16 down projection (every
                                             # block of it again), else by w16a16.glu_rows first: off, the
                                             # fold cost up to 1.2 ms a dense MLP (k2_layer_9f3c2313bae9)
W16_PERSISTENT = False                       # a W16A16 SwiGLU's three launches as one persistent kernel
                                             # (persistent.py, the same bits): off until
                                             # dev/kernels/persistent.py times it
SHARED_BESIDE = True                         # a W16A16 shared expert on a second stream beside fused_moe
MAX_FUSED_EXPERTS = 1024                     # fused_moe's align block holds one counter per expert
SWITCHES = ("W16_MULTI_TILE", "W16_CORE_KERNEL", "W16_ABSORB", "W16_SOFTMAX", "W16_FLASH", "W16_NORM",
            "W16_GLU_FOLD", "W16_PERSISTENT", "SHARED_BESIDE")   # the kernel-path switches a run may set


def switches() -> dict[str, bool]:
    """The kernel-path switches as they stand (a result set's metadata records them)."""
    return {name: bool(globals()[name]) for name in SWITCHES}


def set_switches(values: dict[str, bool]) -> None:
    """Set kernel-path switches by name (before the weights are prepared and any graph is captured)."""
    if bad := sorted(set(values) - set(SWITCHES)):
        raise KernelInputError(f"unknown kernel switch {', '.join(bad)} (switches: {', '.join(SWITCHES)})")
    globals().update({name: bool(v) for name, v in values.items()})


@dataclass(frozen=True)
class Int4Host:
    """A host W4A16 matrix [N, K]: ``packed`` int32 [N, K/8] (compressed-tensors order), ``scale``
    [N, K/G] float16 (or float32 / bfloat16: ``workbench.quant.int4.scales_to_float32``)."""
    packed: Any
    scale: Any


@dataclass(frozen=True)
class Bf16Host:
    """A host W16A16 matrix [N, K]: ``bits`` uint16 bfloat16 (``workbench.quant.w16a16``). It runs on the
    BLAS path only, whatever its size: bf16(x) @ W.T with float32 sums and output (cuBLAS's bf16 GEMM);
    ``out16``: the output rounded to bf16 (a routed expert's linear on grouped GEMMs)."""
    bits: Any
    out16: bool = False


@dataclass(frozen=True)
class Bf16Experts:
    """bf16 routed experts as torch tensors where the BLAS ops run: w13 [E, 2I, D] (gate rows, then up),
    w2 [E, D, I]."""
    w13: Any
    w2: Any


def _bf16(m: Bf16Host, transpose: bool = True):
    """W.T [K, N] (or W itself) as a bfloat16 torch tensor where the BLAS ops run."""
    if not BLAS:
        raise KernelInputError("W16A16 matrices run on the BLAS path (torch), which is off here")
    bits = np.asarray(m.bits)
    return blas.weight16(bits.T if transpose else bits)


def _scales32(m: Int4Host) -> np.ndarray:
    from numformats.int4 import scales_to_float32
    return scales_to_float32(m.scale)


def group_size(m: Int4Host) -> int:
    """G = K / (scale columns) of an INT4 matrix."""
    k = np.asarray(m.packed).shape[-1] * 8
    cols = _scales32(m).shape[-1]
    if cols == 0 or k % cols:
        raise KernelInputError(f"INT4 matrix: K={k} is not a multiple of the {cols} scale columns")
    return k // cols


def _scales16(m: Int4Host) -> np.ndarray | None:
    """The scales as float16 if float16 holds them exactly (the tile layout stores float16), else None."""
    if isinstance(m.scale, np.ndarray) and m.scale.dtype == np.float16:
        return m.scale
    s32 = _scales32(m)
    s16 = s32.astype(np.float16)
    return s16 if np.array_equal(s16.astype(np.float32), s32) else None


def _device(w):
    """A repacked weight (Int4Weight / MoEWeights) where the kernels read it."""
    return w if SIMULATED else w.to_device()


# ---- prepared weights ----------------------------------------------------------------------------

def _blas(elements: int, fast: bool) -> bool:
    return fast and BLAS and elements >= BLAS_MIN_ELEMENTS


@dataclass(frozen=True)
class Dense:
    """An FP32 projection ``y = x @ W.T``; ``wt`` = W.T [K, N] on the device (a torch tensor on the
    BLAS path)."""
    path: str
    wt: Any

    @property
    def n(self) -> int:
        """Output features N."""
        return self.wt.n if self.path == W16A16 else int(self.wt.shape[1])


def dense(w, fast: bool = True) -> Dense:
    """W [N, K]: any float dtype (widened to float32 exactly), or a ``Bf16Host`` (W16A16)."""
    if isinstance(w, Bf16Host):
        return dense_w16(_bf16(w))
    wt = np.asarray(w, np.float32).T
    if _blas(wt.size, fast):
        return Dense(BLAS_PATH, blas.weight(wt))
    return Dense(PORTABLE, to_device(wt))


def _w16_fits(w_t) -> bool:
    return W16_KERNEL and w_t.shape[0] % 16 == 0 and w_t.shape[1] % 16 == 0


def dense_w16(w_t) -> Dense:
    """A W16A16 projection from W.T [K, N] as a torch bfloat16 tensor where the ops run: repacked for the
    W16A16 kernel where it runs (``W16_KERNEL``, N and K multiples of 16), else on the BLAS path."""
    return Dense(W16A16, repack_w16(w_t)) if _w16_fits(w_t) else Dense(BLAS_PATH, w_t)


def swiglu_w16(width: int, dim: int, w13_t, w2_t) -> SwiGLU:
    """A W16A16 SwiGLU from W13.T [D, 2I] and W2.T [I, D] (torch bfloat16 where the ops run)."""
    if _w16_fits(w13_t) and _w16_fits(w2_t):
        return SwiGLU(W16A16, width, dim, w13=repack_w16(w13_t), w2=repack_w16(w2_t))
    return SwiGLU(BLAS_PATH, width, dim, w13=w13_t, w2=w2_t)


@dataclass(frozen=True)
class MLA:
    """The absorbed attention's weights: wkv_b [H*(N+V), C] on the device, the path it runs on, and
    whether it is the W16A16 core (bf16 operands and latent cache); for that core on the W16A16 kernel,
    W_UK and W_UV of every head as grouped matrices: ``uk`` [H*C, N] and ``uv`` [H*V, C]."""
    path: str
    wkv_b: Any
    a16: bool = False
    uk: Bf16Weight | None = None
    uv: Bf16Weight | None = None


def mla_weights(wkv_b, fast: bool = True, n_heads: int = 0, nope: int = 0) -> MLA:
    """wkv_b [H*(N+V), C]: float (widened to float32), or a ``Bf16Host``: the W16A16 attention core
    (``mla_w16``)."""
    if isinstance(wkv_b, Bf16Host):
        return mla_w16(_bf16(wkv_b, transpose=False), n_heads, nope)
    w = np.asarray(wkv_b, np.float32)
    return MLA(BLAS_PATH if _blas(w.size, fast) else PORTABLE, to_device(w))


def mla_w16(w, n_heads: int = 0, nope: int = 0) -> MLA:
    """The W16A16 attention core (bf16 latent rows and operands, float32 sums:
    ``workbench.reference.mla.mla_absorbed``) from wkv_b [H*(N+V), C] as a torch bfloat16 tensor where
    the ops run: on the BLAS path, its absorptions on the W16A16 kernel where it runs (``W16_ABSORB``;
    needs ``n_heads`` and ``nope``)."""
    if not (n_heads and W16_ABSORB):
        return MLA(BLAS_PATH, w, a16=True)
    hw = w.reshape(n_heads, -1, w.shape[1])                                      # [H, N+V, C]
    uk_t = hw[:, :nope].permute(1, 0, 2).reshape(nope, -1)                       # W_UK.T [N, H*C]
    uv_t = hw[:, nope:].reshape(-1, w.shape[1]).T                                # W_UV.T [C, H*V]
    if not (_w16_fits(uk_t) and _w16_fits(uv_t)):
        return MLA(BLAS_PATH, w, a16=True)
    return MLA(BLAS_PATH, w, True, repack_w16(uk_t), repack_w16(uv_t))


@dataclass(frozen=True)
class Router:
    """The noaux_tc router: gate_t [D, E] and bias [E] on the device and its kernel (router.py). PORTABLE:
    the kernel computes a row's logits in its own block; SLICED (a gate of at least BLAS_MIN_ELEMENTS
    where the BLAS path would run): ``logit_slices_kernel`` writes them in S slices, the kernel sums
    and selects."""
    path: str
    gate_t: Any
    bias: Any
    kernel: Any
    top_k: int
    n_experts: int
    slices: int = 0


def router(gate: np.ndarray, bias: np.ndarray, top_k: int, n_group: int, topk_group: int,
           norm_topk: bool, scaling: float, fast: bool = True) -> Router:
    """gate [E, D], bias [E] and the routing constants of ``workbench.reference.moe.moe_gate``."""
    gate = np.asarray(gate, np.float32)
    e, d = gate.shape
    slices = logit_slice_count(d) if _blas(gate.size, fast) else 0
    kernel = make_route(e, top_k, n_group, topk_group, norm_topk, scaling, slices=slices)
    return Router(SLICED if slices else PORTABLE, to_device(np.ascontiguousarray(gate.T)),
                  to_device(np.asarray(bias, np.float32)), kernel, int(top_k), e, slices)


@dataclass(frozen=True)
class SwiGLU:
    """``w2 (silu(w1 x) * (w3 x))`` of width I over D: an INT4_MATMUL pair (w13 = [w1; w3] [2I, D] and
    w2 [D, I], repacked), a W16A16 pair (``Bf16Weight`` of the same), a BLAS pair (w13 / w2 as torch
    [D, 2I] / [I, D]) or a PORTABLE one-expert stack (ffn.py layouts)."""
    path: str
    width: int
    dim: int
    w13: Any = None
    w2: Any = None
    stack: dict | None = None


def _repack(m: Int4Host) -> Int4Weight | None:
    s16 = _scales16(m)
    if s16 is None:
        return None
    try:
        return _device(repack_int4(np.asarray(m.packed), s16))
    except LayoutError:
        return None


def swiglu_weights(w1, w3, w2, fast: bool = True) -> SwiGLU:
    """w1, w3 [I, D] and w2 [D, I], each a float ndarray or an ``Int4Host``, or all three ``Bf16Host``
    (W16A16, BLAS path); ``fast=False`` keeps INT4 on the portable kernels (comparisons of the two
    paths)."""
    width, dim = _rows(w1), _rows(w2)
    n16 = sum(isinstance(m, Bf16Host) for m in (w1, w3, w2))
    if n16:
        if n16 != 3:
            raise KernelInputError("a SwiGLU is W16A16 in all three matrices or in none")
        w13 = Bf16Host(np.concatenate([np.asarray(w1.bits), np.asarray(w3.bits)]))      # [2I, D]
        return swiglu_w16(width, dim, _bf16(w13), _bf16(w2))
    if fast and all(isinstance(m, Int4Host) for m in (w1, w3, w2)) and group_size(w1) == group_size(w3):
        w13 = _repack(Int4Host(np.concatenate([np.asarray(w1.packed), np.asarray(w3.packed)]),
                               np.concatenate([_scales32(w1), _scales32(w3)])))
        down = _repack(w2)
        if w13 is not None and down is not None:
            return SwiGLU(INT4_MATMUL, width, dim, w13=w13, w2=down)
    if not any(isinstance(m, Int4Host) for m in (w1, w3, w2)) and _blas(3 * width * dim, fast):
        w13 = np.concatenate([np.asarray(w1, np.float32), np.asarray(w3, np.float32)])     # [2I, D]
        w2t = np.asarray(w2, np.float32).T                                                  # [I, D]
        return SwiGLU(BLAS_PATH, width, dim, w13=blas.weight(w13.T), w2=blas.weight(w2t))
    return SwiGLU(PORTABLE, width, dim, stack=portable_stack([(w1, w3, w2)]))


@dataclass(frozen=True)
class MoE:
    """Router + routed experts + shared experts: FUSED_MOE (``fused``, the shared expert inside when
    fused.n_shared), GROUPED_MM (``grouped``, bf16 experts) or PORTABLE (``stack``); ``shared`` is the
    shared expert when it runs on its own."""
    path: str
    router: Router
    width: int
    dim: int
    fused: MoEWeights | None = None
    stack: dict | None = None
    shared: SwiGLU | None = None
    grouped: Bf16Experts | None = None


def moe_weights(rt: Router, experts: list[tuple], shared: tuple | None, fast: bool = True) -> MoE:
    """experts: (w1, w3, w2) per routed expert, all float, all ``Int4Host`` or all ``Bf16Host`` with
    ``out16`` (grouped GEMMs, BLAS path); shared: (w1, w3, w2) of width S*I, or None; ``fast`` as in
    ``swiglu_weights``."""
    kinds = {isinstance(m, Int4Host) for e in experts for m in e}
    if len(kinds) != 1:
        raise KernelInputError("routed experts must be all FP or all INT4")
    width, dim = _rows(experts[0][0]), _rows(experts[0][2])
    n16 = sum(isinstance(m, Bf16Host) for e in experts for m in e)
    if n16:
        if n16 != 3 * len(experts) or not all(m.out16 for e in experts for m in e):
            raise KernelInputError("bf16 routed experts are all Bf16Host with out16 (grouped GEMMs write "
                                   "bf16: workbench.quant.w16a16.w16a16(..., experts=True)), or none is")
        w13 = np.stack([np.concatenate([np.asarray(e[0].bits), np.asarray(e[1].bits)]) for e in experts])
        w2 = np.stack([np.asarray(e[2].bits) for e in experts])                          # [E, D, I]
        grouped = Bf16Experts(_bf16(Bf16Host(w13), transpose=False), _bf16(Bf16Host(w2), transpose=False))
        return MoE(GROUPED_MM, rt, width, dim, grouped=grouped,
                   shared=swiglu_weights(*shared, fast=fast) if shared is not None else None)
    fused = None
    if fast and kinds == {True}:
        fuse_shared = shared is not None and all(isinstance(m, Int4Host) for m in shared)
        fused = _fused(experts, shared if fuse_shared else None)
        if fused is None and fuse_shared:                     # the shared expert alone does not fit
            fused = _fused(experts, None)
    if fused is not None:
        alone = swiglu_weights(*shared, fast=fast) if shared is not None and not fused.n_shared else None
        return MoE(FUSED_MOE, rt, width, dim, fused=fused, shared=alone)
    return MoE(PORTABLE, rt, width, dim, stack=portable_stack(experts),
               shared=swiglu_weights(*shared, fast=fast) if shared is not None else None)


def repack_experts(w1: tuple, w3: tuple, w2: tuple) -> tuple:
    """Routed experts in fused_moe's tile layout, host arrays: w1, w3 [E, I, D] and w2 [E, D, I], each
    (packed int32 [E, N, K/8], scale float16 [E, N, K/G]) -> (w13 words, w13 scale words, w2 words, w2
    scale words, G). The expert is the outermost dimension of each, so the results of consecutive chunks
    of experts concatenate (``fused_experts``): worker processes can repack a layer chunk by chunk."""
    try:
        w = prepare_moe(w1[0], w1[1], w3[0], w3[1], w2[0], w2[1])
    except LayoutError as e:
        raise KernelInputError(f"the experts do not fit fused_moe's layout: {e}") from None
    return w.w13.wq, w.w13.sq, w.w2.wq, w.w2.sq, w.w13.group_size


def fused_experts(chunks: list[tuple], n_experts: int, dim: int, width: int) -> MoEWeights:
    """One stack (host arrays, no shared expert inside) of the ``repack_experts`` results of consecutive
    chunks of ``n_experts`` experts of width I = ``width`` over D = ``dim``."""
    if len({c[4] for c in chunks}) != 1:
        raise KernelInputError("fused_moe takes one INT4 group size per stack")
    cat = [np.concatenate([c[j] for c in chunks]) for j in range(4)]
    group = chunks[0][4]
    return MoEWeights(Int4Weight(cat[0], cat[1], width, dim, group, n_experts, pair=True),
                      Int4Weight(cat[2], cat[3], dim, width, group, n_experts), n_experts, 0)


def moe_fused(rt: Router, fused: MoEWeights, shared: SwiGLU | None = None) -> MoE:
    """The MoE on fused_moe over experts already in its layout (``fused_experts``, host or device; host
    stacks are copied to the device), ``shared`` running on its own."""
    if fused.n_routed + fused.n_shared > MAX_FUSED_EXPERTS:
        raise KernelInputError(f"fused_moe takes at most {MAX_FUSED_EXPERTS} experts, got "
                               f"{fused.n_routed + fused.n_shared}")
    if isinstance(fused.w13.wq, np.ndarray):
        fused = _device(fused)
    return MoE(FUSED_MOE, rt, fused.w13.n, fused.w13.k, fused=fused, shared=shared)


def moe_grouped(rt: Router, experts: Bf16Experts, shared: SwiGLU | None = None) -> MoE:
    """The MoE on grouped GEMMs over bf16 experts already where the BLAS ops run (w13 [E, 2I, D])."""
    if not BLAS:
        raise KernelInputError("bf16 experts run on the BLAS path (torch), which is off here")
    e, i2, d = experts.w13.shape
    return MoE(GROUPED_MM, rt, i2 // 2, d, grouped=experts, shared=shared)


def moe_portable(rt: Router, stack: dict, shared: SwiGLU | None = None) -> MoE:
    """The MoE on the portable FFN kernels over an ffn.py expert stack (``portable_stack``, or FP32 w1t /
    w3t [E, D, I], w2t [E, I, D] built elsewhere with ``"int4": False`` and ``"width"``)."""
    d = int(stack["w2t"].shape[2] if not stack["int4"] else stack["p2t"].shape[2])
    return MoE(PORTABLE, rt, int(stack["width"]), d, stack=stack, shared=shared)


def _fused(experts: list[tuple], shared: tuple | None) -> MoEWeights | None:
    """prepare_moe of the experts (and shared), or None where fused_moe cannot take them."""
    n = len(experts) + (_rows(shared[0]) // _rows(experts[0][0]) if shared is not None else 0)
    if n > MAX_FUSED_EXPERTS or len({group_size(m) for e in experts for m in e}) != 1:
        return None
    args = []
    for j in range(3):
        scales = [_scales16(e[j]) for e in experts]
        if any(s is None for s in scales):
            return None
        args += [np.stack([np.asarray(e[j].packed) for e in experts]), np.stack(scales)]
    sh = None
    if shared is not None:
        sh = []
        for m in shared:
            s16 = _scales16(m)
            if s16 is None or group_size(m) != group_size(experts[0][0]):
                return None
            sh += [np.asarray(m.packed), s16]
    try:
        return _device(prepare_moe(*args, shared=sh))
    except (LayoutError, KernelInputError):
        return None


def _rows(m) -> int:
    if isinstance(m, Bf16Host):
        return int(np.asarray(m.bits).shape[0])
    return int(np.asarray(m.packed if isinstance(m, Int4Host) else m).shape[0])


def portable_stack(experts: list[tuple]) -> dict:
    """The ffn.py expert stack of SwiGLUs (w1, w3, w2), FP32 or W4A16 (one kind and group size)."""
    int4 = isinstance(experts[0][0], Int4Host)
    if any(isinstance(m, Int4Host) != int4 for e in experts for m in e):
        raise KernelInputError("a portable expert stack must be all FP32 or all INT4")
    if not int4:
        w1, w3, w2 = (np.stack([np.asarray(e[j], np.float32).T for e in experts]) for j in range(3))
        return {"int4": False, "w1t": to_device(w1), "w3t": to_device(w3), "w2t": to_device(w2),
                "width": w1.shape[2]}                                          # [E, D, I] x2, [E, I, D]
    out: dict[str, Any] = {"int4": True}
    groups = {group_size(m) for e in experts for m in e}
    if len(groups) != 1:
        raise KernelInputError(f"a portable INT4 stack takes one group size, got {sorted(groups)}")
    for j, proj in enumerate(("1", "3", "2")):                                  # [E, K/8, N], [E, K/G, N]
        out[f"p{proj}t"] = to_device(np.stack([np.asarray(e[j].packed).view(np.int32).T for e in experts]))
        out[f"s{proj}t"] = to_device(np.stack([_scales32(e[j]).T for e in experts]).astype(np.float32))
    out["group"] = np.int32(groups.pop())
    out["width"] = int(out["p1t"].shape[2])
    return out


# ---- work buffers --------------------------------------------------------------------------------

class Scratch:
    """Work buffers of ``swiglu`` and ``moe`` for up to ``rows`` rows and the given prepared weights,
    allocated once (fixed addresses, so captured graphs replay). MoE workspaces are per row count:
    ``reserve(n)`` makes them for n rows (before a capture), ``workspace`` only looks them up."""

    def __init__(self, rows: int, swiglus: list[SwiGLU], moes: list[MoE], routers: tuple = ()) -> None:
        self.rows = rows
        all_routers = [*(m.router for m in moes), *routers]
        sliced = [r for r in all_routers if r.path == SLICED]
        k = max((r.top_k for r in all_routers), default=1)
        sw = [*swiglus, *(m.shared for m in moes if m.shared is not None)]
        port = [s for s in sw if s.path == PORTABLE]
        fast = [s for s in sw if s.path == INT4_MATMUL]
        f32_act = [s for s in sw if s.path in (BLAS_PATH, W16A16)]       # gate || up, silu(g) * u float32
        fused = [m for m in moes if m.path == FUSED_MOE]
        self.rids = zeros((rows, k), np.int32)                                  # [T, K] routed ids
        self.rwts = zeros((rows, k))                                            # [T, K] routed weights
        self.hid = zeros((rows, k, max((m.width for m in moes if m.path == PORTABLE), default=1)))
        self.hid1 = zeros((rows, 1, max((s.width for s in port), default=1)))   # [T, 1, I] one expert
        self.slot0 = zeros((rows, 1), np.int32)                                 # its id (0) and weight (1)
        self.one = to_device(np.ones((rows, 1), np.float32))
        dim = max((x.dim for x in [*fast, *fused]), default=0)
        width = max((s.width for s in [*fast, *f32_act]), default=0)
        self.x16 = zeros(max(rows * dim, 1), np.uint16)                         # [T, D] f16 bits of x
        self.y = zeros(max(rows * dim, 1))                                      # [T, D] a block's output
        self.gu = zeros(max(rows * 2 * width, 1))                               # [T, 2I] gate || up
        self.h16 = zeros(max(rows * width, 1), np.uint16)                       # [T, I] f16(silu(g) * u)
        act_w = max((s.width for s in f32_act), default=0)
        self.act = zeros(max(rows * act_w, 1))                                # [T, I] silu(g) * u
        per_row = max((r.n_experts * r.slices for r in sliced), default=0)
        self.logits = zeros(max(rows * per_row, 1))                               # [S*T, E] sliced logits
        self.gemm = gemm_workspace(rows, [(m.n, m.k, m.group_size) for s in fast for m in (s.w13, s.w2)])
        self._fused = {_ws_key(m.fused, k): m.fused for m in fused}
        self.side = SideStream()                                                # SHARED_BESIDE's
        self._ws: dict = {}
        self.top_k = k

    def reserve(self, n: int) -> None:
        """MoE workspaces for steps of n rows (allocates: call before capturing such a step)."""
        if not 1 <= n <= self.rows:
            raise KernelInputError(f"{n} rows outside the scratch's 1..{self.rows}")
        for key, w in self._fused.items():
            if (key, n) not in self._ws:
                self._ws[key, n] = moe_workspace(n, self.top_k, w)

    def workspace(self, w: MoEWeights, n: int):
        ws = self._ws.get((_ws_key(w, self.top_k), n))
        if ws is None:
            raise KernelInputError(f"no MoE workspace for {n} rows: Scratch.reserve({n}) first")
        return ws


def _ws_key(w: MoEWeights, k: int) -> tuple:
    return w.n_routed, w.n_shared, w.w13.n, w.w13.k, w.w13.group_size, k


# ---- ops -----------------------------------------------------------------------------------------

def embed(h, table, ids, meta, rows: int, stream=0) -> None:
    """h [T, D] = table[ids] for the live rows."""
    launch(embed_kernel, rows, (TPB, row_slices(h.shape[1])), stream, (h, table, ids, meta))


def multi_tiles(w: Bf16Weight, rows: int) -> bool:
    """Whether a W16A16 product of ``rows`` rows takes NT column tiles a block (``w16a16.tiles_per_block``;
    no bit changes): where they measured faster beside one tile a block on the H200 (c49e943), three row
    tiles (17-24 rows: a 16-node verify) and K >= 2048: wo -14.7, w2 -4.3, the lm_head -17 us at 17 rows;
    at K = 1536 (wq_b) +4.1, at 33 rows mixed (wo -4.7, the head +24)."""
    return W16_MULTI_TILE and 16 < rows <= 24 and w.k >= 2048


def linear(out, x, w: Dense, meta, rows: int, stream=0, accumulate: bool = False, norm=None) -> None:
    """out [T, N] (+)= x [T, K] @ W.T; ``norm`` (weight [K], eps), a W16A16 projection on the kernel only:
    rmsnorm(x) * weight in x's place, computed in the product (``norm_linear`` picks it)."""
    if norm is not None and w.path != W16A16:
        raise KernelInputError(f"an RMSNorm folds into a W16A16 projection on the kernel, not {w.path}")
    if w.path == W16A16:
        w16a16.linear(kernel_array(out), kernel_array(x), w.wt, rows, accumulate, stream,
                      norm is None and multi_tiles(w.wt, rows),
                      norm=None if norm is None else (kernel_array(norm[0]), norm[1]))
    elif w.path == BLAS_PATH:
        blas.linear(out, x, w.wt, rows, accumulate=accumulate, stream=stream)
    else:
        _linear(out, x, w.wt, meta, rows, accumulate=accumulate, stream=stream)


def folds_norm(w: Dense, rows: int) -> bool:
    """Whether the RMSNorm before ``w`` runs inside its product (``linear(..., norm=)``): a W16A16
    projection on the kernel and up to FOLD_ROWS rows (``W16_NORM``; every block sums its rows' scales,
    and past 16 rows its registers spill)."""
    return W16_NORM and w.path == W16A16 and rows <= FOLD_ROWS


def norm_linear(out, x, norm_w, eps: float, w: Dense, xn, meta, rows: int, stream=0) -> None:
    """out [T, N] = (rmsnorm(x) * norm_w) @ W.T: folded into the product where ``folds_norm``, else the
    norm into xn [T, K] and then the linear. Before a W16A16 projection on the kernel the unfused norm
    sums as the folded one (``w16a16.norm_rows``), so a row's bits do not depend on the row count (a
    verify row equals its decode row) with or without the fold."""
    if folds_norm(w, rows):
        linear(out, x, w, meta, rows, stream, norm=(norm_w, eps))
        return
    if W16_NORM and w.path == W16A16:
        w16a16.norm_rows(kernel_array(xn), kernel_array(x), w.wt, kernel_array(norm_w), eps, rows, stream)
    else:
        rmsnorm(xn, x, norm_w, eps, meta, rows, stream)
    linear(out, xn, w, meta, rows, stream)


def mla_prep(qn, cache, a1, q_norm, kv_norm, cos, sin, depth, meta, q_rank: int, c_rank: int, eps: float,
             rows: int, stream=0, ks: int | None = None) -> None:
    """q_norm of c_q into qn; kv_norm(c_kv) || rope(k_pe) into cache rows start + i (mla.py), on
    ``ks`` warps a row (default ``norm_slices`` of the longer norm)."""
    ks = norm_slices(max(q_rank, c_rank)) if ks is None else warps(ks, "mla_prep")
    kern = make_mla_prep_kernel(*prep_counts(q_rank, c_rank, cache.shape[1] - c_rank, TPB * ks))
    launch(kern, rows, (TPB, ks), stream, (qn, cache, a1, q_norm, kv_norm, cos, sin, depth, meta,
                                          np.int32(q_rank), np.int32(c_rank), np.float32(eps)))


def attention_rows_buffers(attns, max_rows: int, max_len: int, half_rope: int) -> blas.AttentionRows | None:
    """The step's shared attention rows (``blas.AttentionRows``) when some layer's attention core (of
    ``attns``, MLA weights) is on the BLAS path, with the key mask only where a core reads it (not the
    W16A16 core kernel, ``W16_CORE_KERNEL``); None otherwise (the numba kernel needs none)."""
    blas_cores = [a for a in attns if a.path == BLAS_PATH]
    if not blas_cores:
        return None
    mask = any(not (a.a16 and W16_CORE_KERNEL) or a.uk is not None for a in blas_cores)
    return blas.AttentionRows.allocate(max_rows, max_len, half_rope, mask, _absorbed(blas_cores))


def _absorbed(attns) -> tuple[int, int] | None:
    """(H, C) of the cores with W16A16 absorptions (one model: one shape), else None."""
    shapes = {(a.uk.n // a.uv.k, a.uv.k) for a in attns if a.uk is not None}
    if len(shapes) > 1:
        raise KernelInputError(f"attention cores of several shapes {sorted(shapes)} in one step")
    return shapes.pop() if shapes else None


def attention_rows(att: blas.AttentionRows | None, cos, sin, depth, vis, meta, rows: int, stream=0) -> None:
    """Once per step, before the layers: the BLAS attention cores' rope rows and key mask (nothing
    without one)."""
    if att is not None:
        blas.attention_rows(att, cos, sin, depth, vis, meta, rows, stream)


def mla_attention(o, q, cache, w: MLA, cos, sin, depth, vis, meta, scale: float, n_heads: int, c_rank: int,
                  r_dim: int, nope: int, v_dim: int, max_keys: int, rows: int, stream=0,
                  att: blas.AttentionRows | None = None) -> None:
    """Absorbed attention of the live rows over the latent cache (ancestor / causal mask ``vis``). On the
    BLAS path ``att`` holds this step's rows (``attention_rows``); without it they are computed here."""
    if w.path == BLAS_PATH:
        if att is None:
            att = blas.AttentionRows.allocate(rows, cache.shape[0], r_dim // 2, absorbed=_absorbed([w]))
            blas.attention_rows(att, cos, sin, depth, vis, meta, rows, stream)
        if w.uk is not None:
            _mla_absorbed_w16(o, q, cache, w, att, cos, sin, depth, meta, scale, n_heads, c_rank, r_dim, nope,
                              v_dim, rows, stream)
            return
        blas.mla_attention(o, q, cache, w.wkv_b, att, depth, vis, meta, scale, n_heads, c_rank, r_dim, nope,
                           v_dim, rows, stream, W16_CORE_KERNEL)
        return
    attn = make_mla_attention(n_heads, c_rank, r_dim, nope, v_dim, max_keys)
    attn[(rows, n_heads), (TPB, KS), stream](o, q, cache, w.wkv_b, cos, sin, depth, vis, meta,
                                             np.float32(scale))


def _mla_absorbed_w16(o, q, cache, w: MLA, att, cos, sin, depth, meta, scale: float, n_heads: int,
                      c_rank: int, r_dim: int, nope: int, v_dim: int, rows: int, stream) -> None:
    """The W16A16 core with its absorptions on the W16A16 kernel: the query rows [bf16(W_UK^T q_nope) ||
    bf16(rope(q_pe))] per head (one grouped product, one rope kernel), scores / softmax / p @ c_kv on
    cuBLAS and torch (``blas.mla_core16``), then o = bf16(W_UV ctx) per head (one grouped product). With
    ``W16_FLASH`` (and a shape it tiles) the rope kernel and the cuBLAS / torch core give way to
    ``mla_flash.flash_mla``, which rotates q_pe itself and reads only the live keys."""
    if att.q_all is None or att.hidden is None:
        raise KernelInputError("this attention core needs the step's absorbed-query rows and key mask: "
                               "AttentionRows without them")
    qa, ctx = blas.kernel_view(att.q_all), blas.kernel_view(att.ctx)
    q = kernel_array(q)
    flash = W16_FLASH and mla_flash.fits(n_heads, c_rank, r_dim, nope)
    if not flash:                                            # (the one-pass core rotates q_pe itself)
        launch(mla.q_rope_kernel, (rows, n_heads), TPB, stream, (qa, q, cos, sin, depth, meta, np.int32(nope),
                                                                np.int32(r_dim), np.int32(c_rank)))
    w16a16.linear(qa, q, w.uk, rows, stream=stream, groups=Groups(c_rank, q.shape[1], nope + r_dim,
                                                                 c_rank + r_dim), round_out=True)
    if flash:
        torch = blas._torch()
        kv = blas.kernel_view
        flash_mla(ctx, kv(att.q_all.view(torch.int32)), q, kv(torch.view_as_real(att.rot)),
                  kv(torch_view(cache).view(torch.int32)), kv(att.hidden.view(torch.uint8)), meta, scale,
                  n_heads, c_rank, nope, rows, kv(att.part), kv(att.stats), stream)
    else:
        blas.mla_core16(att, cache, scale, n_heads, rows, stream, W16_SOFTMAX)
    w16a16.linear(kernel_array(o), ctx, w.uv, rows, stream=stream,
                  groups=Groups(v_dim, n_heads * c_rank, c_rank, v_dim), round_out=True)


def int4_gemm(x16, w: Int4Weight, out, workspace: GemmWorkspace | None = None, stream=0, pdl: bool = True,
              config=None):
    """out [M, N] float32 = x16 [M, K] float16 @ W.T: the W4A16 GEMM ``swiglu`` runs (int4_matmul with its
    default config, programmatic dependent launch on, split-K partials in ``workspace``); ``pdl=False``
    and ``config`` for the benchmark's comparisons."""
    return int4_matmul(x16, w, out=out, stream=stream, config=config, pdl=pdl, workspace=workspace)


def experts_fused(x16, ids, wts, w: MoEWeights, out, workspace, stream=0, config: dict | None = None,
                  accumulate: bool = False, extra=None, before_combine=None):
    """out [T, D] float32 (+= with ``accumulate``) = the fused MoE of x16 [T, D] float16 routed by ids /
    wts [T, K] (+ extra [T, D], added in its combine, launched after ``before_combine()``): what ``moe``
    runs (fused_moe, default config); ``config`` for the benchmark's alternatives."""
    return fused_moe(x16, ids, wts, w, out=out, workspace=workspace, stream=stream, config=config,
                     accumulate=accumulate, extra=extra, before_combine=before_combine)


def _to_f16(sc: Scratch, x, dim: int, meta, rows: int, stream):
    """f16(x) of the live rows into the scratch; returns it as the kernels' float16 [rows, D] array."""
    x16 = rows_view(sc.x16, rows, dim)
    launch(to_f16_kernel, (col_blocks(dim), rows), TPB, stream, (x16, x, meta))
    return kernel_array(x16, np.float16)


def _add(h, y, meta, rows: int, stream) -> None:
    launch(add_rows_kernel, (col_blocks(y.shape[1]), rows), TPB, stream, (h, y, meta))


def swiglu(h, x, w: SwiGLU, sc: Scratch, meta, rows: int, stream=0, accumulate: bool = True) -> None:
    """h [T, D] += w2 (silu(w1 x) * (w3 x)) for x [T, D] (dense MLP or shared expert); ``accumulate=False``
    (W16A16 only): h = that product."""
    if not accumulate and w.path != W16A16:
        raise KernelInputError(f"only the W16A16 SwiGLU writes its product without adding it, not {w.path}")
    if w.path == INT4_MATMUL:
        i, d = w.width, w.dim
        gu, h16, y = rows_view(sc.gu, rows, 2 * i), rows_view(sc.h16, rows, i), rows_view(sc.y, rows, d)
        int4_gemm(_to_f16(sc, x, d, meta, rows, stream), w.w13, kernel_array(gu), sc.gemm, stream)
        launch(moe_act_kernel, (-(-i // 128), rows), 128, stream,
               (flat(kernel_array(h16)), flat(kernel_array(gu)), i))
        int4_gemm(kernel_array(h16, np.float16), w.w2, kernel_array(y), sc.gemm, stream)
        _add(h, y, meta, rows, stream)
        return
    if w.path == W16A16:
        gu = kernel_array(rows_view(sc.gu, rows, 2 * w.width))
        act = kernel_array(rows_view(sc.act, rows, w.width))
        if W16_PERSISTENT and persistent.fits(w.dim, w.width, rows):
            persistent.persistent_swiglu(kernel_array(h), kernel_array(x), w.w13, w.w2, gu, act, rows,
                                         accumulate, stream)
            return
        w16a16.linear(gu, kernel_array(x), w.w13, rows, stream=stream, multi_tile=multi_tiles(w.w13, rows))
        if not W16_GLU_FOLD:
            w16a16.glu_rows(act, gu, rows, stream)
        w16a16.linear(kernel_array(h), gu if W16_GLU_FOLD else act, w.w2, rows, accumulate=accumulate,
                      stream=stream, multi_tile=multi_tiles(w.w2, rows), glu=W16_GLU_FOLD)
        return
    if w.path == BLAS_PATH:
        blas.swiglu(h, x, w.w13, w.w2, rows_view(sc.gu, rows, 2 * w.width), rows_view(sc.act, rows, w.width),
                    rows, stream)
        return
    ffn.up(sc.hid1, x, sc.slot0, w.stack, meta, rows, stream=stream)
    ffn.down(h, sc.hid1, sc.slot0, sc.one, w.stack, meta, rows, stream=stream)


def route(ids, wts, x, r: Router, sc: Scratch, meta, rows: int, stream=0, x16=None) -> None:
    """ids, wts [T, K] = the router's choice for x [T, D] (``sc`` made with this router: its logits);
    ``x16`` [T, D] uint16 (a sliced router only): also f16(x), written as the logits kernel reads x."""
    if r.path == SLICED:                      # logits in slices by many blocks, then the kernel selects
        if len(sc.logits) < rows * r.n_experts * r.slices:
            raise KernelInputError(f"the scratch holds no [{r.slices} x {rows}, {r.n_experts}] router "
                                   "logits: make it with this router (Scratch(..., routers=...))")
        parts = rows_view(sc.logits, r.slices * rows, r.n_experts)
        grid = (-(-r.n_experts // TPB), r.slices)
        kernel, out16 = (logit_slices_kernel, parts) if x16 is None else (logit_slices_f16_kernel, x16)
        launch(kernel, grid, (TPB, SLICE_WARPS), stream, (parts, x, r.gate_t, meta, out16))
        launch(r.kernel, rows, (TPB, KS), stream, (ids, wts, parts, r.gate_t, r.bias, meta))
    else:
        if x16 is not None:
            raise KernelInputError("only a sliced router writes f16(x) as it reads it")
        launch(r.kernel, rows, (TPB, KS), stream, (ids, wts, x, r.gate_t, r.bias, meta))


def shares_beside(w: MoE) -> bool:
    """Whether ``moe`` can run this block's shared expert beside its routed experts: a W16A16 one beside
    fused_moe."""
    return w.path == FUSED_MOE and w.shared is not None and w.shared.path == W16A16


def moe(h, x, w: MoE, sc: Scratch, meta, rows: int, stream=0, beside: bool | None = None) -> None:
    """h [T, D] += the MoE block of x [T, D]: router, routed experts, shared experts. Beside
    (``shares_beside``; ``beside`` None: ``SHARED_BESIDE``) the shared expert runs on the scratch's second
    stream from the point x is ready, while the router picks and the experts load, into the scratch's y,
    which fused_moe's combine adds last (the bits of adding it afterwards). Its launches are issued after
    the routed ones, before the combine (``device.SideStream``: one second stream for a whole graph)."""
    beside = (SHARED_BESIDE if beside is None else beside) and shares_beside(w)
    if beside:
        sc.side.mark(stream)
    folded = w.path == FUSED_MOE and w.router.path == SLICED           # f16(x) from the router's read of x
    route(sc.rids, sc.rwts, x, w.router, sc, meta, rows, stream,
          rows_view(sc.x16, rows, w.dim) if folded else None)
    if w.path == FUSED_MOE and not folded:
        _to_f16(sc, x, w.dim, meta, rows, stream)
    if not beside:
        routed_experts(h, x, sc.rids, sc.rwts, w, sc, meta, rows, stream)
        if w.shared is not None:
            swiglu(h, x, w.shared, sc, meta, rows, stream)
        return
    shared = rows_view(sc.y, rows, w.dim)

    def shared_then_join() -> None:
        swiglu(shared, x, w.shared, sc, meta, rows, sc.side.fork(), accumulate=False)
        sc.side.join(stream)
    routed_experts(h, x, sc.rids, sc.rwts, w, sc, meta, rows, stream, shared, shared_then_join)


def routed_experts(h, x, ids, wts, w: MoE, sc: Scratch, meta, rows: int, stream=0, extra=None,
                   before_combine=None) -> None:
    """h [T, D] += the routed experts of x [T, D] routed by ids / wts [T, K] (``moe``'s middle stage;
    ``bench k2`` times it alone). fused_moe reads f16(x) from the scratch (``moe`` converts it first) and
    its combine adds each row's sum into h, then ``extra`` [T, D] (fused_moe only, as ``experts_fused``:
    launched after ``before_combine()``, which may launch what writes it)."""
    if extra is not None and w.path != FUSED_MOE:
        raise KernelInputError(f"only fused_moe's combine adds a shared expert's rows, not {w.path}")
    if w.path == FUSED_MOE:
        experts_fused(kernel_array(rows_view(sc.x16, rows, w.dim), np.float16),
                      kernel_array(head_rows(ids, rows)), kernel_array(head_rows(wts, rows)), w.fused,
                      kernel_array(head_rows(h, rows)), sc.workspace(w.fused, rows), stream, accumulate=True,
                      extra=None if extra is None else kernel_array(extra), before_combine=before_combine)
    elif w.path == GROUPED_MM:
        blas.experts_grouped(h, x, ids, wts, w.grouped.w13, w.grouped.w2, rows, stream)
    else:
        ffn.up(sc.hid, x, ids, w.stack, meta, rows, stream=stream)
        ffn.down(h, sc.hid, ids, wts, w.stack, meta, rows, stream=stream)


def argmax(out, logits, meta, rows: int, stream=0, ks: int | None = None) -> None:
    """out [T] int32 = argmax per live row (ties to the lowest id); ``ks`` warps a row (default
    ``tokens.argmax_slices``)."""
    ks = argmax_slices(logits.shape[1]) if ks is None else warps(ks, "argmax")
    launch(argmax_kernel, rows, (TPB, ks), stream, (out, logits, meta))


def copy_rows(dst, src, meta, rows: int, stream=0) -> None:
    launch(copy_rows_kernel, rows, (TPB, row_slices(src.shape[1])), stream, (dst, src, meta))


def advance(ids, amax, out, meta, stream=0) -> None:
    """AR decode bookkeeping on the device: emit amax[0], feed it back as ids[0], start += 1."""
    launch(advance_kernel, 1, 1, stream, (ids, amax, out, meta))


def kv_compact(cache, ctl, n_layers: int, stream=0) -> None:
    """Move the previous round's accepted rows together in every layer's latent cache (kv.py)."""
    launch(kv_compact_kernel, n_layers, TPB, stream, (cache, ctl))


def tree_compile(ids, depth, vis, meta, ctl, stream=0) -> None:
    """Tree ids, depths and the ancestor mask from the control block (tree.py)."""
    launch(tree_compile_kernel, 1, TPB, stream, (ids, depth, vis, meta, ctl))


__all__ = ["BLAS_PATH", "Bf16Experts", "Bf16Host", "Bf16Weight", "W16A16", "dense_w16", "swiglu_w16",
           "unrepack_w16", "Dense", "FUSED_MOE", "GROUPED_MM", "INT4_MATMUL",
           "Int4Host", "Int4Weight", "LayoutError", "MLA", "MoE", "MoEWeights", "PORTABLE", "Router",
           "Scratch", "Staged", "SwiGLU", "advance", "argmax", "attention_rows", "attention_rows_buffers",
           "choose_config", "choose_moe_config", "copy_rows", "dense", "draft_attention",
           "draft_attention_workspace", "draft_gather_rows", "draft_head_norm_rope", "embed", "expert_tiles",
           "experts_fused", "folds_norm", "fused_experts", "GEMV_TOKENS",
           "gemm_workspace", "group_size", "int4_gemm", "kv_compact", "linear", "mla_attention", "mla_prep",
           "mla_w16", "mla_weights", "moe", "moe_fused", "moe_grouped", "moe_portable", "moe_stages",
           "moe_weights", "moe_workspace", "norm_linear", "padded_keys", "portable_stack", "repack_experts",
           "rmsnorm", "route", "routed_experts", "router", "shares_beside", "sim_speed", "swiglu",
           "swiglu_weights",
           "tiled_config", "topk_logprobs", "torch_view", "tree_compile", "unrepack_int4"]
# the kernel ladders' group (dev/kernels/)
__all__ += ["GemmWorkspace", "TILE_ROWS", "stream_k_config",
            "fused_moe", "int4_matmul", "make_int4_matmul_kernel", "make_int4_staged_kernel",
            "make_moe_gemm_kernel", "prepare_moe", "repack_int4", "staged_partials", "Wgmma", "wgmma_config"]
