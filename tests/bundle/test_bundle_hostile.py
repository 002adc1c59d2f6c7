"""Hand-crafted hostile bundles, one broken rule each, and the specific reason each must give."""

import time

import pytest

from workbench.bundle import read_bundle_bytes

from .kdtr_corpus import MAGIC, RawBundle, RawEntry, content, reason_of

U64 = 2**64 - 1


def test_baseline_is_valid(raw, small_raw):
    assert raw.encode() == small_raw and reason_of(small_raw) is None


@pytest.mark.parametrize("field, value, reason", [
    ("magic", b"\x89KDTR\n\n\x1a", "bad_magic"),
    ("magic", b"PK\x03\x04\0\0\0\0", "bad_magic"),
    ("major", 2, "unsupported_version"),
    ("major", 0, "unsupported_version"),
    ("minor", 1, "unsupported_version"),
    ("required", 1, "unknown_required_feature"),
    ("required", 1 << 63, "unknown_required_feature"),
    ("entry_size", 255, "bad_entry_size"),
    ("entry_size", 0, "bad_entry_size"),
    ("header_bytes", U64, "header_too_large"),
    ("header_bytes", 2**63, "header_too_large"),
    ("header_bytes", 0, "bad_header_size"),
    ("header_bytes", 4609, "bad_header_size"),       # file size + 1 (header alone)
    ("count", U64, "too_many_tensors"),
    ("count", 2**63, "too_many_tensors"),
    ("count", 2**18 + 1, "too_many_tensors"),
    ("count", 12, "bad_header_size"),
    ("config_nbytes", U64, "config_too_large"),
    ("config_nbytes", 2**63, "config_too_large"),
    ("config_nbytes", (1 << 20) + 1, "config_too_large"),
    ("data_nbytes", U64, "bad_data_size"),
    ("data_nbytes", 2**63, "truncated"),
    ("data_nbytes", 2**64 - 64, "truncated"),
    ("data_nbytes", 704, "truncated"),               # one 64-byte block more than the file holds
    ("data_nbytes", 576, "trailing_bytes"),
    ("header_crc", 0, "header_checksum"),
    ("footer_reserved", 1, "bad_footer"),
    ("footer_magic", b"\x89KDTR\r\n\x1b", "bad_footer"),
])
def test_fixed_header_and_footer_fields(raw, field, value, reason):
    setattr(raw, field, value)
    assert reason_of(raw.encode()) == reason


def test_unknown_optional_features_are_ignored(raw, small_raw):
    raw.optional = 1 << 40
    assert content(read_bundle_bytes(raw.encode())) == content(read_bundle_bytes(small_raw))


def test_tiny_file_declaring_huge_counts_fails_fast():
    for count, cfg, data in ((2**63, 0, 0), (2**32, 0, 0), (0, 2**63, 0), (0, 0, 2**63)):
        tiny = RawBundle([], b"", count=count, config_nbytes=cfg, data_nbytes=data).encode()
        t = time.perf_counter()
        assert reason_of(tiny) in ("too_many_tensors", "config_too_large", "truncated")
        assert time.perf_counter() - t < 0.05 and len(tiny) < 200


def _tensor(raw: RawBundle, name: str = "a") -> RawEntry:
    return raw.entry(name)


@pytest.mark.parametrize("dims, nbytes, reason", [
    ([2**31], 2**33, "dim_too_large"),                  # fits int64, not int32
    ([U64], 0, "dim_too_large"),
    ([2, 2**63 - 1], 0, "dim_too_large"),
    ([2, 2**64 - 2], 0, "dim_too_large"),
    ([4, 2**30 - 1, 2**30 + 1], 2**64 - 16, "dim_too_large"),   # byte size 2^64 - 16: padding would wrap
    ([2**31 - 1, 2**30], (2**31 - 1) * 2**32, "out_of_bounds"),  # 2^63 - 2^32 bytes: a valid size, no data
    ([4, 2**30 - 1, 2**30 + 1], 60, "dim_too_large"),
    ([3, 5], 61, "nbytes_mismatch"),
    ([3, 5], U64, "nbytes_mismatch"),
    ([15], 60, None),                                   # a different shape of the same bytes: CRC-covered
    ([0, 2**31 - 1], 0, "hole"),                        # an empty tensor is fine; its data slot is not
    ([0] + [2**31 - 1] * 7, 0, "dim_too_large"),        # empty, but numpy cannot even describe it
])
def test_shapes_and_sizes(raw, dims, nbytes, reason):
    e = _tensor(raw)
    e.dims, e.nbytes = dims, nbytes
    assert reason_of(raw.encode()) == reason


@pytest.mark.parametrize("change, reason", [
    (dict(code=0), "bad_dtype"),
    (dict(code=9), "bad_dtype"),                        # == number of dtypes + 1 (codes start at 1)
    (dict(code=0xFFFF), "bad_dtype"),                   # -1 as int16
    (dict(code=0x8000), "bad_dtype"),
    (dict(code=5), None),                               # int32 has the same size: the CRC guards meaning
    (dict(code=4), "nbytes_mismatch"),                  # float64: other size
    (dict(rank=9), "bad_rank"),
    (dict(rank=255), "bad_rank"),
    (dict(rank=1), "bad_dims"),                         # a dim past the rank is not zero
    (dict(reserved3=b"\0\1\0"), "reserved_nonzero"),
    (dict(reserved4=1), "reserved_nonzero"),
])
def test_entry_fields(raw, change, reason):
    for k, v in change.items():
        setattr(_tensor(raw), k, v)
    assert reason_of(raw.encode()) == reason


@pytest.mark.parametrize("name, name_len, reason", [
    (b"b", None, "duplicate_name"),
    (b"__golden__", None, "duplicate_name"),
    (b"", None, "bad_name"),
    (b"\xff\xfe", None, "bad_name"),
    (b"\xed\xa0\x80", None, "bad_name"),                # an encoded surrogate is not UTF-8
    (b"a\nb", None, "bad_name"),
    (b"a\0b", None, "bad_name"),
    (b"x" * 160, 161, "bad_name"),                      # over-long
    (b"x" * 160, 0xFFFF, "bad_name"),
    (b"ab", 1, "bad_name"),                             # bytes after name_len must be zero
    (b"__metadata__", None, "reserved_name"),
    (b"__x", None, "reserved_name"),
    (b"x" * 160, None, None),                           # exactly at the cap is fine
    (b"\xc3\xa9t\xc3\xa9", None, None),                 # UTF-8 is fine
])
def test_names(raw, name, name_len, reason):
    e = _tensor(raw)
    e.name, e.name_len = name, name_len
    if reason is None:
        raw.entries.sort(key=lambda x: (not x.name.startswith(b"__"), x.name))
        raw.relayout()
    assert reason_of(raw.encode()) == reason


def test_offsets(raw):
    def check(mutate, reason):
        r = raw.copy()
        mutate(r)
        got = reason_of(r.encode())
        assert got == reason, (mutate.__name__, got)

    def misaligned(r):
        r.entry("a").offset += 8

    def beyond_eof(r):
        r.data = r.build_data()
        r.entry("g").offset += 4096

    def wraps(r):
        r.data = r.build_data()
        r.entry("g").offset = 2**64 - 64

    def out_of_order(r):                                # a and b swap data slots
        ea, eb = r.entry("a"), r.entry("b")
        ea.offset, eb.offset = eb.offset, ea.offset

    def overlap(r):                                     # b's range starts inside a's
        r.entry("b").offset = r.entry("a").offset

    def hole(r):
        r.entry("g").offset += 64

    def extra_data_block(r):
        r.data = r.build_data() + b"\0" * 64

    def missing_data_block(r):
        r.data = r.build_data()[:-64]

    check(misaligned, "misaligned_offset")
    check(beyond_eof, "out_of_bounds")
    check(wraps, "out_of_bounds")
    check(out_of_order, "unsorted_offsets")
    check(overlap, "overlap")
    check(hole, "hole")
    check(extra_data_block, "bad_data_size")
    check(missing_data_block, "out_of_bounds")


def test_nonzero_padding(raw):
    r = raw.copy()
    r.data = bytearray(r.build_data())
    r.data[r.entry("a").offset + 60] = 1                 # between a's end and b
    assert reason_of(r.encode(), verify=False) == "bad_padding"
    r = raw.copy()
    body = 64 + 256 * len(r.entries) + len(r.config)
    r.header_pad = b"\1" + b"\0" * ((-body) % 64 - 1)      # the header CRC covers it, so only structure can
    assert reason_of(r.encode()) == "bad_padding"


def test_sections(raw):
    def bad(mutate, reason):
        r = raw.copy()
        mutate(r)
        r.relayout()
        assert reason_of(r.encode()) == reason, mutate

    bad(lambda r: r.entries.remove(r.entry("__golden__")), "missing_section")
    bad(lambda r: setattr(r.entry("__golden__"), "code", 1), "bad_section")             # float32 golden
    bad(lambda r: setattr(r.entry("__prompt__"), "dims", [1, 3]), "bad_section")        # rank 2
    bad(lambda r: setattr(r.entry("__golden__"), "data", (512).to_bytes(4, "little") * 4),
        "token_out_of_range")
    bad(lambda r: setattr(r.entry("__prompt__"), "data", (2**32 - 1).to_bytes(4, "little") * 3),
        "token_out_of_range")                                                          # -1
    assert MAGIC[0] >= 0x80
