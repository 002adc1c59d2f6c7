"""``bench depth`` results for the reports: read the current ``k2_depth_<commit>`` set (workbench/results.py)
and put the stand-in's measured runs beside their projection, and a round's time split by part.

The set's CSV is long format with a ``table`` column:
  run         source ('ar', 'oracle p=0.8', 'pair code (replayed)'), budget (0 = AR), tau, ms_per_token,
              round_ms, speedup, host phases per round (build_us_per_round, walk_us_per_round), ...
  part        part ('embed', 'head', 'tree', 'drafter', 'dense.layer', 'moe.attention', ...), rows, us
  projection  what ``k2proj.project_depth`` made of them when the set was written
  cost_aware  a cost-aware run beside its source's best fixed budget (``cost_aware``)
Its metadata names the GPU, commit and date, the stand-in's distinct MoE weight sets and its weights
(random, not K2's). A set written by ``--dry-run`` (a tiny config in the CUDA simulator, no timing) is
read but marked: it is never a result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import k2proj
from ..config import ModelConfig, preset
from ..results import cell, current_set, read_csv
from .enginedata import utc_day

DRY_RUN = "dry-run"
MOE_PARTS = ("attention", "router", "routed_experts", "shared_expert", "rest")


@dataclass(frozen=True)
class DepthSet:
    path: Path                     # the CSV
    rows: list[dict[str, Any]]
    meta: dict[str, Any]

    @property
    def dry_run(self) -> bool:
        return DRY_RUN in (str(self.meta.get("git_sha")), str(self.meta.get("time_utc")))

    @property
    def hardware(self) -> str:
        return "CUDA simulator (dry run)" if self.dry_run else str(self.meta.get("gpu", "unknown GPU"))

    @property
    def commit(self) -> str:
        return str(self.meta.get("git_sha") or "unknown")[:7]

    @property
    def date(self) -> str:
        return utc_day(self.meta.get("time_utc"))

    @property
    def stand_in(self) -> str:
        """'61-layer K2.6-shape stand-in, random weights (not K2's), 10 distinct MoE weight sets'."""
        sets = self.meta.get("sets", "?")
        return (f"{self.meta.get('model', 'k2_6')} stand-in with random weights (not K2's), its 60 MoE "
                f"layers cycling over {sets} distinct MoE weight sets")

    @property
    def label(self) -> str:
        """Where and when: 'MEASURED on NVIDIA H200, commit abc1234, 2026-12-03 10:00 UTC'."""
        return f"MEASURED on {self.hardware}, commit {self.commit}, {self.date}"

    @property
    def composition(self) -> str:
        """'' for one run; for a set composed of runs (``dev/depth_compose.py``), what each gave."""
        runs = self.meta.get("runs") or []
        if len(runs) < 2:
            return ""
        return (f"Composed of two runs: the oracle's tau from {runs[0].get('git_sha')} (routing collapsed, "
                f"its DDTree runs equal to AR), parts and round times from {runs[1].get('git_sha')} "
                f"({runs[1].get('what', '').split('; ')[-1]}); every row names its run.")

    def runs(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("table") == "run"]

    def parts(self) -> dict[str, dict[int, float]]:
        return k2proj.depth_parts(self.rows)



def load_depth(bench_dir: str | Path) -> DepthSet | None:
    """The current ``k2_depth`` set in ``bench_dir``, or None; empty cells read as None."""
    rs = current_set(bench_dir, "k2_depth")
    if rs is None:
        return None
    return DepthSet(rs.csv, [{k: cell(v) for k, v in r.items()} for r in read_csv(rs.csv)], rs.read_meta())


def side_by_side(ds: DepthSet, cfg: ModelConfig | None = None) -> list[dict[str, Any]]:
    """Per measured run (AR, every DDTree source and budget): MEASURED ms/token and tokens/s beside the
    PROJECTED ones (``k2proj.project_depth`` from the set's own parts), their ratio, and the speed-ups
    over AR of each (measured over the measured AR, projected over the projected AR). The projected
    columns are None where the set lacks the parts (a run whose part timing failed)."""
    parts, runs = ds.parts(), ds.runs()
    proj = {}
    if "dense.layer" in parts and "moe.layer" in parts:
        made = k2proj.project_depth(cfg or preset("k2_6"), parts, runs)
        proj = {(r["source"], r["budget"]): r for r in made}
    ar = next((float(r["ms_per_token"]) for r in runs if r["source"] == "ar"), None)
    ar_pj = proj.get(("ar", 0), {}).get("projected_ms_per_token")
    out = []
    for r in runs:
        meas = float(r["ms_per_token"])
        pj = proj.get((r["source"], int(r["budget"])), {}).get("projected_ms_per_token")
        out.append({"source": r["source"], "budget": int(r["budget"]), "tau": float(r["tau"]),
                    "measured_ms_per_token": meas, "projected_ms_per_token": pj,
                    "measured_over_projected": meas / pj if pj else None,
                    "measured_tok_s": 1e3 / meas, "projected_tok_s": 1e3 / pj if pj else None,
                    "measured_speedup": ar / meas if ar else None,
                    "projected_speedup": ar_pj / pj if pj and ar_pj else None})
    return out


def cost_aware(ds: DepthSet) -> list[dict[str, Any]]:
    """Per cost-aware run (B = the curve's largest tree, the verified N chosen per round): its MEASURED ms
    per token beside the best fixed budget's of the same source, the nodes it verified, its tau beside
    the E(N) the draft's probabilities stated (``expected_tau``, sets from 052d605 on) and the oracle's
    hit rate as drawn for that p (``oracle_hit_rate``, the same sets): where a cost-aware round loses,
    these say whether the acceptance it read was the one it got."""
    hits = ds.meta.get("oracle_hit_rate") or {}
    out = []
    for r in ds.rows:
        if r.get("table") != "cost_aware":
            continue
        p = r.get("oracle_p")
        out.append({"source": r["source"], "nodes_per_round": r.get("tree_nodes"),
                    "ms_per_token": r.get("ms_per_token"), "best_fixed_budget": r.get("best_fixed_budget"),
                    "best_fixed_ms_per_token": r.get("best_fixed_ms_per_token"),
                    "vs_best_fixed": r.get("vs_best_fixed"), "tau": r.get("tau"),
                    "expected_tau": r.get("expected_tau"),
                    "oracle_hit_rate": hits.get(str(float(p))) if p is not None else None})
    return out


def split(ds: DepthSet, cfg: ModelConfig | None = None) -> list[dict[str, Any]]:
    """A round's time by part, ms per round, per budget (B = 0: an AR step), from the set's MEASURED parts
    composed as the projection composes them: the embedding, the attention rows every layer shares (once per
    step), the dense layer(s), each MoE part times the MoE layers, lm_head (final norm + lm_head + argmax),
    the drafter's round, tree build (the device's KV compaction + tree compile, and the host's build) and the
    host's walk + commit (mean of the oracle runs at B). ``projected_round_ms`` is their sum (the projection's
    round); ``measured_round_ms`` the mean measured round of the oracle runs at B (AR: its ms per token)."""
    cfg = cfg or preset("k2_6")
    n_dense, n_moe = cfg.first_k_dense_replace, cfg.num_hidden_layers - cfg.first_k_dense_replace
    parts, runs = ds.parts(), ds.runs()
    drafter = next(iter(parts.get("drafter", {}).values()), 0.0)
    out = []
    for b in sorted({int(r["budget"]) for r in runs}):
        n = b + 1
        if n not in parts.get("moe.layer", {}) or n not in parts.get("dense.layer", {}):
            continue
        at_b = [r for r in runs if int(r["budget"]) == b and r.get("round_ms") is not None
                and (b == 0 or r.get("build_us_per_round") is not None)]

        def mean(k: str, at_b=at_b) -> float:
            return sum(_num(r.get(k)) for r in at_b) / len(at_b) if at_b else 0.0
        row = {"budget": b, "rows": n,
               "embedding": _ms(parts, "embed", n),
               "attention rows (once per step)": _ms(parts, "moe.step_rows", n),
               "dense layer": n_dense * _ms(parts, "dense.layer", n)}
        for p in MOE_PARTS:
            row[f"MoE {p.replace('_', ' ')}"] = n_moe * _ms(parts, f"moe.{p}", n)
        row["lm_head"] = _ms(parts, "head", n)
        row["drafter"] = drafter / 1e3 if b else 0.0
        row["tree build"] = (_ms(parts, "tree", n) + mean("build_us_per_round") / 1e3) if b else 0.0
        row["host walk + commit"] = mean("walk_us_per_round") / 1e3 if b else 0.0
        row["projected_round_ms"] = sum(v for k, v in row.items() if k not in ("budget", "rows"))
        row["measured_round_ms"] = mean("round_ms") if at_b else None
        out.append(row)
    return out


SPLIT_PARTS = ("embedding", "attention rows (once per step)", "dense layer",
               *(f"MoE {p.replace('_', ' ')}" for p in MOE_PARTS), "lm_head", "drafter", "tree build",
               "host walk + commit")


def _ms(parts: dict[str, dict[int, float]], name: str, n: int) -> float:
    return parts.get(name, {}).get(n, 0.0) / 1e3


def _num(v: Any) -> float:
    return 0.0 if v is None or v != v else float(v)
