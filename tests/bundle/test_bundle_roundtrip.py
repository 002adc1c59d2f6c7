"""Write -> read round trips: exact bits, dtypes, shapes, alignment, determinism, read-only maps."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from workbench.bundle import BF16Array, Bundle, read_bundle, read_bundle_bytes, write_bundle
from workbench.bundle.payload import PACKED
from workbench.config import preset
from workbench.weights import is_model_name

from .kdtr_corpus import RawBundle, content, small_inputs

DTYPES = ["float32", "float16", "float64", "int32", "int64", "uint8", "int8", "bfloat16"]


def _bits(v) -> tuple:
    a = v.bits if isinstance(v, BF16Array) else v
    le = a.dtype.newbyteorder("<")
    return a.shape, le.str, np.ascontiguousarray(a, le).tobytes()


def test_small_bundle_round_trip(small_raw):
    inp = small_inputs()
    b = read_bundle_bytes(small_raw)
    assert b.config == preset("tiny") and b.meta == inp["meta"]
    assert b.prompt.dtype == np.int32 and b.prompt.tolist() == inp["prompt"]
    assert b.golden.dtype == np.int32 and b.golden.tolist() == inp["golden"]
    assert b.margins.dtype == np.float32 and b.margins.tolist() == inp["margins"]
    assert list(b.tensors) == sorted(inp["tensors"])
    for k, v in inp["tensors"].items():
        assert isinstance(b.tensors[k], BF16Array) == isinstance(v, BF16Array), k
        assert _bits(b.tensors[k]) == _bits(v), k
    assert b.provenance["format_version"] == "1.0" and b.provenance["seed"] == 1234
    assert b.provenance["numpy_version"] == np.__version__ and "workbench_version" in b.provenance
    w = b.weights()
    assert w["b"].dtype == np.float32 and np.array_equal(w["b"], inp["tensors"]["b"].float32())
    assert w["a"] is b.tensors["a"]
    assert [m.name for m in b.int4] == ["c"] and b.int4[0].group_size == 32
    b.verify()


def test_file_and_bytes_readers_agree_and_map_read_only(tmp_path, small_raw):
    p = tmp_path / "x.kdtr"
    p.write_bytes(small_raw)
    b = read_bundle(p)
    assert content(b) == content(read_bundle_bytes(small_raw))
    a = b.tensors["a"]
    assert isinstance(a, np.memmap) and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1.0
    assert isinstance(b.tensors["b"].bits, np.memmap) and not b.tensors["b"].bits.flags.writeable
    assert not b.golden.flags.writeable and not read_bundle_bytes(bytearray(small_raw)).golden.flags.writeable
    assert isinstance(b, Bundle) and b.path == str(p)


def test_same_inputs_give_identical_bytes(tmp_path, small_raw):
    inp = small_inputs()
    inp["tensors"] = dict(reversed(list(inp["tensors"].items())))          # insertion order is irrelevant
    inp["meta"] = dict(reversed(list(inp["meta"].items())))
    write_bundle(tmp_path / "again.kdtr", **inp)
    assert (tmp_path / "again.kdtr").read_bytes() == small_raw


def test_independent_codec_reencodes_writer_output_exactly(small_raw):
    assert RawBundle.decode(small_raw).encode() == small_raw


def test_no_golden_no_prompt(tmp_path):
    big_empty = np.zeros((0, 2**31 - 1, 7), np.int8)
    tensors = {"x": np.ones(3, np.float32), "z": big_empty}
    write_bundle(tmp_path / "w.kdtr", config=preset("tiny2"), tensors=tensors)
    b = read_bundle(tmp_path / "w.kdtr")
    assert b.tensors["z"].shape == big_empty.shape and b.tensors["z"].dtype == np.int8
    assert b.prompt.shape == b.golden.shape == b.margins.shape == (0,) and b.meta == {}
    assert b.config == preset("tiny2")


def _array(draw, dtype: str):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    if dtype == "bfloat16":
        return BF16Array(draw(hnp.arrays(np.uint16, shape)))
    dt = np.dtype(dtype)
    if draw(st.booleans()):
        dt = dt.newbyteorder(">")                                        # big-endian input
    a = draw(hnp.arrays(dt, shape))
    if a.ndim >= 1 and draw(st.booleans()):
        a = np.concatenate([a, a], axis=-1)[..., ::2]                     # non-contiguous view
    if a.ndim >= 2 and draw(st.booleans()):
        a = a.T
    return a


@st.composite
def _tensor_dicts(draw):
    # names ending in ".packed" are INT4 matrices and model weight names ("embed") are checked against
    # the config on read; both are covered separately, so plain-container names leave them out
    names = draw(st.lists(st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs", "Cc")),
                                  min_size=1, max_size=12)
                          .filter(lambda s: not s.startswith("__") and not s.endswith(PACKED)
                                  and not is_model_name(s)),
                          min_size=0, max_size=5, unique=True))
    return {n: _array(draw, draw(st.sampled_from(DTYPES))) for n in names}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=_tensor_dicts())
def test_hypothesis_round_trip_is_bit_identical(tmp_path_factory, tensors):
    p = tmp_path_factory.getbasetemp() / "rt.kdtr"
    write_bundle(p, config=preset("tiny"), tensors=tensors)
    b = read_bundle(p)
    assert list(b.tensors) == sorted(tensors)
    for k, v in tensors.items():
        got = b.tensors[k]
        assert isinstance(got, BF16Array) == isinstance(v, BF16Array) and _bits(got) == _bits(v), k
        data = got.bits if isinstance(got, BF16Array) else got
        if data.size:
            assert data.ctypes.data % 64 == 0 and data.flags.c_contiguous
    assert content(b) == content(read_bundle_bytes(p.read_bytes()))
    os.unlink(p)
