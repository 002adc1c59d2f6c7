"""Payload rules (INT4 pairs, tokens, margins): the writer refuses them and the reader rejects a file
that carries them anyway (crafted with the independent encoder), with the same reason."""

import numpy as np
import pytest

from workbench.bundle import BF16Array, BundleFormatError, bf16, write_bundle

from .kdtr_corpus import CODES, RawBundle, RawEntry, pad64, reason_of, small_inputs


def _raw_from(inputs: dict, tmp_path) -> RawBundle:
    """The valid small bundle with its tensors replaced by ``inputs["tensors"]`` (no writer checks)."""
    good = small_inputs()
    write_bundle(tmp_path / "base.kdtr", **dict(good, tensors={}))
    raw = RawBundle.decode((tmp_path / "base.kdtr").read_bytes())
    sections = raw.entries[:3]
    for name in sorted(inputs["tensors"]):
        v = inputs["tensors"][name]
        bits = v.bits if isinstance(v, BF16Array) else np.ascontiguousarray(v)
        code = CODES["bfloat16" if isinstance(v, BF16Array) else str(bits.dtype)]
        sections.append(RawEntry(name.encode(), code, list(bits.shape), 0, bits.nbytes, bits.tobytes()))
    raw.entries = sections
    for key, name, dtype in (("golden", b"__golden__", np.int32), ("prompt", b"__prompt__", np.int32),
                             ("margins", b"__margins__", np.float32)):
        a = np.asarray(inputs[key], dtype)
        e = raw.entry(name.decode())
        e.data, e.dims = a.tobytes(), [a.size]
    raw.relayout()
    return raw


def _both_reject(tmp_path, reason, **changes):
    inp = dict(small_inputs(), **changes)
    with pytest.raises(BundleFormatError) as e:
        write_bundle(tmp_path / "never.kdtr", **inp)
    assert e.value.reason == reason
    assert not (tmp_path / "never.kdtr").exists()
    assert reason_of(_raw_from(inp, tmp_path).encode()) == reason


def _int4(n=4, k=64, g=32, scale=None, packed_dtype=np.int32):
    packed = np.arange(n * k // 8, dtype=packed_dtype).reshape(n, k // 8)
    return {"w.packed": packed, "w.scale": np.full((n, k // g), 0.5, np.float16) if scale is None else scale}


def test_valid_int4_pairs_load(tmp_path):
    for g, scale_kind in ((32, "f16"), (64, "bf16"), (128, "f16")):
        t = _int4(k=256, g=g)
        if scale_kind == "bf16":
            t["w.scale"] = bf16(t["w.scale"].astype(np.float32))
        assert reason_of(_raw_from(dict(small_inputs(), tensors=t), tmp_path).encode()) is None


@pytest.mark.parametrize("tensors, reason", [
    ({**_int4(), "w.scale": np.full((3, 2), 0.5, np.float16)}, "int4_shape"),       # N differs
    ({**_int4(), "w.scale": np.full((4, 2, 1), 0.5, np.float16)}, "int4_scale_dtype"),
    ({**_int4(), "w.scale": np.full((4, 2), 0.5, np.float32)}, "int4_scale_dtype"),
    (_int4(packed_dtype=np.int64), "int4_shape"),
    ({"w.packed": np.zeros((4, 8, 1), np.int32), "w.scale": np.ones((4, 2), np.float16)}, "int4_shape"),
    ({"w.packed": np.zeros((0, 8), np.int32), "w.scale": np.ones((0, 2), np.float16)}, "int4_shape"),
    ({"w.packed": np.zeros((4, 8), np.int32)}, "int4_missing_scale"),
    ({**_int4(), "w": np.zeros((4, 64), np.float32)}, "int4_conflict"),
    ({**_int4(), "w.scale": np.full((4, 3), 0.5, np.float16)}, "int4_group_size"),   # K % 3 != 0
    ({**_int4(), "w.scale": np.full((4, 4), 0.5, np.float16)}, "int4_group_size"),   # G = 16
    ({**_int4(k=40), "w.scale": np.full((4, 1), 0.5, np.float16)}, "int4_group_size"),  # K=40, G=40
    ({**_int4(), "w.scale": np.array([[0.5, 0.0]] * 4, np.float16)}, "int4_bad_scale"),
    ({**_int4(), "w.scale": np.array([[0.5, -1.0]] * 4, np.float16)}, "int4_bad_scale"),
    ({**_int4(), "w.scale": np.array([[0.5, np.nan]] * 4, np.float16)}, "int4_bad_scale"),
    ({**_int4(), "w.scale": np.array([[np.inf, 1.0]] * 4, np.float16)}, "int4_bad_scale"),
    ({**_int4(), "w.scale": bf16(np.array([[0.5, np.nan]] * 4, np.float32))}, "int4_bad_scale"),
])
def test_int4_rules(tmp_path, tensors, reason):
    _both_reject(tmp_path, reason, tensors=tensors)


@pytest.mark.parametrize("changes, reason", [
    (dict(golden=[1, 512, 3, 4]), "token_out_of_range"),            # tiny vocab is 512
    (dict(golden=[1, -1, 3, 4]), "token_out_of_range"),
    (dict(prompt=[600]), "token_out_of_range"),
    (dict(margins=[1.0, 2.0, 3.0]), "bad_margins"),
    (dict(margins=[1.0, np.nan, 3.0, 1.0]), "bad_margins"),
    (dict(margins=[1.0, np.inf, 3.0, 1.0]), "bad_margins"),
    (dict(margins=[1.0, -0.5, 3.0, 1.0]), "bad_margins"),
])
def test_token_and_margin_rules(tmp_path, changes, reason):
    _both_reject(tmp_path, reason, **changes)


@pytest.mark.parametrize("changes, reason", [
    (dict(golden=[1.5, 2.0, 3.0, 4.0]), "bad_section"),
    (dict(prompt=[[1, 2]]), "bad_section"),
    (dict(prompt=[2**40]), "token_out_of_range"),
    (dict(margins=None), "bad_margins"),
    (dict(tensors={"__x": np.zeros(1, np.float32)}), "reserved_name"),
    (dict(tensors={"": np.zeros(1, np.float32)}), "bad_name"),
    (dict(tensors={"x" * 161: np.zeros(1, np.float32)}), "bad_name"),
    (dict(tensors={"a\ud800": np.zeros(1, np.float32)}), "bad_name"),
    (dict(tensors={"x": np.zeros(1, bool)}), "unsupported_dtype"),
    (dict(tensors={"x": np.zeros(1, np.complex64)}), "unsupported_dtype"),
    (dict(tensors={"x": [1.0, 2.0]}), "bad_tensor"),
    (dict(tensors={"x": np.zeros([1] * 9, np.float32)}), "bad_rank"),
    (dict(meta={"x": float("nan")}), "bad_meta"),
    (dict(meta={"x": object()}), "bad_meta"),
    (dict(meta={"x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}), "json_too_deep"),
    (dict(config={"vocab_size": 512}), "bad_model_config"),
    (dict(config=small_inputs()["config"].to_dict()), "bad_model_config"),
])
def test_writer_refuses_bad_inputs_before_touching_disk(tmp_path, changes, reason):
    inp = dict(small_inputs(), **changes)
    with pytest.raises(BundleFormatError) as e:
        write_bundle(tmp_path / "never.kdtr", **inp)
    assert e.value.reason == reason and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_writer_accepts_numpy_meta_and_returns_plain_json(tmp_path):
    inp = dict(small_inputs(), meta={"fp32_golden": np.array([5, 6, 7, 9]), "g": np.int64(3), "t": (1, 2)})
    write_bundle(tmp_path / "m.kdtr", **inp)
    from workbench.bundle import read_bundle
    assert read_bundle(tmp_path / "m.kdtr").meta == {"fp32_golden": [5, 6, 7, 9], "g": 3, "t": [1, 2]}
    assert pad64(1) == 64
