"""User JSON within limits: deep nesting and huge integers are one InputError naming file and field."""

import pytest

from workbench.errors import InputError
from workbench.json_limits import MAX_DEPTH, load_file, loads


@pytest.mark.parametrize("text, match", [
    ("[" * 100_000 + "]" * 100_000, "field .* nests deeper than 64"),
    ('{"a": {"b": [1, ' + "[" * 70 + "]" * 70 + "]}}", r"field a\.b\[1\]"),
    ('{"vocab_size": ' + "9" * 5000 + "}", "field vocab_size is an integer of 5000 digits"),
    ('{"q": {"config_groups": [1, -' + "1" * 50 + "]}}", r"field q\.config_groups\[1\] is an integer of 50"),
    ("{", "not readable JSON"),
])
def test_limits_give_one_line_naming_the_field(text, match):
    with pytest.raises(InputError, match=match) as e:
        loads(text, "config.json")
    assert str(e.value).startswith("config.json: ") and "\n" not in str(e.value)


def test_limits_leave_ordinary_json_alone():
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads('{"a": [1, 2.5, "x", null], "b": ' + "9" * 40 + "}", "f") == {"a": [1, 2.5, "x", None],
                                                                             "b": int("9" * 40)}
    assert loads(nested, "f") is not None


def test_a_fifo_is_not_read(tmp_path):
    import os
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        load_file(fifo)                                  # would block forever if opened plainly
