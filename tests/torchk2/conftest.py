"""torch on one thread in these tests, as in tests/train (the same fixture)."""

from tests.train.conftest import _one_torch_thread  # noqa: F401
