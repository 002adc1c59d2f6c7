"""FP32 vs INT4 comparisons for the divergence notebook: per-position KL, top-1 agreement, logit
error, per-layer hidden-state error and per-matrix quantization error.

Legend: T positions, V vocabulary, M model width, N x K one weight matrix, G group size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..quant.int4 import dequantize_int4, quantize_int4
from ..quant.policy import policy_names
from ..reference.model import LatentCache, forward


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64: [T, V] -> [T, V]."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(P || Q) in nats per row, P = softmax(p_logits) (the reference), Q = softmax(q_logits): [T]."""
    p_logits, q_logits = np.asarray(p_logits), np.asarray(q_logits)
    if p_logits.shape != q_logits.shape or p_logits.ndim != 2:
        raise InputError(f"KL wants two [T, V] arrays of one shape, got {p_logits.shape}, {q_logits.shape}")
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return np.maximum((np.exp(lp) * (lp - lq)).sum(axis=-1), 0.0)     # clip float rounding below 0


def first_divergence(a: Any, b: Any) -> int | None:
    """Index of the first position where two token sequences differ (over the shorter), else None."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else None


@dataclass
class TeacherForced:
    logits: np.ndarray               # [T, V] float32, row t predicts token t+1 of prompt + forced
    hidden: dict[int, np.ndarray]    # layer -> [T, M] block outputs


def teacher_forced(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, forced: Any,
                   capture: tuple[int, ...] = ()) -> TeacherForced:
    """One causal forward over prompt + forced tokens; keeps the rows that predict the forced tokens.

    The returned rows t = 0..len(forced)-1 are the logits after prompt + forced[:t], so row t is
    the distribution the model puts on forced[t] (the same rows greedy decoding would see).
    """
    seq = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(forced, dtype=np.int64)])
    if seq.size > cfg.max_position_embeddings:
        raise InputError(f"{seq.size} tokens exceed max_position_embeddings {cfg.max_position_embeddings}")
    n_prompt = len(prompt)
    out = forward(cfg, weights, seq, LatentCache.empty(cfg, seq.size), capture=capture)
    rows = slice(n_prompt - 1, seq.size - 1)
    return TeacherForced(logits=out.logits[rows], hidden={k: v[rows] for k, v in out.hidden.items()})


def compare_logits(ref: np.ndarray, test: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position KL(ref || test) [nats], top-1 agreement (bool) and max |logit difference|."""
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    return {"kl": kl_divergence(ref, test),
            "top1_agree": ref.argmax(axis=-1) == test.argmax(axis=-1),
            "max_abs_logit_err": np.abs(ref - test).max(axis=-1)}


def forced_summary(ref: TeacherForced, test: TeacherForced, forced: Any, margins: Any) -> dict[str, float]:
    """Summary of one teacher-forced comparison: KL (mean, p99), top-1 agreement, mean max |logit error|,
    the FP32 self-check (its argmax reproduces the forced tokens) and the median FP32 margin."""
    c = compare_logits(ref.logits, test.logits)
    return {"positions": int(c["kl"].size),
            "fp32_reproduces_forced": float(np.mean(ref.logits.argmax(-1) == np.asarray(forced))),
            "mean_kl_nats": float(c["kl"].mean()), "p99_kl_nats": float(np.quantile(c["kl"], 0.99)),
            "top1_agreement": float(c["top1_agree"].mean()),
            "mean_max_abs_logit_err": float(c["max_abs_logit_err"].mean()),
            "median_fp32_margin": float(np.median(margins))}


def relative_error(ref: np.ndarray, test: np.ndarray, axis: int | None = None) -> np.ndarray:
    """||test - ref|| / ||ref|| (Frobenius over ``axis``, all axes when None); 0/0 counts as 0."""
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    num = np.sqrt(((test - ref) ** 2).sum(axis=axis))
    den = np.sqrt((ref ** 2).sum(axis=axis))
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))


def hidden_errors(ref: dict[int, np.ndarray], test: dict[int, np.ndarray]) -> list[dict[str, float]]:
    """Per layer: mean and max over positions of the relative error of the block output rows."""
    out = []
    for layer in sorted(ref):
        per_pos = relative_error(ref[layer], test[layer], axis=-1)                 # [T]
        out.append({"layer": layer, "mean_rel_err": float(per_pos.mean()),
                    "max_rel_err": float(per_pos.max())})
    return out


def group_size_fits(cfg: ModelConfig, weights: dict[str, Any], policy: str, group_size: int) -> bool:
    """True when every matrix ``policy`` quantizes has an input dim that is a multiple of group_size."""
    return all(np.shape(weights[n])[-1] % group_size == 0 for n in policy_names(cfg, policy))


def matrix_kind(name: str) -> str:
    """'layers.3.ffn.experts.5.w1' -> 'expert w1'; dense 'ffn.w2' -> 'dense w2'; 'shared w3'."""
    parts = name.split(".")
    where = "expert" if "experts" in parts else "shared" if "shared" in parts else "dense"
    return f"{where} {parts[-1]}"


def quantization_errors(cfg: ModelConfig, weights: dict[str, Any],
                        group_sizes: tuple[int, ...] = (32, 64, 128),
                        policy: str = "mlp") -> list[dict[str, Any]]:
    """One row per (matrix, G): relative Frobenius error and max |error| / max |w| of quantize->dequantize."""
    rows = []
    for name in policy_names(cfg, policy):
        w = np.asarray(weights[name], dtype=np.float32)                             # [N, K]
        for g in group_sizes:
            codes, scales = quantize_int4(w, g)
            err = dequantize_int4(codes, scales, g) - w
            rows.append({"matrix": name, "kind": matrix_kind(name), "group_size": g, "shape": list(w.shape),
                         "rel_frobenius_err": float(relative_error(w, w + err)),
                         "max_abs_err_over_max_w": float(np.abs(err).max() / max(np.abs(w).max(), 1e-30))})
    return rows

