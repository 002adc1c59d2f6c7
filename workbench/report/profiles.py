"""Profiles: which parameter values and time limits each notebook runs with.

``full`` runs every notebook with its parameters cell's own defaults; ``smoke`` overrides them
with small sizes so that all notebooks together finish in about a minute on a 2-core CPU.
The runner also sets ``profile`` and ``out_dir`` in every notebook that declares them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError

NOTEBOOKS = ("01_golden_bundles", "02_ar_vs_ddtree", "03_fp32_vs_int4_divergence",
             "04_kernel_throughput", "05_ddtree_budget", "06_trained_pair")


@dataclass(frozen=True)
class Profile:
    cell_timeout_s: float
    wall_timeout_s: float
    overrides: dict[str, dict[str, Any]]


PROFILES: dict[str, Profile] = {
    "full": Profile(cell_timeout_s=1800, wall_timeout_s=3600, overrides={}),
    "smoke": Profile(cell_timeout_s=240, wall_timeout_s=300, overrides={
        "01_golden_bundles": {"bundle_names": ["tiny", "int4_tiny"], "int4_pairs": {"int4_tiny": "tiny"}},
        "02_ar_vs_ddtree": {"bundle_names": ["tiny", "int4_tiny"], "backends": ["reference"],
                            "budgets": [1, 4], "n_tokens": 12,
                            "draw": {"bundle": "tiny", "drafter": "oracle", "budget": 8, "round": 0}},
        "03_fp32_vs_int4_divergence": {
            "models": [{"bundle": "tiny"}, {"preset": "tiny", "overrides": {"moe_intermediate_size": 128},
                                            "seed": 11, "name": "tiny_moe128"}],
            "n_free": 8, "n_forced": 48},
        "05_ddtree_budget": {"budgets": [1, 4, 16], "oracle_ps": [0.5, 1.0], "n_tokens": 16,
                             "coverage_budget": 64, "coverage_trees": 2,
                             "engine_ref_budgets": [8], "engine_ref_ps": [0.8, 1.0]},
        "06_trained_pair": {"live_tokens": 12, "live_budget": 4},
    }),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise InputError(f"unknown profile {name!r} (choose from {', '.join(PROFILES)})")
    return PROFILES[name]
