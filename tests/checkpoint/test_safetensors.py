"""The safetensors header reader and the memory-mapped views against the safetensors library's own
reading (every dtype the workbench takes, empty tensors), and at offsets the library never writes but
the format allows (a float32 tensor 6 bytes into the data)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench.bundle import BF16Array
from workbench.checkpoint.safetensors import MappedFiles, read_header
from workbench.errors import InputError


def _bits(t):
    return t.view(torch.int16).numpy().view(np.uint16)


def test_views_hold_what_the_library_reads(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a_bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
               "b_f32": torch.randn(7, generator=g),
               "c_f16": torch.randn(2, 3, generator=g).half(), "d_f64": torch.randn(4, generator=g).double(),
               "e_i32": torch.randint(-9, 9, (3, 2), generator=g, dtype=torch.int32),
               "f_i64": torch.tensor([2048, 7168]), "g_empty": torch.zeros(0, 4)}
    save_file(tensors, str(tmp_path / "t.safetensors"))
    back = load_file(str(tmp_path / "t.safetensors"))
    header = read_header(tmp_path / "t.safetensors")
    files = MappedFiles()
    assert header.keys() == tensors.keys()
    for name, t in back.items():
        v = files.tensor(header[name])
        if t.dtype == torch.bfloat16:
            assert isinstance(v, BF16Array) and np.array_equal(v.bits, _bits(t))
        else:
            assert v.dtype == t.numpy().dtype and v.shape == tuple(t.shape) and np.array_equal(v, t.numpy())
        assert not np.asarray(v.bits if isinstance(v, BF16Array) else v).flags.writeable


def test_unaligned_offsets_read_right(tmp_path):
    a = np.array([1.5, -2.0, 3.25], np.float32)
    bits = BF16Array(np.array([0x3F80, 0x4000, 0xC040], np.uint16))            # 1, 2, -3 in 6 bytes
    header = json.dumps({"x": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
                         "y": {"dtype": "F32", "shape": [3], "data_offsets": [6, 18]}}).encode()
    (tmp_path / "u.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bits.bits.tobytes()
                                             + a.tobytes())
    h = read_header(tmp_path / "u.safetensors")
    files = MappedFiles()
    np.testing.assert_array_equal(files.tensor(h["x"]).float32(), [1.0, 2.0, -3.0])
    np.testing.assert_array_equal(files.tensor(h["y"]), a)


def test_a_bool_tensor_is_an_unsupported_dtype(tmp_path):
    save_file({"m": torch.ones(3, dtype=torch.bool)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(InputError, match="unsupported tensor dtype BOOL"):
        read_header(tmp_path / "b.safetensors")
