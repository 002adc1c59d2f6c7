"""A toy pair trained once per session (``train all --size toy`` on CPU), for the train and measure tests."""

import pytest

from workbench.cli import main


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    import torch  # here, not at collection: the other command tests do not need it
    out = tmp_path_factory.mktemp("toy")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = main(["train", "all", "--size", "toy", "--out", str(out), "--device", "cpu", "--no-progress",
                   "--commit", "abc123"])
    finally:
        torch.set_num_threads(n)
    assert rc == 0
    return out
