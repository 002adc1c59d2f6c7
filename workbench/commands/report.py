"""``python -m workbench report``: run the notebooks headless into HTML reports and an index page.

Exit status 0 when every notebook finished, 1 when any failed (a cell raised, a per-cell or
wall-clock limit was hit, or the kernel died), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "reports" / "local"     # git-ignored: a run leaves the tracked tree as it was
SHOWCASE = ROOT / "reports"                  # the committed showcase, refreshed only when asked for


def seconds(text: str) -> float:
    """argparse type of the timeouts: a positive finite number of seconds."""
    v = float(text)                                     # ValueError: argparse says "invalid seconds value"
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="full", help="parameter set: smoke or full (default: full)")
    p.add_argument("--only", action="append", default=[], metavar="NAMES",
                   help="comma-separated notebook names (stems, or a unique prefix such as 02); repeatable "
                        "(default: every notebook)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help="output folder (default: reports/local/, git-ignored; reports/ holds the committed "
                        "showcase)")
    p.add_argument("--notebooks", type=Path, default=ROOT / "notebooks",
                   help="folder of py:percent notebooks (default: notebooks/)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                   help="override a parameter in every selected notebook that declares it; repeatable "
                        "(default: the profile's values)")
    p.add_argument("--kernel", default=None,
                   help="Jupyter kernel name (default: kdtree-workbench if installed, else python3)")
    p.add_argument("--cell-timeout", type=seconds, help="seconds per cell (default: the profile's)")
    p.add_argument("--wall-timeout", type=seconds, help="seconds per notebook (default: the profile's)")
    p.add_argument("--quiet", action="store_true", help="no per-notebook progress lines")


def _select(folder: Path, only: list[str]) -> list[Path]:
    from workbench.errors import InputError

    if not folder.is_dir():
        raise InputError(f"notebook folder not found: {folder}")
    paths = sorted(folder.glob("*.py"))
    if not only:
        if not paths:
            raise InputError(f"no notebooks (*.py) in {folder}")
        return paths
    chosen: list[Path] = []
    wants = [w.strip() for arg in only for w in arg.split(",") if w.strip()]
    if not wants:
        raise InputError(f"--only names no notebook (got {only!r}); give names such as 01,02")
    for want in wants:
        hits = [p for p in paths if p.stem == want] or [p for p in paths if p.stem.startswith(want)]
        if len(hits) != 1:
            names = ", ".join(p.stem for p in paths)
            raise InputError(f"--only {want!r} matches {len(hits)} notebooks (have: {names})")
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def _param_overrides(items: list[str], paths: list[Path]) -> dict[str, dict]:
    from workbench import json_limits
    from workbench.errors import InputError
    from workbench.report.params import default_parameters, read_notebook

    given: dict[str, object] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--param wants NAME=JSON, got {item[:80]!r}")
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"--param {name[:40]!r}: not valid UTF-8") from None
        try:
            given[name.strip()] = json_limits.loads(raw, f"--param {name.strip()[:40]}")
        except InputError as e:
            if "not readable JSON" not in str(e):
                raise                 # too deep, a huge integer: json_limits' own line
            raise InputError(f"--param {name}: value is not JSON: {raw[:80]!r} "
                             "(quote strings: '\"cpu\"')") from None
    declared = {p.stem: default_parameters(read_notebook(p), p.stem) for p in paths}
    for name in given:
        if not any(name in d for d in declared.values()):
            raise InputError(f"--param {name}: no selected notebook declares it")
    return {stem: {k: v for k, v in given.items() if k in d} for stem, d in declared.items()}


def run(args: argparse.Namespace) -> int:
    from workbench.cli import check_out_dir
    from workbench.report import provenance
    from workbench.report.profiles import get_profile
    from workbench.report.runner import pick_kernel, run_report

    profile = get_profile(args.profile)
    check_out_dir(args.out)
    paths = _select(args.notebooks, args.only)
    cli = _param_overrides(args.param, paths)
    overrides = {p.stem: {**profile.overrides.get(p.stem, {}), **cli.get(p.stem, {})} for p in paths}
    kernel = pick_kernel(args.kernel)
    cell = profile.cell_timeout_s if args.cell_timeout is None else args.cell_timeout
    wall = profile.wall_timeout_s if args.wall_timeout is None else args.wall_timeout
    progress = None if args.quiet else sys.stderr
    tracked = provenance.tracked_files(ROOT, args.out)
    if tracked:
        print(f"report: {args.out} holds {len(tracked)} committed files (the showcase): this run rewrites "
              "them, so review 'git diff' and commit them, or drop --out to write to reports/local/ "
              "(git-ignored)", file=sys.stderr)
    if progress:
        print(f"report: {len(paths)} notebook(s), profile {args.profile}, kernel {kernel}, "
              f"out {args.out}", file=progress)
    runs = run_report(paths, args.out, profile=args.profile, overrides=overrides, kernel=kernel,
                      cell_timeout=cell, wall_timeout=wall, cwd=ROOT,
                      provenance=provenance.collect(ROOT, args.out), progress=progress)
    failed = [r for r in runs if r.status != "ok"]
    if progress:
        print(f"report: {len(runs) - len(failed)}/{len(runs)} ok; index: {args.out / 'index.html'}",
              file=progress)
    return 1 if failed else 0
