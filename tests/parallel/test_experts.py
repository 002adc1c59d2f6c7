"""ExpertSplit (bad world sizes are one-line ConfigErrors) and the dispatch plan (no processes)."""

import numpy as np
import pytest
import torch

from workbench.config import ConfigError
from workbench.parallel.ep_moe import dispatch_plan
from workbench.parallel.experts import ExpertSplit


@pytest.mark.parametrize("e,p,msg", [(16, 3, "do not split evenly"), (384, 7, "do not split evenly"),
                                     (8, 16, "exceeds"), (16, 0, "positive"), (16, True, "positive")])
def test_bad_world_sizes(e, p, msg):
    with pytest.raises(ConfigError, match=msg):
        ExpertSplit(e, p)


def test_ranges_and_rows():
    s = ExpertSplit(384, 8)
    assert s.per_rank == 48 and s.experts(3) == range(144, 192)
    assert list(s.owned_rows(17, 1)) == [1, 9] and s.rows_per_rank(17) == 3 and list(s.owned_rows(1, 5)) == []
    with pytest.raises(ConfigError, match="rank 8"):
        s.experts(8)


def test_dispatch_plan_sends_each_row_once_per_rank_with_its_local_slots():
    split = ExpertSplit(16, 4)                          # 4 experts per rank
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(16)[:4] for _ in range(6)]).astype(np.int32)     # [6, 4]
    ids[0] = [0, 1, 2, 3]                                                             # all on rank 0
    wts = rng.random((6, 4)).astype(np.float32)
    plan = dispatch_plan(torch.from_numpy(ids), torch.from_numpy(wts), split)
    dest, row = plan.dest.numpy(), plan.row.numpy()
    want = sorted({(int(e) // 4, o) for o in range(6) for e in ids[o]})
    assert list(zip(dest.tolist(), row.tolist(), strict=True)) == want             # deduplicated, sorted
    assert plan.counts.tolist() == [sum(q == r for q, _ in want) for r in range(4)]
    for j, (q, o) in enumerate(want):
        slots = {(int(e) - 4 * q, float(w)) for e, w in zip(ids[o], wts[o], strict=True) if e // 4 == q}
        got = list(zip(plan.ids[j].tolist(), plan.wts[j].tolist(), strict=True))
        assert set(got[:len(slots)]) == slots                                       # local first, remapped
        assert all(i == 4 and w == 0.0 for i, w in got[len(slots):])               # the rest masked
