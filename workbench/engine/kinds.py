"""How a built layer holds its weights: the routed experts' kind and the dense projections' kind.

``build.build_layer`` records both on the ``DeviceLayer`` it builds (read from the prepared parts, so
they say what runs); ``bench k2`` compares the kinds and labels its rows with their values.
"""

from __future__ import annotations

from enum import StrEnum


class ExpertKind(StrEnum):
    """The routed experts of a MoE layer."""
    INT4 = "int4"     # W4A16 words: fused_moe where its tile layout holds them, the portable FFN otherwise
    FP32 = "fp32"     # float32 (INT4 values dequantized, exact): the portable FFN kernels
    BF16 = "bf16"     # bf16 weights with bf16 outputs: grouped GEMMs on the BLAS path


class DenseKind(StrEnum):
    """The attention projections, shared expert and dense MLP."""
    FP32 = "fp32"     # widened to float32 (bf16 values widen exactly)
    BF16 = "bf16"     # W16A16 (``workbench.quant.w16a16``): bf16 GEMMs on the BLAS path, bf16 latent cache


def kind(cls, value, what: str):
    """``value`` (a kind or its string) as a ``cls``; InputError naming the choices otherwise."""
    try:
        return cls(value)
    except ValueError:
        from ..errors import InputError
        raise InputError(f"{what} must be one of {', '.join(k.value for k in cls)}, got {value!r}") from None
