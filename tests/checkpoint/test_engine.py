"""The engine on a lazy checkpoint: ``upload_model`` of the mapping of two chosen layers (INT4 experts with
bf16 scales on fused_moe) decodes the reference's greedy tokens on that truncated model."""

import numpy as np

from tests.checkpoint.common import CFG8
from workbench.checkpoint import open_checkpoint
from workbench.checkpoint.synthetic import write_k26_checkpoint
from workbench.engine.build import upload_model
from workbench.generate import generate
from workbench.reference.generate import greedy_generate


def test_engine_decodes_the_reference_tokens_of_chosen_layers(tmp_path):
    ck = write_k26_checkpoint(tmp_path / "k26", CFG8, seed=5)
    t = open_checkpoint(ck, "0,6")
    paths = upload_model(t.cfg, t).paths()
    assert paths == [{"mlp": "portable"}, {"experts": "fused_moe", "shared": "portable"}]
    ref = greedy_generate(t.cfg, t, [3, 1, 4], 4)
    got = generate(t.cfg, t, [3, 1, 4], 4, backend="numba")
    np.testing.assert_array_equal(got.tokens, ref.tokens)
    assert ref.margins.min() > 1e-3                               # no near-tie the summation order could flip
