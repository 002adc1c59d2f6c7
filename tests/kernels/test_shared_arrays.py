"""Every kernel's shared arrays are sized by a name or a literal (or a tuple of them): numba's GPU
typing needs the size as a constant and refuses an expression such as ``TPB * KS``, which the
simulator (where CI runs the kernels) accepts. Kernels that call device functions cannot be compiled
here without a driver (tests/kernels/test_compile_ptx.py compiles the others), so this reads the source."""

import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "kernels_numba"


def _constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Tuple):
        return all(_constant(e) for e in node.elts)
    return isinstance(node, (ast.Name, ast.Constant)) or (
        isinstance(node, ast.IfExp) and _constant(node.body) and _constant(node.orelse))


def _sizes(tree: ast.AST):
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "array"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "shared"):
            yield node


def test_shared_array_sizes_are_constants():
    bad = [f"{p.name}:{n.lineno}" for p in sorted(KERNELS.glob("*.py"))
           for n in _sizes(ast.parse(p.read_text())) if not _constant(n.args[0])]
    assert not bad, f"shared.array sized by an expression (make it a module constant): {bad}"


def test_the_rule_sees_an_expression():
    src = ("def k():\n    a = cuda.shared.array(TPB * KS, np.float32)\n"
           "    b = cuda.shared.array((KS, TPB), f)\n")
    assert [_constant(n.args[0]) for n in _sizes(ast.parse(src))] == [False, True]
