"""python -m workbench build-refs [--out DIR] [--only NAME ...]"""

from __future__ import annotations

import argparse

from ..cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="refs", help="output folder")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="build only these bundles, e.g. tiny int4_tiny (default: all four)")


def run(args: argparse.Namespace) -> int:
    from ..refs import REFS, build_refs

    known = [s.name for s in REFS]
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        raise UserError(f"unknown bundle(s) {', '.join(unknown)} (choose from {', '.join(known)})")
    for path in build_refs(args.out, tuple(args.only) if args.only else None):
        print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0
