"""W16A16: dense projections computed with bfloat16 weights *and* bfloat16 activations.

Kimi-K2-Thinking stores attention, shared expert, dense MLP and lm_head in bf16, and a BF16 serving
engine multiplies them with bf16 activations. Without this marker the workbench widens those weights
to float32 and multiplies float32 activations (W16A32). Marking a projection ``W16A16`` defines it as

    y = bf16(x) @ W.T      W bf16, bf16(x) = x rounded to nearest bf16 (ties to even),
                           products exact in float32 (8-bit mantissas), float32 sums, y float32

which is what cuBLAS's bf16 GEMM with float32 accumulation and float32 output computes, up to the
order of the sums. A marked ``wkv_b`` makes the layer's whole attention core W16A16 as well: bf16
latent cache rows, and every product of the absorbed attention on bf16 operands with float32 sums
(``reference.mla.mla_absorbed`` names the rounding points). The residual stream, norms, rope, the
scores and softmax, and the router (float32 in K2) stay float32; so does the head, which the seeded
K2 model holds as a row-chunked table (never widened whole).

Routed experts held in bf16 (``w16a16(..., experts=True)``: the BF16-experts side of an INT4-vs-BF16
comparison) are W16A16 with bf16 outputs as well, ``y = bf16(bf16(x) @ W.T)``: what a grouped GEMM
over the experts (``torch._grouped_mm``, which writes bf16) computes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array, exact_bf16, round_bf16

from ..config import ModelConfig
from ..errors import InputError

_ATTN = ("wq_a", "wq_b", "wq", "wkv_a", "wkv_b", "wo")
_PROJ = ("w1", "w3", "w2")


@dataclass(frozen=True)
class W16A16:
    """A dense [N, K] bf16 weight whose projection rounds its input to bf16 (module docstring); with
    ``out16`` its output too (a routed expert: grouped GEMMs write bf16)."""
    w: BF16Array
    out16: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self.w.shape

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def float32(self) -> np.ndarray:
        """The weight widened exactly (what a float32 consumer of the same tensor reads)."""
        return self.w.float32()

    @staticmethod
    def round_input(x: np.ndarray) -> np.ndarray:
        """The projection's input as it multiplies: rounded to bf16 (``reference.layers.linear``)."""
        return round_bf16(x)

    def round_output(self, y: np.ndarray) -> np.ndarray:
        """The projection's output: rounded to bf16 with ``out16``, else the float32 sums as they are."""
        return round_bf16(y) if self.out16 else y

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.float32()
        return out if dtype is None else out.astype(dtype)


def w16a16_names(cfg: ModelConfig, weights: dict[str, Any]) -> list[str]:
    """The dense projections W16A16 covers that ``weights`` holds unquantized: the attention's (wkv_b
    included), dense MLPs and shared experts."""
    names = []
    for i in range(cfg.num_hidden_layers):
        names += [f"layers.{i}.attn.{p}" for p in _ATTN]
        ffn = f"layers.{i}.ffn"
        mlp = f"{ffn}.shared" if cfg.is_moe_layer(i) else ffn
        names += [f"{mlp}.{p}" for p in _PROJ]
    return [n for n in names if n in weights]


def expert_names(cfg: ModelConfig, weights: dict[str, Any]) -> list[str]:
    """The routed experts' linears ``weights`` holds unquantized (W16A16 experts: bf16 outputs)."""
    return [n for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)
            for e in range(cfg.n_routed_experts) for p in _PROJ
            if (n := f"layers.{i}.ffn.experts.{e}.{p}") in weights]


class _Marked(Mapping):
    """``weights`` with the tensors ``names`` handed out as W16A16 (marked on access, so a lazily
    generated mapping such as ``workbench.seeded.SeededWeights`` stays lazy)."""

    def __init__(self, base: Mapping[str, Any], names: list[str], out16: list[str] = ()) -> None:
        self.base, self.names, self.out16 = base, frozenset(names) | frozenset(out16), frozenset(out16)

    def __getitem__(self, name: str) -> Any:
        w = self.base[name]
        return _mark(name, w, name in self.out16) if name in self.names else w

    def __contains__(self, name: object) -> bool:
        return name in self.base

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def _mark(name: str, w: Any, out16: bool = False) -> W16A16:
    if isinstance(w, W16A16):
        return w
    exact = exact_bf16(w)
    if exact is None:
        raise InputError(f"{name} holds values bf16 cannot represent; W16A16 wants bf16 weights")
    return W16A16(exact, out16)


def w16a16(cfg: ModelConfig, weights: Mapping[str, Any], dense: bool = True,
           experts: bool = False) -> Mapping[str, Any]:
    """``weights`` with the ``w16a16_names`` tensors (``dense``) and the routed experts' linears
    (``experts``, with bf16 outputs) marked W16A16 (a read-only view; values shared). Each must hold
    bf16 values exactly (a BF16Array, or floats bf16 represents): InputError on access otherwise."""
    return _Marked(weights, w16a16_names(cfg, weights) if dense else [],
                   expert_names(cfg, weights) if experts else [])


def w16a16_marked(weights: Mapping[str, Any], names: list[str]) -> Mapping[str, Any]:
    """``weights`` with the tensors ``names`` marked W16A16 (a read-only view, as ``w16a16``): the
    drafter's linears (``workbench.ddtree.dflash.w16a16_drafter``)."""
    return _Marked(weights, names)
