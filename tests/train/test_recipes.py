"""The full size trains on CPU for a couple of steps at a short context (shapes, taps, block 16), and its
three bundles stay under the size limit; windows and anchors are drawn where they must be."""

import dataclasses

import numpy as np
import pytest
import torch

from workbench.errors import InputError
from workbench.torchk2.model import TorchTarget
from workbench.train.drafter import TorchDrafter
from workbench.train.export import MAX_TOTAL_BYTES, export_bundles
from workbench.train.presets import SIZES, size
from workbench.train.recipes import draw_anchors, fixed_windows, train_drafter, train_target, windows
from workbench.train.tokenizer import load_tokenizer


def test_full_size_runs_two_steps_of_each_on_cpu(tmp_path):
    s = size("full", target_seq_len=32, target_batch=2, target_max_steps=2, target_max_files=2,
             target_eval_windows=1, target_eval_prompts=1, target_n_completions=1, target_completion_tokens=2,
             drafter_prompt_lens=(16,), drafter_new_tokens=20, drafter_n_seqs=2, drafter_gen_batch=2,
             drafter_n_eval_seqs=1, drafter_batch=2, drafter_anchors=2, drafter_max_steps=2)
    s = dataclasses.replace(s, target_recipe=dataclasses.replace(s.target_recipe, minutes=None),
                            drafter_recipe=dataclasses.replace(s.drafter_recipe, minutes=None))
    t = train_target(tmp_path, s, load_tokenizer(), torch.device("cpu"), progress=False)
    assert t["steps"] == 2 and np.shape(t["eval"]["expert_counts"]) == (3, 32)
    d = train_drafter(tmp_path, s, torch.device("cpu"), progress=False)
    assert d["steps"] == 2 and len(d["eval"]["top1_by_position"]) == 15


def test_full_size_bundles_fit_the_limit(tmp_path):
    s = SIZES["full"]
    t, d = TorchTarget(s.target), TorchDrafter(s.target, s.drafter)
    t.init_weights(0)
    d.init_weights(1)
    res = export_bundles(tmp_path, s.target, s.drafter, t.weights_dict(), d.weights_dict(), load_tokenizer(),
                         {"note": "random init"}, {"commit": "test"})
    assert res["total_bytes"] <= MAX_TOTAL_BYTES - 50_000                # room for a real run's meta
    assert sum(v.size for v in t.weights_dict().values()) == 3_323_616     # docs/training.md


def test_windows_and_anchors():
    stream = np.arange(100, dtype=np.uint16)
    w = windows(stream, 5, 10, np.random.default_rng(0))
    assert w.shape == (5, 10) and np.all(np.diff(w, axis=1) == 1)
    assert fixed_windows(stream, 50, 30).tolist()[1][:2] == [30, 31]
    a = draw_anchors(torch.tensor([5, 20]), 40, 7, 100, np.random.default_rng(1))
    assert a[0].min() >= 5 and a[1].min() >= 20 and a.max() < 40 - 7
    with pytest.raises(InputError, match="no room"):
        draw_anchors(torch.tensor([35]), 40, 7, 3, np.random.default_rng(1))
