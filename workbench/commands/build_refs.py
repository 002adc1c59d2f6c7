"""python -m workbench build-refs [--out DIR] [--only NAME ...]"""

from __future__ import annotations

import argparse
import sys

from ..cli import UserError
from . import progress


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
    names = [n for n in known if not args.only or n in args.only]
    bar = progress.bar(len(names), "build-refs", unit="bundle")
    for name in names:                                  # one at a time, for the progress bar
        bar.set_postfix_str(name)
        for path in build_refs(args.out, (name,)):
            bar.write(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)", file=sys.stdout)
        bar.update(1)
    bar.close()
    return 0
