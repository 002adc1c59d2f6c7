"""The import graph of workbench/, kernels_numba/ and numformats/, from the source (ast; nothing imported).

    .venv/bin/python dev/import_map.py            # the map: arrows between parts, cycles, upward arrows
    .venv/bin/python dev/import_map.py --check    # exit 1 on a module cycle or an upward arrow not
                                                  # known, kernels_numba importing workbench, or code
                                                  # outside it reaching a kernel past kernels_numba.ops

A part is numformats, kernels_numba, a subpackage of workbench (``workbench.bench``) or a top-level
module of it (``workbench.config``). Every import counts, those inside functions too (a deferred
import still ties the two modules together). Parts sit in LAYERS, lowest first; an arrow from a part
to a part of a higher layer points upward. Cycles are found between modules (strongly connected components).

Outside kernels_numba/ (workbench/, dev/, notebooks/, tests/ but tests/kernels/, which tests the kernel
modules themselves), kernels are reached through ``kernels_numba.ops`` only: an import of another
kernels_numba module, or of a name the package exports other than its errors, is reported.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("numformats", "kernels_numba", "workbench")

# Lowest first; a part may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("numformats",),
    ("kernels_numba",),
    ("workbench", "workbench.errors", "workbench.fileio", "workbench.config", "workbench.results"),
    ("workbench.weights",),
    ("workbench.bundle", "workbench.json_limits"),
    ("workbench.quant",),
    ("workbench.reference", "workbench.hf_checkpoint", "workbench.seeded",
     "workbench.checkpoint", "workbench.tokenizers"),
    ("workbench.ddtree", "workbench.refs", "workbench.dflash_checkpoint"),
    ("workbench.engine", "workbench.train", "workbench.parallel", "workbench.torchk2"),
    ("workbench.generate", "workbench.k2proj"),
    ("workbench.bench",),
    ("workbench.report",),
    ("workbench.commands", "workbench.cli", "workbench.lab", "workbench.__main__"),
)

# Upward arrows and module cycles known and left for later; --check (and the test) fail on any other.
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()
KNOWN_CYCLES: frozenset[tuple[str, ...]] = frozenset()

# The one way into the kernels from outside kernels_numba/: ops, and the infrastructure that is no kernel
# (device buffers, the simulator's executor, input checks); from the package itself, only its errors.
KERNELS = "kernels_numba"
KERNEL_DOORS = ("kernels_numba.ops", "kernels_numba.device", "kernels_numba.sim", "kernels_numba._validate")
PACKAGE_ERRORS = frozenset({"KernelInputError", "LayoutError"})
OUTSIDE = ("workbench", "dev", "notebooks", "tests")     # folders held to it
EXEMPT = ("tests/kernels",)                                # the kernel modules' own tests


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            parts = p.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = p
    return out


def _resolve(name: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from a import b`` is a.b when that is a module)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(name, path.name == "__init__.py", node)
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:                  # a name inside a module: the module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    found.add(t)
        graph[name] = found
    return graph


def _door(module: str) -> bool:
    return module == KERNELS or any(module == d or module.startswith(d + ".") for d in KERNEL_DOORS)


def past_ops(root: Path = ROOT) -> list[str]:
    """'file:line: what' for each import outside kernels_numba/ that reaches a kernel past ops."""
    kernel_mods = {m for m in modules(root) if m.startswith(KERNELS + ".")}
    out: list[tuple[str, int, str]] = []
    for d in OUTSIDE:
        for path in sorted((root / d).rglob("*.py")):
            rel = path.relative_to(root)
            if any(rel.is_relative_to(e) for e in EXEMPT):
                continue
            parts = rel.with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Import):
                    bad = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    src = _resolve(name, path.name == "__init__.py", node)
                    if src != KERNELS:
                        bad = [src]
                    else:                                # a module of the package, or a name it exports
                        bad = [f"{src}.{a.name}" for a in node.names
                               if f"{src}.{a.name}" in kernel_mods or a.name not in PACKAGE_ERRORS]
                else:
                    continue
                out += [(rel.as_posix(), node.lineno, b) for b in bad
                        if (b == KERNELS or b.startswith(KERNELS + ".")) and not _door(b)]
    return [f"{f}:{line}: {b}" for f, line, b in sorted(out)]


def part(module: str) -> str:
    """numformats, kernels_numba, workbench, workbench.<sub> (a subpackage or a top-level module)."""
    bits = module.split(".")
    return bits[0] if bits[0] != "workbench" else ".".join(bits[:2])


def layer(p: str) -> int:
    for i, names in enumerate(LAYERS):
        if p in names:
            return i
    raise SystemExit(f"{p} is in no layer: add it to LAYERS in dev/import_map.py")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, imported module) pairs whose part sits in a higher layer than the importer's."""
    return sorted((a, b) for a, bs in graph.items() for b in bs if layer(part(b)) > layer(part(a)))


def part_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """(part, imported part) -> number of module-level arrows, parts differing."""
    n: dict[tuple[str, str], int] = defaultdict(int)
    for a, bs in graph.items():
        for b in bs:
            if part(a) != part(b):
                n[part(a), part(b)] += 1
    return dict(n)


def short(module: str) -> str:
    return module.removeprefix("workbench.").replace(".", "/")


def report(graph: dict[str, set[str]]) -> str:
    lines = ["| layer | part | imports |", "|---|---|---|"]
    arrows = part_arrows(graph)
    present = {part(m) for m in graph}
    for i, names in enumerate(LAYERS):
        for p in (n for n in names if n in present):
            out = sorted(b for (a, b) in arrows if a == p)
            lines.append(f"| {i} | {short(p)} | {', '.join(short(b) for b in out) or '-'} |")
    cyc = cycles(graph)
    up = upward(graph)
    kw = sorted((a, b) for a, bs in graph.items() for b in bs
                if part(a) == "kernels_numba" and part(b).startswith("workbench"))
    lines += ["", f"cycles: {len(cyc)}"] + [f"- {' <-> '.join(short(m) for m in c)}" for c in cyc]
    lines += ["", f"upward arrows: {len(up)}"] + [f"- {short(a)} -> {short(b)}" for a, b in up]
    lines += ["", f"kernels_numba -> workbench: {len(kw)}"]
    return "\n".join(lines)


def problems(graph: dict[str, set[str]]) -> list[str]:
    """What --check fails on."""
    out = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph) if tuple(c) not in KNOWN_CYCLES]
    out += [f"upward: {a} -> {b}" for a, b in upward(graph) if (a, b) not in KNOWN_UPWARD]
    out += [f"kernels_numba imports workbench: {a} -> {b}" for a, bs in graph.items() for b in sorted(bs)
            if part(a) == "kernels_numba" and part(b).startswith("workbench")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on a cycle, an unknown upward arrow or a "
                    "kernel reached past kernels_numba.ops")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to read (default: this checkout)")
    args = ap.parse_args(argv)
    graph = imports(modules(args.root))
    doors = past_ops(args.root)
    print(report(graph))
    print(f"\nimports past kernels_numba.ops: {len(doors)}")
    if args.check:
        bad = problems(graph) + [f"past kernels_numba.ops: {d}" for d in doors]
        for b in bad:
            print(b, file=sys.stderr)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
