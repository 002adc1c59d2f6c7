"""The tagged ``parameters`` cell of a py:percent notebook: its names, defaults and checks.

A parameters cell holds plain assignments of JSON-typed literals (str, int, float, bool, None,
lists and dicts of those), because papermill passes any other type as a quoted string.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import jupytext
import nbformat

from ..errors import InputError


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read a jupytext py:percent file (or an .ipynb) into a notebook node."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"notebook not found: {path}")
    try:
        return jupytext.read(path)
    except Exception as e:  # jupytext raises assorted types for unreadable files
        raise InputError(f"cannot read notebook {path}: {e}") from None


def parameters_cell_index(nb: nbformat.NotebookNode, name: str = "notebook") -> int:
    """Index of the one code cell tagged ``parameters``; InputError if none or several."""
    hits = [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(hits) != 1:
        raise InputError(f"{name}: expected exactly one cell tagged 'parameters', found {len(hits)}")
    return hits[0]


def _is_json_value(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, str)):
        return True
    if isinstance(v, float):
        return True
    if isinstance(v, list):
        return all(_is_json_value(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_json_value(x) for k, x in v.items())
    return False


def default_parameters(nb: nbformat.NotebookNode, name: str = "notebook") -> dict[str, Any]:
    """The parameters cell's ``name = literal`` assignments as a dict, in source order.

    InputError for anything else in the cell (derived values, calls, tuples, augmented assigns).
    """
    src = nb.cells[parameters_cell_index(nb, name)].source
    try:
        tree = ast.parse(src)
    except SyntaxError as e:
        raise InputError(f"{name}: parameters cell does not parse: {e.msg} (line {e.lineno})") from None
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            raise InputError(f"{name}: parameters cell line {stmt.lineno} is not 'name = literal'")
        try:
            value = ast.literal_eval(stmt.value)
        except ValueError:
            raise InputError(f"{name}: parameter {stmt.targets[0].id} is not a literal") from None
        if not _is_json_value(value):
            raise InputError(f"{name}: parameter {stmt.targets[0].id} is not JSON-typed: {value!r}")
        out[stmt.targets[0].id] = value
    return out


def check_overrides(defaults: dict[str, Any], overrides: dict[str, Any], name: str) -> None:
    """InputError if an override names an unknown parameter or is not JSON-typed."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise InputError(f"{name}: unknown parameter(s) {', '.join(unknown)} "
                         f"(the notebook declares {', '.join(defaults)})")
    for k, v in overrides.items():
        if not _is_json_value(v) or (isinstance(v, float) and not math.isfinite(v)):
            raise InputError(f"{name}: parameter {k} must be a finite JSON value, got {v!r}")
