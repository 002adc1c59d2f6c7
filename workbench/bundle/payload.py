"""Payload rules checked on every load and before every write: sections and INT4 pairs.

Sections: prompt and golden are int32 [T] token ids in [0, vocab_size); margins is float32 [len(golden)],
finite and >= 0 (top-1 minus top-2 logit of each golden step).
INT4 (docs/conventions.md): a quantized linear X is ``X.packed`` int32 [N, K/8] plus ``X.scale``
float16 or bfloat16 [N, K/G] with G = K / (scale columns) in GROUP_SIZES, scales finite and > 0,
and no plain ``X`` next to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from numformats.bf16 import BF16Array

from .format import BundleFormatError

_E = BundleFormatError
GROUP_SIZES = (32, 64, 128)
PACKED, SCALE = ".packed", ".scale"


@dataclass(frozen=True)
class Int4Matrix:
    name: str        # the linear's name X (without .packed)
    n: int           # output rows
    k: int           # input columns = 8 * packed words per row
    group_size: int


def check_tokens(what: str, ids: np.ndarray, vocab_size: int) -> None:
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int32 or ids.ndim != 1:
        raise _E("bad_section", f"{what} must be int32 [T], got {getattr(ids, 'dtype', '?')} "
                 f"{getattr(ids, 'shape', '?')}")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
        raise _E("token_out_of_range", f"{what} holds token id {bad} outside [0, vocab_size={vocab_size})")


def check_margins(margins: np.ndarray, golden: np.ndarray) -> None:
    if not isinstance(margins, np.ndarray) or margins.dtype != np.float32 or margins.ndim != 1:
        raise _E("bad_section", f"margins must be float32 [T], got {getattr(margins, 'dtype', '?')} "
                 f"{getattr(margins, 'shape', '?')}")
    if margins.shape != golden.shape:
        raise _E("bad_margins", f"{margins.size} margins for {golden.size} golden tokens")
    if margins.size and not (np.isfinite(margins).all() and (margins >= 0).all()):
        raise _E("bad_margins", "margins must be finite and >= 0")


def int4_matrices(tensors: Mapping[str, np.ndarray | BF16Array]) -> list[Int4Matrix]:
    """Validate every ``X.packed`` / ``X.scale`` pair; returns them in name order."""
    out = []
    for name in sorted(n for n in tensors if n.endswith(PACKED)):
        base = name[: -len(PACKED)]
        packed, scale = tensors[name], tensors.get(base + SCALE)
        if base in tensors:
            raise _E("int4_conflict", f"{base!r:.80} is stored both plain and as INT4 {name!r:.80}")
        if not isinstance(packed, np.ndarray) or packed.dtype != np.int32 or packed.ndim != 2:
            raise _E("int4_shape", f"{name!r:.80} must be int32 [N, K/8], got "
                     f"{getattr(packed, 'dtype', 'bfloat16')} {list(packed.shape)}")
        if scale is None:
            raise _E("int4_missing_scale", f"{name!r:.80} has no {base + SCALE!r:.80}")
        if not (isinstance(scale, BF16Array) or scale.dtype == np.float16) or scale.ndim != 2:
            raise _E("int4_scale_dtype", f"{base + SCALE!r:.80} must be float16 or bfloat16 [N, K/G], got "
                     f"{getattr(scale, 'dtype', 'bfloat16')} {list(scale.shape)}")
        n, k = packed.shape[0], packed.shape[1] * 8
        if n == 0 or k == 0 or scale.shape[0] != n or scale.shape[1] == 0:
            raise _E("int4_shape", f"{base!r:.80}: packed {list(packed.shape)} and scale "
                     f"{list(scale.shape)} disagree (need N > 0, K > 0, same N)")
        if k % scale.shape[1] or k // scale.shape[1] not in GROUP_SIZES:
            raise _E("int4_group_size", f"{base!r:.80}: K={k} over {scale.shape[1]} scale columns is not "
                     f"a group size in {GROUP_SIZES} with K % G == 0")
        s = scale.float32() if isinstance(scale, BF16Array) else scale
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise _E("int4_bad_scale", f"{base + SCALE!r:.80} holds a zero, negative or non-finite scale")
        out.append(Int4Matrix(base, n, k, k // scale.shape[1]))
    return out


def check_payload(vocab_size: int, tensors: Mapping[str, np.ndarray | BF16Array], prompt: np.ndarray,
                  golden: np.ndarray, margins: np.ndarray) -> list[Int4Matrix]:
    """All payload rules; returns the INT4 matrices found."""
    check_tokens("prompt", prompt, vocab_size)
    check_tokens("golden", golden, vocab_size)
    check_margins(margins, golden)
    return int4_matrices(tensors)
