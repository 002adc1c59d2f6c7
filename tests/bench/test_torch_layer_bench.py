"""The torch layer's check and timing entry points (workbench/bench/torch_layer_bench.py).

CPU: the reference check on a small seeded model (float32: tolerance 1e-4; bfloat16: 3e-2), that it
fails on a corrupted layer, bad input. GPU tier: the layer captures in a CUDA graph and replays what
it computes eagerly.
"""

import os

import numpy as np
import pytest

from workbench.config import ModelConfig
from workbench.errors import InputError

torch = pytest.importorskip("torch")
from workbench.bench import torch_layer_bench as tlb  # noqa: E402
from workbench.ddtree.scenarios import ancestor_inputs  # noqa: E402
from workbench.torchk2.layer import TorchLayer  # noqa: E402

CFG = ModelConfig(
    vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
    v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, first_k_dense_replace=1,
    n_group=4, topk_group=2, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None)
ON_GPU = os.environ.get("KDTREE_GPU") == "1" and torch.cuda.is_available()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layer", [0, 1])
def test_check_passes_on_the_seeded_model(layer, dtype):
    tl = TorchLayer.from_seeded(CFG, 2, layer, device="cpu", dtype=dtype, max_len=32, workers=1)
    lines = []
    assert tlb.check_layer(CFG, 2, tl, log=lines.append), "\n".join(lines)
    assert sum("PASS" in s for s in lines) == 3                        # prefix, decode, verify


def test_check_fails_on_a_corrupted_layer():
    tl = TorchLayer.from_seeded(CFG, 2, 1, device="cpu", dtype=torch.float32, max_len=32, workers=1)
    tl.p["shared_w2"] *= 1.01                                           # a 1% error in one matrix
    lines = []
    assert not tlb.check_layer(CFG, 2, tl, log=lines.append)
    assert any("FAIL" in s for s in lines)


def test_bad_input(capsys):
    assert tlb.main(["--preset", "tiny", "--device", "cpu"]) == 2
    assert tlb.main(["--preset", "nope", "--check", "--device", "cpu"]) == 2
    assert tlb.main(["--preset", "tiny", "--time", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(s.startswith("error: ") for s in err)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="needs a CUDA GPU"):
            tlb.time_torch_layer(CFG, {}, (1,))


def test_cli_check_on_cpu(capsys):
    assert tlb.main(["--preset", "tiny", "--check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "check: PASS" in out and "moe path: " in out


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
def test_graph_replay_equals_eager_on_gpu():
    from workbench.bench.common import capture_graph
    tl = TorchLayer.from_seeded(CFG, 2, 1, device="cuda", max_len=64)
    assert tl.moe_path == "grouped_mm"
    n, start = 5, 20
    vis, pos = ancestor_inputs([-1, 0, 0, 1, 2], start)
    x = torch.zeros(n, CFG.hidden_size, device="cuda", dtype=torch.bfloat16)
    mask, positions = torch.from_numpy(vis).cuda(), torch.from_numpy(pos).cuda()
    out = {}
    g = capture_graph(lambda: out.__setitem__("y", tl.forward(x, mask, positions, start)))
    for seed in (0, 1):
        x.copy_(torch.randn(n, CFG.hidden_size, generator=torch.Generator().manual_seed(seed)))
        g.replay()
        torch.cuda.synchronize()
        want = tl.forward(x, mask, positions, start)
        got = out["y"].float().cpu().numpy()
        np.testing.assert_allclose(got, want.float().cpu().numpy(), rtol=1e-2, atol=1e-2)
    assert tlb.check_layer(CFG, 2, tl)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
def test_time_rows_on_gpu():
    tl = TorchLayer.from_seeded(CFG, 2, 1, device="cuda", max_len=80)
    sets = [torch.tensor([[0, 1, 2]] * 4), torch.tensor([[0, 1, 2], [3, 4, 5], [5, 6, 7], [0, 1, 7]])]
    rows = tlb.time_torch_layer(CFG, tl, (1, 4), context=64, reps=3, routes={4: sets})
    assert {r["part"] for r in rows} == {"attention", "router", "routed_experts", "shared_expert", "layer"}
    assert all(r["captured"] and r["us"] > 0 for r in rows)
    routed = {r["tokens"]: r["unique_experts"] for r in rows if r["part"] == "routed_experts"}
    assert routed[4] == 5.5 and routed[1] == 3                          # median of 3 and 8; one token: K
    with pytest.raises(InputError, match="sets must be"):
        tlb.time_torch_layer(CFG, tl, (4,), context=64, reps=1, routes={4: [torch.zeros(4, 2)]})
