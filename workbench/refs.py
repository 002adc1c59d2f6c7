"""The golden bundles in refs/: how each is built, deterministically, from seeds recorded here.

A golden bundle is a seeded random FP32 model (plus a random DFlash drafter), a fixed prompt and
the reference's greedy tokens with their top-1 minus top-2 logit margins. The INT4 bundles hold
the same model quantized with policy ``mlp`` at group size 32, with their own goldens, and the
FP32 golden in ``meta["fp32_golden"]`` so ``inspect`` can show where quantization changes the text.

Seeds were picked (by a scan over seeds 0-299) so that every golden step's margin is at least
``MIN_MARGIN`` and at least ``NOISE_RATIO`` times the float32 noise of the logits (the largest
float64 vs float32 reference logit difference over the golden steps, recorded in the bundle meta as
``fp32_noise``). W4A16 rounds activations to float16, so the INT4 models' noise is ~1e-2 against
~1e-5 for FP32; docs/configs.md lists the margins.

Reproducible on any CPU: tensors come from seeded integer streams and elementwise IEEE arithmetic,
so they are identical everywhere, but float32 matmul sums depend on the BLAS kernels the CPU gets.
So the stored margins are the float64 reference's, rounded to float32, and the noise figure keeps
two significant digits: both then rebuild to the same bits on any CPU except in the rare case that
a value sits on a rounding boundary, which is why rebuild checks compare them within
``MARGIN_TOL`` (and the noise within a factor ``NOISE_TOL``) rather than bit for bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bundle import Bundle, read_bundle, write_bundle
from .config import ModelConfig, preset
from .ddtree.dflash import default_drafter_config, random_drafter_weights
from .errors import InputError
from .quant.policy import quantize_weights
from .reference.generate import greedy_generate
from .weights import random_weights

N_GOLDEN = 32                 # golden tokens per bundle (at least 24: enough steps for tree rounds)
MIN_MARGIN = 0.05             # every golden step's top-1 minus top-2 logit must be at least this
NOISE_RATIO = 10.0            # ... and at least this many times the float32 logit noise (any CPU)
PROMPT = (1, 17, 42, 99, 7, 256, 3, 128)   # fixed prompt, valid for every preset (ids < 400)
MARGIN_TOL = 1e-4             # rebuilt margins agree this closely on any CPU (docs/configs.md: measured)
NOISE_TOL = 4.0               # ... and the recorded float32 noise within this factor
REFS_DIR = Path(__file__).resolve().parents[1] / "refs"   # where the committed bundles live


@dataclass(frozen=True)
class RefSpec:
    name: str                 # file stem under refs/
    preset: str
    seed: int                 # model weights seed (the drafter uses seed + 1)
    int4: bool = False


REFS = (
    RefSpec("tiny", "tiny", seed=65),
    RefSpec("tiny2", "tiny2", seed=162),
    RefSpec("int4_tiny", "tiny", seed=65, int4=True),
    RefSpec("int4_tiny2", "tiny2", seed=162, int4=True),
)


class MarginTooSmall(RuntimeError):
    """A seed gives a golden step within MIN_MARGIN of a tie: pick another seed."""


def model_for(spec: RefSpec) -> tuple[ModelConfig, dict[str, np.ndarray], dict]:
    """(config, FP32 target + drafter weights, drafter config dict) for one spec."""
    cfg = preset(spec.preset)
    dcfg = default_drafter_config(cfg)
    weights = random_weights(cfg, spec.seed)
    weights.update(random_drafter_weights(cfg, dcfg, spec.seed + 1))
    return cfg, weights, dcfg.to_dict()


def two_digits(x: float) -> float:
    """``x`` rounded to two significant digits (a noise figure, stored so it rebuilds the same anywhere)."""
    return float(f"{x:.2g}")


def golden(cfg: ModelConfig, weights: dict, what: str) -> tuple[np.ndarray, np.ndarray, float]:
    """Greedy tokens (float32 reference, equal to float64's), their float64 margins rounded to
    float32, and the float32 logit noise vs float64 to two digits."""
    g32 = greedy_generate(cfg, weights, PROMPT, N_GOLDEN, dtype=np.float32)
    g64 = greedy_generate(cfg, weights, PROMPT, N_GOLDEN, dtype=np.float64)
    if not np.array_equal(g32.tokens, g64.tokens):
        raise MarginTooSmall(f"{what}: float32 and float64 goldens differ")
    noise = float(np.max(np.abs(g32.logits.astype(np.float64) - g64.logits)))
    if g64.margins.min() < max(MIN_MARGIN, NOISE_RATIO * noise):
        raise MarginTooSmall(f"{what}: smallest golden margin {g64.margins.min():.4g} is below "
                             f"max({MIN_MARGIN}, {NOISE_RATIO} x float32 noise {noise:.3g})")
    return g32.tokens.astype(np.int32), g64.margins.astype(np.float32), two_digits(noise)


def build_ref(spec: RefSpec, out_dir: Path) -> Path:
    cfg, weights, drafter = model_for(spec)
    tokens, margins, noise = golden(cfg, weights, spec.name)
    meta: dict = {"seed": spec.seed, "preset": spec.preset, "drafter": drafter, "fp32_noise": noise,
                  "min_margin": float(margins.min())}
    if spec.int4:
        weights, info = quantize_weights(cfg, weights, policy="mlp", group_size=32)
        meta.update(quant=info, fp32_golden=tokens.tolist(), fp32_margins=margins.tolist())
        tokens, margins, noise = golden(cfg, weights, spec.name)
        meta.update(fp32_noise=noise, min_margin=float(margins.min()))
    path = out_dir / f"{spec.name}.kdtr"
    write_bundle(path, config=cfg, tensors=weights, prompt=np.asarray(PROMPT, dtype=np.int32),
                 golden=tokens, margins=margins, meta=meta)
    return path


def build_refs(out_dir: str | os.PathLike = "refs", names: tuple[str, ...] | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [build_ref(s, out) for s in REFS if names is None or s.name in names]


def rebuild_differences(committed: Bundle, fresh: Bundle) -> tuple[list[str], float]:
    """How a rebuilt bundle departs from the committed one: (what differs, largest margin difference).

    Tensors, prompt, golden tokens, config and every non-float meta field must be identical; the
    margins (also meta's ``fp32_margins`` and ``min_margin``) agree within ``MARGIN_TOL`` and the noise
    figure within a factor ``NOISE_TOL``. Provenance (commit, versions) is not compared.
    """
    diffs: list[str] = []
    if sorted(committed.tensors) != sorted(fresh.tensors):
        diffs.append("tensor names")
    else:
        diffs += [f"tensor {k}" for k, x in committed.tensors.items()
                  if not np.array_equal(_bits(x), _bits(fresh.tensors[k]))]
    for what in ("prompt", "golden"):
        if not np.array_equal(getattr(committed, what), getattr(fresh, what)):
            diffs.append(what)
    if committed.config != fresh.config:
        diffs.append("config")
    a, b = dict(committed.meta), dict(fresh.meta)
    margins = [(np.asarray(committed.margins, np.float64), np.asarray(fresh.margins, np.float64))]
    if "fp32_margins" in a or "fp32_margins" in b:
        margins.append((np.asarray(a.pop("fp32_margins", []), np.float64),
                        np.asarray(b.pop("fp32_margins", []), np.float64)))
    margins.append((np.float64(a.pop("min_margin", np.nan)), np.float64(b.pop("min_margin", np.nan))))
    worst = 0.0
    for x, y in margins:
        if x.shape != y.shape:
            diffs.append("number of margins")
            continue
        d = float(np.max(np.abs(x - y), initial=0.0))
        worst = max(worst, d) if np.isfinite(d) else np.inf
    if not worst <= MARGIN_TOL:
        diffs.append(f"margins (largest difference {worst:.3g} > {MARGIN_TOL})")
    na, nb = a.pop("fp32_noise", None), b.pop("fp32_noise", None)
    if na is None or nb is None or not (na > 0 and nb > 0 and max(na / nb, nb / na) <= NOISE_TOL):
        diffs.append(f"fp32_noise ({na} vs {nb})")
    if a != b:
        diffs.append(f"meta fields {sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))}")
    return diffs, worst


def _bits(x) -> np.ndarray:
    return np.asarray(getattr(x, "bits", x))


def golden_bundle(name: str, refs_dir: str | os.PathLike | None = None) -> Bundle:
    """``<refs_dir>/<name>.kdtr`` (default: the repository's refs/) read with every CRC checked; the one
    way tests, notebooks and benchmarks load a golden bundle. InputError if the file is missing."""
    path = Path(REFS_DIR if refs_dir is None else refs_dir) / f"{name}.kdtr"
    if not path.is_file():
        raise InputError(f"bundle {path} not found (python -m workbench build-refs writes it)")
    return read_bundle(path)
