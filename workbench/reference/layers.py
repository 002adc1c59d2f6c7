"""Elementwise and projection building blocks of the reference model.

Legend: S rows (tokens), K input features, N output features, I SwiGLU width.
Weights are stored [out, in] = [N, K] and applied as ``y = x @ W.T``. Computation happens in the
dtype of the activations ``x``; weights of any float dtype (float16 memmaps, bfloat16 bundle arrays)
are cast on use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputError


def as_array(w: Any, dtype: Any) -> np.ndarray:
    """``w`` as an ndarray of ``dtype``; bfloat16 bundle arrays (objects with ``.float32()``) widen first.

    No copy when ``w`` already is an ndarray of that dtype (read-only memmaps stay read-only).
    """
    if not isinstance(w, np.ndarray) and hasattr(w, "float32"):
        w = w.float32()
    return np.asarray(w, dtype=dtype)


def weight(weights: dict[str, Any], name: str) -> Any:
    """weights[name], or InputError naming the missing tensor."""
    try:
        return weights[name]
    except KeyError:
        raise InputError(f"missing weight tensor {name!r}") from None


def rmsnorm(x: np.ndarray, w: Any, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: ``w * (x / sqrt(mean(x^2) + eps))``.

    x: [..., K] float32/float64 (the compute dtype); w: [K]. Normalises in x's dtype, then
    multiplies by w (the order HF uses: normalise, cast back, scale).
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)                                 # [..., 1]
    y = x * (1.0 / np.sqrt(ms + x.dtype.type(eps)))                             # [..., K]
    return as_array(w, x.dtype) * y


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function without overflow: uses exp(-|x|) on both branches."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``x * sigmoid(x)``, same dtype as x."""
    return x * sigmoid(x)


def linear(weights: dict[str, Any], name: str, x: np.ndarray) -> np.ndarray:
    """THE projection dispatch point: ``x [..., K] -> [..., N]`` for the linear called ``name``.

    - ``name`` present: a dense [N, K] matrix, computed as ``x @ W.T`` in x's dtype (by the object's
      own ``matmul_t(x)`` when it has one: ``workbench.seeded.RowTable``; with x first rounded by the
      weight's ``round_input`` when it has one: ``workbench.quant.w16a16.W16A16``, bf16 activations,
      and the product by its ``round_output``).
    - ``name.packed`` present: an INT4 W4A16 linear (int32 [N, K/8] + scale [N, K/G]), computed by
      ``workbench.quant.int4.int4_linear`` (fp16-rounded activations, (q-8)*scale weights, fp32 sums).
    - neither: InputError naming the missing tensor.
    """
    if name in weights:
        w = weights[name]
        if hasattr(w, "matmul_t"):  # a row-chunked table (seeded lm_head): never widened whole
            return w.matmul_t(x)                                                # [..., N]
        if hasattr(w, "round_input"):                                           # W16A16: bf16(x)
            return w.round_output(w.round_input(x) @ as_array(w, x.dtype).T)    # [..., N]
        return x @ as_array(w, x.dtype).T                                       # [..., N]
    if name + ".packed" in weights:
        from ..quant.int4 import int4_linear  # lazy: the quant package is optional here
        y = int4_linear(x, weights[name + ".packed"], weight(weights, name + ".scale"))  # [..., N]
        return np.asarray(y).astype(x.dtype, copy=False)
    raise InputError(f"missing weight tensor {name!r} (neither {name} nor {name}.packed is present)")


def gather_rows(table: Any, ids: np.ndarray, dtype: Any) -> np.ndarray:
    """Rows ``ids`` of an embedding table [V, M] as ``dtype`` [S, M], gathered before any widening
    (a bfloat16 table on its bits; a ``RowTable`` generates only the blocks holding them)."""
    if hasattr(table, "take_rows"):
        return as_array(table.take_rows(ids), dtype)
    rows = table[ids] if isinstance(table, np.ndarray) else type(table)(table.bits[ids])
    return as_array(rows, dtype)


def dense_weight(weights: dict[str, Any], name: str, dtype: Any) -> np.ndarray:
    """The dense [N, K] matrix of linear ``name`` in ``dtype`` (InputError if absent or INT4-packed)."""
    if name in weights:
        return as_array(weights[name], dtype)
    if name + ".packed" in weights:
        raise InputError(f"{name} is INT4-packed; this path needs it unquantized")
    raise InputError(f"missing weight tensor {name!r}")


def swiglu(weights: dict[str, Any], prefix: str, x: np.ndarray) -> np.ndarray:
    """SwiGLU MLP ``w2 (silu(w1 x) * (w3 x))``: x [S, K] -> [S, K] with weights prefix.w1/.w3 [I, K],
    prefix.w2 [K, I] (w1 = gate_proj, w3 = up_proj, w2 = down_proj)."""
    g = linear(weights, prefix + ".w1", x)                                      # [S, I]
    u = linear(weights, prefix + ".w3", x)                                      # [S, I]
    return linear(weights, prefix + ".w2", silu(g) * u)                         # [S, K]
