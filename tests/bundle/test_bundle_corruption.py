"""Truncation at every byte, trailing data / polyglots, and bit flips: always the typed error."""

import io
import os
import zipfile

import numpy as np

from workbench.bundle import BundleFormatError, read_bundle

from .kdtr_corpus import FIXED, RawBundle, reason_of


def test_every_truncation_is_rejected_as_truncated(small_raw):
    reasons = {n: reason_of(small_raw[:n]) for n in range(len(small_raw))}
    assert set(reasons.values()) == {"truncated"}, {r for r in reasons.values()}
    assert reason_of(small_raw) is None


def test_truncated_files_on_disk(tmp_path, small_raw):
    p = tmp_path / "t.kdtr"
    for n in list(range(0, 100)) + list(range(100, len(small_raw), 97)):
        p.write_bytes(small_raw[:n])
        try:
            read_bundle(p)
        except BundleFormatError as e:
            assert e.reason == "truncated" and str(p) in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"prefix of {n} bytes accepted")


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("payload.txt", "hello")
    return buf.getvalue()


def test_trailing_bytes_and_appended_archives(small_raw):
    for tail in (b"\0", b"\0" * 64, _zip(), b"%PDF-1.7\n%%EOF\n", small_raw):
        assert reason_of(small_raw + tail) == "trailing_bytes"


def test_every_bit_flip_in_header_table_config_and_footer_is_rejected(small_raw):
    raw = RawBundle.decode(small_raw)
    header_end = FIXED.unpack_from(small_raw)[4]
    data_end = len(small_raw) - 16
    positions = list(range(header_end)) + list(range(data_end, len(small_raw)))
    buf = bytearray(small_raw)
    accepted, reasons = [], set()
    for i in positions:
        for bit in range(8):
            buf[i] ^= 1 << bit
            r = reason_of(bytes(buf))
            buf[i] ^= 1 << bit
            if r is None:
                accepted.append((i, bit))
            reasons.add(r)
    assert not accepted, accepted[:10]
    # structure catches flips of the fixed header before the CRC is even computed
    assert {"bad_magic", "unsupported_version", "truncated", "header_checksum", "bad_footer"} <= reasons
    assert len(raw.entries) == 11


def test_sampled_data_bit_flips_are_caught_by_tensor_checksums(small_raw):
    raw = RawBundle.decode(small_raw)
    header_end = FIXED.unpack_from(small_raw)[4]
    rng = np.random.default_rng(7)
    inside = [header_end + e.offset + j for e in raw.entries for j in range(e.nbytes)]
    padding = sorted(set(range(header_end, len(small_raw) - 16)) - set(inside))
    for pos in rng.choice(inside, 400):
        buf = bytearray(small_raw)
        buf[pos] ^= 1 << int(rng.integers(8))
        assert reason_of(bytes(buf)) == "tensor_checksum", pos
        # without the checksum pass, a flipped payload byte still never crashes the reader
        assert reason_of(bytes(buf), verify=False) in (None, "token_out_of_range", "bad_margins",
                                                       "int4_bad_scale")
    for pos in rng.choice(padding, 100):
        buf = bytearray(small_raw)
        buf[pos] ^= 1 << int(rng.integers(8))
        assert reason_of(bytes(buf), verify=False) == "bad_padding", pos


def test_unreadable_paths(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                                  # opening must not block waiting for a writer
    for path, reason in ((tmp_path / "missing.kdtr", "io_error"), (tmp_path, "not_a_file"),
                         (fifo, "not_a_file"), ("/dev/zero", "not_a_file")):
        try:
            read_bundle(path)
        except BundleFormatError as e:
            assert e.reason == reason and str(path) in str(e)
        else:
            raise AssertionError(f"{path} accepted")
