"""Committed results of the trained code pair for notebook 06: training reports, the ``measure`` run
(numpy reference on HumanEval) and the ``bench pair`` result set (GPU engine).

Layout: ``reports/train/code_pair_<commit>/`` holds ``target_report.json``, ``target_log.jsonl``,
``drafter_report.json``, ``drafter_log.jsonl`` (what ``train`` wrote on the GPU) and ``device.txt``
(nvidia-smi's name, driver and memory of that GPU);
``reports/measure/code_pair_<commit>/`` holds ``acceptance.json`` and ``drift.json`` (what
``measure`` writes). Each folder is one run named by the commit it ran; a reader takes the newest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..results import cell, current_set, read_csv

RUN = "code_pair_"


def newest_run(root: str | Path) -> Path | None:
    """The ``code_pair_<commit>`` folder under root modified last, or None."""
    runs = sorted((p for p in Path(root).glob(RUN + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_training(root: str | Path) -> dict[str, Any] | None:
    """{"dir", "gpu" (from device.txt, or None), "target", "drafter": the reports, "target_steps",
    "drafter_steps": the logged steps, "target_evals", "drafter_evals": the logged evaluations}, or None
    without a run."""
    run = newest_run(root)
    if run is None:
        return None
    out: dict[str, Any] = {"dir": run, "gpu": None}
    device = run / "device.txt"                         # nvidia-smi CSV: header, then name, driver, memory
    if device.exists():
        lines = device.read_text().splitlines()
        out["gpu"] = lines[1].split(",")[0].strip() if len(lines) > 1 else None
    for part in ("target", "drafter"):
        out[part] = _json(run / f"{part}_report.json")
        log = _log(run / f"{part}_log.jsonl")
        out[f"{part}_steps"] = [e for e in log if e.get("event") == "step"]
        out[f"{part}_evals"] = [e for e in log if e.get("event") == "eval"]
    return out


def load_measure(root: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None, Path] | None:
    """(acceptance, drift or None, folder) of the newest measure run, or None."""
    run = newest_run(root)
    if run is None:
        return None
    drift = run / "drift.json"
    return _json(run / "acceptance.json"), (_json(drift) if drift.exists() else None), run


def cells(acceptance: dict[str, Any]) -> list[dict[str, Any]]:
    """Every model's summary cells (one per temperature, tree, budget), with the model's name."""
    return [{"model": m, **c} for m, v in acceptance["models"].items() for c in v["summary"]["cells"]]


def best(acceptance: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model and temperature: the best budget, its tau, the chain's tau and their ratio."""
    return [{"model": m, "temperature": t, **b} for m, v in acceptance["models"].items()
            for t, b in v["summary"]["best"].items()]


def _by_budget(acceptance: dict[str, Any], model: str, key: str, temperature: float) -> dict[int, float]:
    return {c["budget"]: c[key] for c in cells(acceptance)
            if c["model"] == model and c["tree"] == "ddtree" and c["temperature"] == temperature}


def tau_by_budget(acceptance: dict[str, Any], model: str, temperature: float = 0.0) -> dict[int, float]:
    """{budget: tau} of the DDTree cells of one model at one temperature."""
    return _by_budget(acceptance, model, "tau", temperature)


def overlap_by_budget(acceptance: dict[str, Any], model: str, temperature: float = 0.0) -> dict[int, float]:
    """{budget: distinct experts measured / uniform-routing count at the same verify size} (DDTree)."""
    return _by_budget(acceptance, model, "overlap_ratio", temperature)


def drift_table(drift: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (INT4 model, prompt): first greedy divergence, KL mean / max, top-1 agreement."""
    return [{k: r[k] for k in ("model", "prompt", "new_tokens", "first_divergence", "kl_mean", "kl_max",
                               "top1_agreement")} for r in drift["runs"]]


def load_pair_bench(bench_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any], Path] | None:
    """(rows, metadata, CSV path) of the current ``bench pair`` result set, or None; rows as
    ``bench.pair`` made them (empty cells dropped, True / False as bools), so its ``summarize`` applies."""
    rs = current_set(bench_dir, "pair")
    if rs is None:
        return None
    rows = [{k: cell(v) for k, v in r.items() if v != ""} for r in read_csv(rs.csv)]
    return rows, rs.read_meta(), rs.csv
