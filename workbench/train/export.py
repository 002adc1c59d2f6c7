"""The trained pair as KDTR bundles: BF16 weights (target + drafter), and INT4 copies with the policies
``experts`` and ``mlp`` (group 32), each with golden tokens from the numpy reference on a fixed HumanEval
prompt, the tokenizer and the training provenance.

Names: ``code.kdtr``, ``code_int4_experts.kdtr``, ``code_int4_mlp.kdtr``. The INT4 copies quantize the
BF16 bundle's own weights (what ``quantize`` would do to it) and keep every other tensor in BF16;
their goldens are the INT4 reference's, with the BF16 golden in ``meta["fp32_golden"]``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import bf16, write_bundle
from ..config import ModelConfig
from ..ddtree.config import DrafterConfig
from ..quant.policy import quantize_weights
from ..reference.generate import greedy_generate
from .humaneval import load_problems
from .tokenizer import TextTokenizer

GOLDEN_TASK = "HumanEval/2"        # truncate_number: a short prompt (109 tokens)
N_GOLDEN = 32
MAX_TOTAL_BYTES = 16_000_000       # the three bundles together (they travel with the working tree)
NAMES = {None: "code", "experts": "code_int4_experts", "mlp": "code_int4_mlp"}


def git_commit(root: Path | None = None) -> str:
    """HEAD of the repository (with '+dirty' for uncommitted changes), or 'unknown' without git."""
    root = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def golden_prompt(tok: TextTokenizer, wheels: str | None = None) -> np.ndarray:
    prob = next(p for p in load_problems(wheels) if p.task_id == GOLDEN_TASK)
    return tok.encode(prob.prompt)


def golden(cfg: ModelConfig, weights: dict[str, Any],
           prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Greedy tokens and margins (float32 reference), and {"fp32_noise": the largest float32 vs float64
    logit difference up to the first step where the two disagree, "fp64_agrees_steps": that step}."""
    g32 = greedy_generate(cfg, weights, prompt, N_GOLDEN, dtype=np.float32)
    g64 = greedy_generate(cfg, weights, prompt, N_GOLDEN, dtype=np.float64)
    n = next((i for i in range(N_GOLDEN) if g32.tokens[i] != g64.tokens[i]), N_GOLDEN)
    noise = float(np.max(np.abs(g32.logits[:n].astype(np.float64) - g64.logits[:n]))) if n else 0.0
    return g32.tokens.astype(np.int32), g32.margins.astype(np.float32), {"fp32_noise": noise,
                                                                          "fp64_agrees_steps": n}


def export_bundles(out_dir: Path, cfg: ModelConfig, dcfg: DrafterConfig, target_w: dict[str, np.ndarray],
                   drafter_w: dict[str, np.ndarray], tok: TextTokenizer, training: dict[str, Any],
                   provenance: dict[str, Any], wheels: str | None = None) -> dict[str, Any]:
    """Write the three bundles into out_dir; returns {name: {"path", "bytes", ...}, "total_bytes"}.

    target_w / drafter_w: float32 weights (internal names); training: JSON-able summary for meta.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stored = {k: bf16(v) for k, v in {**target_w, **drafter_w}.items()}       # what the FP bundle holds
    wide = {k: v.float32() for k, v in stored.items()}                         # its values, exactly
    prompt = golden_prompt(tok, wheels)
    base_meta = {"tokenizer": tok.meta(), "drafter": dcfg.to_dict(), "golden_task": GOLDEN_TASK,
                 "training": training}
    fp_tokens, fp_margins, fp_noise = golden(cfg, wide, prompt)
    summary: dict[str, Any] = {}
    for policy, name in NAMES.items():
        if policy is None:
            tensors, weights, meta = stored, wide, dict(base_meta)
            tokens, margins, noise = fp_tokens, fp_margins, fp_noise
        else:
            weights, info = quantize_weights(cfg, wide, policy=policy, group_size=32)
            tensors = {k: (stored[k] if k in stored else v) for k, v in weights.items()}
            tokens, margins, noise = golden(cfg, weights, prompt)
            meta = {**base_meta, "quant": info, "fp32_golden": fp_tokens.tolist(),
                    "fp32_margins": fp_margins.tolist()}
        meta.update(noise, min_margin=float(margins.min()))
        path = out_dir / f"{name}.kdtr"
        write_bundle(path, config=cfg, tensors=tensors, prompt=prompt.astype(np.int32), golden=tokens,
                     margins=margins, meta=meta, provenance=provenance)
        first = next((i for i in range(N_GOLDEN) if tokens[i] != fp_tokens[i]), None)
        summary[name] = {"path": str(path), "bytes": path.stat().st_size, "min_margin": float(margins.min()),
                         **noise, "golden_text": tok.decode(tokens.tolist()),
                         "departs_from_bf16_golden_at": first}
    summary["total_bytes"] = sum(v["bytes"] for v in summary.values())
    return summary
