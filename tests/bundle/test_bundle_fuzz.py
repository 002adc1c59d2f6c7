"""Property-based robustness: random bytes and mutated valid bundles give identical content or the
typed error, never another exception. ``fuzz_one_input`` lets a coverage-guided fuzzer (atheris)
drive the same check."""

import struct
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.bundle import BundleFormatError, read_bundle_bytes

from .kdtr_corpus import FIXED, content, small_bundle

_SETTINGS = settings(max_examples=400, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_BASE: dict[str, object] = {}


def _base(tmp_path_factory) -> tuple[bytes, tuple]:
    if "raw" not in _BASE:
        raw = small_bundle(tmp_path_factory.mktemp("fuzz"))
        _BASE.update(raw=raw, content=content(read_bundle_bytes(raw)))
    return _BASE["raw"], _BASE["content"]


def fuzz_one_input(data: bytes, expected: tuple | None = None) -> None:
    """Load ``data``; any exception but BundleFormatError propagates. A successful load must mean
    exactly ``expected`` when given."""
    try:
        b = read_bundle_bytes(data)
    except BundleFormatError as e:
        if not e.reason or "\n" in str(e):
            raise AssertionError(f"bad error {e!r}") from None
        return
    for v in b.weights().values():              # touch every byte the loader handed out
        v.tobytes()
    if expected is not None and content(b) != expected:
        raise AssertionError("a mutated bundle loaded with a different meaning")


@_SETTINGS
@given(st.binary(max_size=5000))
def test_random_bytes(data):
    fuzz_one_input(data)
    fuzz_one_input(b"\x89KDTR\r\n\x1a" + data)


_FIELDS = [(8, "<H"), (10, "<H"), (12, "<I"), (16, "<Q"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (48, "<Q"),
           (56, "<Q")]


@st.composite
def _mutation(draw, size: int):
    kind = draw(st.sampled_from(["truncate", "flip", "overwrite", "splice", "length", "insert"]))
    pos = draw(st.integers(0, size - 1))
    if kind == "truncate":
        return kind, pos, None
    if kind == "flip":
        return kind, pos, draw(st.integers(0, 7))
    if kind == "length":
        off, fmt = draw(st.sampled_from(_FIELDS))
        bits = struct.calcsize(fmt) * 8
        return kind, off, (fmt, draw(st.sampled_from([0, 1, 2**(bits - 1), 2**bits - 1, size, size + 1,
                                                      size - 1, 64, 2**bits - 64])))
    return kind, pos, draw(st.binary(min_size=1, max_size=16))


def _apply(raw: bytes, m) -> bytes:
    kind, pos, arg = m
    if kind == "truncate":
        return raw[:pos]
    if kind == "flip":
        return raw[:pos] + bytes([raw[pos] ^ (1 << arg)]) + raw[pos + 1:]
    if kind == "length":
        fmt, value = arg
        return raw[:pos] + struct.pack(fmt, value) + raw[pos + struct.calcsize(fmt):]
    if kind == "overwrite":
        return raw[:pos] + arg + raw[pos + len(arg):]
    if kind == "insert":
        return raw[:pos] + arg + raw[pos:]
    return raw[:pos] + raw[pos + len(arg):]            # splice: drop len(arg) bytes


@_SETTINGS
@given(data=st.data())
def test_mutated_bundles(tmp_path_factory, data):
    raw, expected = _base(tmp_path_factory)
    for _ in range(data.draw(st.integers(1, 3))):
        raw = _apply(raw, data.draw(_mutation(len(raw)))) if raw else raw
    fuzz_one_input(raw, expected)


@_SETTINGS
@given(data=st.data())
def test_mutated_and_resigned_bundles_never_crash(tmp_path_factory, data):
    """Header mutations with the header CRC fixed up: structure checks alone must hold the line."""
    raw, _ = _base(tmp_path_factory)
    header_end = FIXED.unpack_from(raw)[4]
    kind, pos, arg = data.draw(_mutation(header_end))
    if kind in ("truncate", "insert", "splice"):       # keep the length: only field values change
        kind, arg = "overwrite", arg if isinstance(arg, bytes) else b"\xff"
    mutated = _apply(raw, (kind, pos, arg))[:len(raw)]
    fuzz_one_input(mutated)
    fuzz_one_input(mutated[:-16] + struct.pack("<I", zlib.crc32(mutated[:header_end])) + mutated[-12:])
