"""The device dflash drafter (engine.dflash.DeviceDFlash) against the reference ``dflash_propose``: draft
logits of two consecutive calls (the second appends context to the device cache) from random tapped
features written into the engine's tap buffer, so no target forward runs; eagerly and through the
launch sequence ``prepare`` captures (on the simulator: the same sequence, run eagerly), which reads
every position from the control block."""

import numpy as np
import pytest

from kernels_numba.sim import sim_speed
from tests.engine.common import bundle, engine
from workbench.ddtree.dflash import DraftCache, dflash_propose
from workbench.engine.dflash import DeviceDFlash
from workbench.errors import InputError


@pytest.mark.parametrize("prepared", [False, True])
def test_device_dflash_matches_reference_logits(prepared):
    name = "tiny"
    b, w, dcfg = bundle(name)
    eng = engine(name)
    rng = np.random.default_rng(11)
    feats = rng.standard_normal(eng.buf.feats.shape).astype(np.float32)     # [F, T, D]
    eng.put(eng.buf.feats, feats)
    dev = DeviceDFlash(eng, w, dcfg)
    if prepared:
        dev.prepare()
        assert dev.cap >= 3
    cache = DraftCache.empty(dcfg, 32, np.float32)
    tap = [eng.taps.index(k) for k in dcfg.target_layer_ids]
    with sim_speed():
        for start, rows, bonus in [(3, np.array([2, 0, 1]), 7), (5, np.array([4, 1]), 300)]:
            dev.propose(bonus, start, rows, len(rows))
            got = eng.fetch(dev.logits)                                       # [L, V]
            new = np.concatenate([feats[i][rows] for i in tap], axis=-1)
            want = dflash_propose(b.config, dcfg, w, cache, bonus, start, new)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
            np.testing.assert_array_equal(np.argsort(-got, axis=1, kind="stable")[:, :4],
                                          np.argsort(-want, axis=1, kind="stable")[:, :4])
        with pytest.raises(InputError):                                      # cache length mismatch
            dev.propose(1, 9, np.array([0]), 1)
