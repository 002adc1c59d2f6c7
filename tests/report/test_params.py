"""The parameters cell parser: literals only, JSON types only, exactly one tagged cell."""

from __future__ import annotations

import jupytext
import pytest

from workbench.errors import InputError
from workbench.report.params import check_overrides, default_parameters


def nb(params_src: str, tagged: int = 1):
    cells = ["# %%\nimport math\n"] + [f'# %% tags=["parameters"]\n{params_src}\n'] * tagged
    return jupytext.reads("\n".join(cells) + "\n# %%\nx = 1\n", fmt="py:percent")


def test_reads_literals_in_order():
    got = default_parameters(nb('a = 1\nb = [1, 2.5]\nc = {"k": None}\nd = "cpu"\ne = -3\nf = True'))
    assert got == {"a": 1, "b": [1, 2.5], "c": {"k": None}, "d": "cpu", "e": -3, "f": True}
    assert list(got) == ["a", "b", "c", "d", "e", "f"]


@pytest.mark.parametrize(
    "src, message",
    [
        ("a = 1\nb = a * 2", "not a literal"),
        ("a = (3, 4)", "not JSON-typed"),
        ("a = {1: 2}", "not JSON-typed"),
        ("a += 1", "not 'name = literal'"),
        ("a, b = 1, 2", "not 'name = literal'"),
        ("print(1)", "not 'name = literal'"),
        ("a = ", "does not parse"),
    ],
)
def test_rejects_non_literal_cells(src, message):
    with pytest.raises(InputError, match=message):
        default_parameters(nb(src))


@pytest.mark.parametrize("tagged", [0, 2])
def test_needs_exactly_one_parameters_cell(tagged):
    with pytest.raises(InputError, match=f"found {tagged}"):
        default_parameters(nb("a = 1", tagged=tagged))


def test_check_overrides():
    check_overrides({"a": 1, "b": "x"}, {"a": 2}, "nb")
    with pytest.raises(InputError, match="unknown parameter"):
        check_overrides({"a": 1}, {"z": 2}, "nb")
    with pytest.raises(InputError, match="finite JSON"):
        check_overrides({"a": 1}, {"a": float("nan")}, "nb")
    with pytest.raises(InputError, match="finite JSON"):
        check_overrides({"a": 1}, {"a": (1, 2)}, "nb")
