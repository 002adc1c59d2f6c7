"""Engine benchmark results for the DDTree budget notebook: read the current result set that
``python -m workbench bench engine`` writes (``engine_<commit>.csv`` + ``.json``, see
workbench/results.py) and select its sections.

The CSV is long format, one row per measurement, with a ``section`` column and the union of the
sections' columns (empty cells where a section has none):
  ar               model, impl ('engine' | 'hf_eager'), tokens, tok_s, us_per_token, golden_ok
  kernel_sum       model, us_per_token (graph replay), kernels_per_token, kernel_sum_us, ratio
  kernel_breakdown model, impl (kernel name), launches_per_token, us (per token), us_per_launch
  verify           model, budget (0 = the 1-row decode step), rows, us, topk_us, build_us
  spec             model, impl ('ar' | 'ddtree'), tokens, tok_s; ddtree rows also budget, p, speedup,
                   tau, rounds, us_per_round and its parts, tokens_equal_ar
Columns are matched by name; cells are numbers where they parse, 'True'/'False' become bools.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..results import cell, current_set, read_csv

SECTIONS = ("ar", "kernel_sum", "kernel_breakdown", "verify", "spec")


@dataclass(frozen=True)
class EngineResults:
    path: Path                    # the CSV
    rows: list[dict[str, Any]]    # every row, cells converted
    meta: dict[str, Any]          # the set's metadata JSON ({} when absent)

    @property
    def hardware(self) -> str:
        return str(self.meta.get("gpu", "unknown GPU"))

    @property
    def date(self) -> str:
        """The run's time_utc as 'YYYY-MM-DD HH:MM UTC' (``utc_day``)."""
        return utc_day(self.meta.get("time_utc"))

    def section(self, name: str, model: str | None = None) -> list[dict[str, Any]]:
        """Rows of one section (optionally of one model), in file order."""
        if name not in SECTIONS:
            raise InputError(f"unknown engine section {name!r} (choose from {', '.join(SECTIONS)})")
        return [r for r in self.rows
                if r.get("section") == name and (model is None or r.get("model") == model)]

    def models(self, name: str) -> list[str]:
        """Models that have rows in section ``name``, in first-seen order."""
        return list(dict.fromkeys(str(r["model"]) for r in self.section(name)))


def load_engine(bench_dir: str | Path) -> EngineResults | None:
    """The current engine result set under bench_dir, or None when it has none.

    InputError when the CSV has no 'section' or 'model' column, or a section name not in SECTIONS."""
    rs = current_set(bench_dir, "engine")
    if rs is None:
        return None
    path = rs.csv
    rows = [{k: cell(v) for k, v in r.items()} for r in read_csv(path)]
    if rows and not {"section", "model"} <= set(rows[0]):
        raise InputError(f"{path}: needs 'section' and 'model' columns, has {sorted(rows[0])}")
    bad = sorted({str(r["section"]) for r in rows} - set(SECTIONS))
    if bad:
        raise InputError(f"{path}: unknown sections {bad} (known: {', '.join(SECTIONS)})")
    return EngineResults(path, rows, rs.read_meta())


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ar_table(res: EngineResults) -> list[dict[str, Any]]:
    """AR decode per (model, impl): tokens/s, µs/token, golden ok, and x_over_hf_eager = tok_s over
    the same model's 'hf_eager' tok_s (None without one)."""
    ar = res.section("ar")
    hf = {r["model"]: r["tok_s"] for r in ar if r.get("impl") == "hf_eager" and _is_num(r.get("tok_s"))}
    return [{"model": r["model"], "impl": r["impl"], "tokens": r.get("tokens"), "tok_s": r["tok_s"],
             "us_per_token": r.get("us_per_token"), "golden_ok": r.get("golden_ok"),
             "x_over_hf_eager": r["tok_s"] / hf[r["model"]] if r["model"] in hf else None}
            for r in ar if _is_num(r.get("tok_s"))]


def kernel_sum_table(res: EngineResults) -> list[dict[str, Any]]:
    """Per model: per-token decode time vs the sum of its kernels' own device times."""
    return [{"model": r["model"], "us_per_token": r.get("us_per_token"),
             "kernel_sum_us": r.get("kernel_sum_us"), "step_over_kernel_sum": r.get("ratio"),
             "kernels_per_token": r.get("kernels_per_token")}
            for r in res.section("kernel_sum")]


def kernel_breakdown(res: EngineResults, model: str) -> list[dict[str, Any]]:
    """One row per kernel, most time first, with its share of the summed kernel time (%)."""
    rows = [r for r in res.section("kernel_breakdown", model) if _is_num(r.get("us"))]
    total = sum(r["us"] for r in rows)
    rows.sort(key=lambda r: -r["us"])
    return [{"kernel": r["impl"], "launches_per_token": r.get("launches_per_token"), "us_per_token": r["us"],
             "us_per_launch": r.get("us_per_launch"), "share_pct": 100.0 * r["us"] / total if total else None}
            for r in rows]


def ar_us_per_token(res: EngineResults, model: str) -> float | None:
    """The engine's measured AR decode time per token for ``model`` (the 'ar' section), or None."""
    return next((float(r["us_per_token"]) for r in res.section("ar", model)
                 if r.get("impl") == "engine" and _is_num(r.get("us_per_token"))), None)


def verify_table(res: EngineResults, model: str) -> list[dict[str, Any]]:
    """Verify step per budget (sorted): µs, rows, device top-k and host build µs, and x_decode_step =
    µs over the same run's 1-row step (budget 0), None when that row is missing."""
    rows = sorted((r for r in res.section("verify", model)
                   if _is_num(r.get("budget")) and _is_num(r.get("us"))), key=lambda r: r["budget"])
    one = next((r["us"] for r in rows if r["budget"] == 0), None)
    return [{"budget": r["budget"], "rows": r.get("rows"), "verify_us": r["us"], "topk_us": r.get("topk_us"),
             "build_us": r.get("build_us"), "x_decode_step": r["us"] / one if one else None} for r in rows]


def spec_settings(res: EngineResults) -> tuple[str, int, list[int], list[float]]:
    """(model, generated tokens per run, budgets, oracle ps) of the DDTree sweep.

    Tokens per run: the metadata's spec_tokens, else the rows' tokens + 1 (the CSV counts the tokens
    after the first). InputError when there is no DDTree row."""
    dd = [r for r in res.section("spec") if r.get("impl") == "ddtree"]
    if not dd:
        raise InputError(f"{res.path}: no DDTree rows in the 'spec' section")
    n = res.meta.get("spec_tokens")
    n_tokens = int(n) if _is_num(n) else int(dd[0]["tokens"]) + 1
    return (str(dd[0]["model"]), n_tokens, sorted({int(r["budget"]) for r in dd}),
            sorted({float(r["p"]) for r in dd}))


def spec_ar_tok_s(res: EngineResults, model: str) -> float:
    """AR tokens/s measured in the 'spec' section (the baseline of its speedups); InputError if absent."""
    ar = next((r["tok_s"] for r in res.section("spec", model)
               if r.get("impl") == "ar" and _is_num(r.get("tok_s"))), None)
    if ar is None:
        raise InputError(f"{res.path}: no AR row in the 'spec' section for {model!r}")
    return float(ar)


def spec_table(res: EngineResults, model: str,
               ref_tau: dict[tuple[float, int], float] | None = None) -> list[dict[str, Any]]:
    """DDTree vs AR per (budget, p), sorted: measured DDTree tok/s, speedup over spec_ar_tok_s, the
    engine's τ, the reference's τ for the same run where ``ref_tau[(p, budget)]`` has it (else None),
    same_tau, µs per round, and speedup_ref_tau = τ_ref × (AR µs/token) / (µs per DDTree round), i.e.
    the speedup the reference's acceptance implies at the engine's measured costs."""
    ar = spec_ar_tok_s(res, model)
    out = []
    for r in sorted((r for r in res.section("spec", model) if r.get("impl") == "ddtree"),
                    key=lambda r: (r["budget"], r["p"])):
        tau_ref = (ref_tau or {}).get((float(r["p"]), int(r["budget"])))
        tau, per_round = r.get("tau"), r.get("us_per_round")
        out.append({"budget": r["budget"], "oracle_p": r["p"], "ddtree_tok_s": r["tok_s"],
                    "speedup": r["tok_s"] / ar, "tau_engine": tau, "tau_ref": tau_ref,
                    "same_tau": None if tau_ref is None else _is_num(tau) and abs(tau_ref - tau) < 1e-9,
                    "us_per_round": per_round,
                    "speedup_ref_tau": tau_ref * 1e6 / ar / per_round
                    if tau_ref is not None and _is_num(per_round) else None,
                    "same_tokens_as_ar": r.get("tokens_equal_ar")})
    return out


def best_budget(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per oracle p (sorted) the spec_table row with the highest measured speedup."""
    best: dict[float, dict[str, Any]] = {}
    for r in rows:
        if r["oracle_p"] not in best or r["speedup"] > best[r["oracle_p"]]["speedup"]:
            best[r["oracle_p"]] = r
    return [best[p] for p in sorted(best)]


def utc_day(raw: Any) -> str:
    """An ISO time as 'YYYY-MM-DD HH:MM UTC' (naive taken as UTC); as written when it does not parse."""
    if raw is None:
        return "unknown date"
    try:
        t = datetime.fromisoformat(str(raw))
    except ValueError:
        return str(raw)
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.strftime("%Y-%m-%d %H:%M UTC")
