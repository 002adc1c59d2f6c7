"""torch on one thread in these tests: on a shared 2-core machine small ops run ~30x faster than
with two contending threads (results do not depend on the thread count beyond float rounding)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
