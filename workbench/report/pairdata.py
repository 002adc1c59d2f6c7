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


def departures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Greedy DDTree / chain runs whose tokens are not greedy AR's, one entry per (model, prompt):
    {"model", "prompt", "budgets" (DDTree's), "chain" (the DFlash chain's too)}. ``rows``: ``measure``'s
    rows (``equals_ar``, ``tree``) or ``bench pair``'s (``tokens_equal_ar``, ``model`` the bundle path)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        same = r.get("equals_ar", r.get("tokens_equal_ar"))
        if same is False and float(r.get("temperature", 0.0)) == 0.0:
            d = out.setdefault((Path(str(r["model"])).stem, r["prompt"]), {"budgets": [], "chain": False})
            if r.get("tree") == "chain":
                d["chain"] = True
            else:
                d["budgets"].append(int(r.get("budget") or 0))
    return [{"model": m, "prompt": p, "budgets": sorted(d["budgets"]), "chain": d["chain"]}
            for (m, p), d in out.items()]


def near_tie(cfg: Any, weights: dict[str, Any], drafter_config: Any, ids: Any, n_tokens: int,
             budget: int) -> dict[str, Any]:
    """Why a greedy DDTree run can part from greedy AR, measured on the numpy reference (float32):
    AR's top-1 minus top-2 logit margin per step, the step where DDTree at ``budget`` parts from AR
    here (None when it does not on this machine) and the margin there, AR's smallest margin and its
    step, and the median margin for scale. A margin near float32 rounding of the logits means the
    verify's other summation order may pick the runner-up: a near-tie, not a wrong token."""
    import numpy as np

    from ..generate import generate
    from ..reference.generate import greedy_generate
    ar = greedy_generate(cfg, weights, ids, n_tokens)
    dd = generate(cfg, weights, ids, n_tokens, mode="ddtree", budget=budget, drafter_config=drafter_config)
    differ = np.flatnonzero(np.asarray(dd.tokens) != np.asarray(ar.tokens))
    step = int(differ[0]) if differ.size else None
    low = int(np.argmin(ar.margins))
    return {"budget": budget, "parted_at": step, "margin_there": None if step is None else
            float(ar.margins[step]), "min_margin": float(ar.margins[low]), "min_step": low,
            "median_margin": float(np.median(ar.margins))}


def near_tie_text(d: dict[str, Any], run: dict[str, Any]) -> str:
    """One Markdown line explaining ``departures``' entry ``d`` with its ``near_tie`` measurement."""
    budgets = " and ".join(filter(None, [("B = " + ", ".join(map(str, d["budgets"]))) if d["budgets"] else "",
                                         "the DFlash chain" if d.get("chain") else ""]))
    where = (f"DDTree at B = {run['budget']} parts from AR at step {run['parted_at']}, where AR's top-1 "
             f"minus top-2 logit margin is **{run['margin_there']:.2g}**" if run["parted_at"] is not None else
             f"DDTree at B = {run['budget']} gives AR's tokens; AR's smallest top-1 minus top-2 logit "
             f"margin is **{run['min_margin']:.2g}** (step {run['min_step']})")
    return (f"`{d['model']}` {d['prompt']} is not equal to AR at {budgets}. Measured here on the numpy "
            f"reference: {where}, against a median margin of {run['median_margin']:.2g}. A near-tie: the "
            "tree's verify sums in another order, and float32 rounding there decides which of the two "
            "tokens wins.")


def departure_notes(rows: list[dict[str, Any]], n_tokens: int, models_dir: str | Path,
                    cache: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """A ``near_tie_text`` line per (model, prompt) of ``rows`` not equal to AR, measured on the bundle
    ``models_dir/<model>.kdtr`` at the first budget that parted (once per key, kept in ``cache``)."""
    from ..train.measure import humaneval_prompts, load_pair
    notes = []
    for d in departures(rows):
        key = d["model"], d["prompt"]
        if key not in cache:
            p = load_pair(str(Path(models_dir) / f"{d['model']}.kdtr"), d["model"])
            ids = dict(humaneval_prompts(p.tok, int(d["prompt"].split("/")[1]) + 1))[d["prompt"]]
            budget = d["budgets"][0] if d["budgets"] else 16     # chain only: a DDTree run for the margins
            cache[key] = near_tie(p.cfg, p.weights, p.dcfg, ids, n_tokens, budget)
        notes.append(near_tie_text(d, cache[key]))
    return notes
