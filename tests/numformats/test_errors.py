"""numformats.errors.InputError is the workbench's InputError (one type, raised from either side)."""

import pytest

from numformats.errors import InputError
from numformats.int4 import unpack_int4
from workbench.errors import InputError as WorkbenchInputError
from workbench.quant.int4 import pack_int4


def test_one_input_error_type():
    assert WorkbenchInputError is InputError and issubclass(InputError, ValueError)
    with pytest.raises(WorkbenchInputError, match="not a positive multiple of 8"):
        pack_int4([[1, 2, 3]])
    with pytest.raises(WorkbenchInputError, match="wants int32 words"):
        unpack_int4([1.0])
