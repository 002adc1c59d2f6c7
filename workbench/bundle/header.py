"""Parse and encode the bundle header: fixed header, tensor table and config block.

Parsing is split in the order a reader must follow: ``parse_fixed`` checks the 64-byte fixed
header and the declared sizes against the caps and the file size (no other byte is trusted before
that); the caller then reads exactly ``header_bytes`` and the footer, checks the header CRC, and
calls ``parse_table`` / ``parse_config`` / ``check_layout`` on checksummed bytes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from .format import (
    ALIGN,
    DTYPES,
    ENTRY,
    FIXED,
    FOOTER,
    KNOWN_REQUIRED_FEATURES,
    MAGIC,
    MAX_ARRAY_BYTES,
    MAX_CONFIG_BYTES,
    MAX_DIM,
    MAX_HEADER_BYTES,
    MAX_NAME_BYTES,
    MAX_RANK,
    MAX_TENSORS,
    RESERVED_PREFIX,
    SECTIONS,
    SUPPORTED_VERSIONS,
    VERSION,
    BundleFormatError,
    align_up,
    check_name,
    tensor_nbytes,
)
from .strict_json import loads_strict

_E = BundleFormatError


@dataclass(frozen=True)
class Fixed:
    version: tuple[int, int]
    header_bytes: int        # start of the data section; multiple of ALIGN
    optional_features: int
    tensor_count: int
    config_nbytes: int
    data_nbytes: int         # data section incl. padding; multiple of ALIGN

    @property
    def file_bytes(self) -> int:
        return self.header_bytes + self.data_nbytes + FOOTER.size


@dataclass(frozen=True)
class Entry:
    name: str
    code: int                # dtype code (format.DTYPES)
    shape: tuple[int, ...]
    offset: int              # from the start of the data section
    nbytes: int
    crc32: int               # zlib.crc32 of the tensor's nbytes bytes

    @property
    def dtype_name(self) -> str:
        return DTYPES[self.code][0]


def parse_fixed(raw: bytes, file_size: int) -> Fixed:
    """Check magic, version, features, caps and the exact file size from the first bytes of a file."""
    if raw[:len(MAGIC)] != MAGIC[:len(raw)]:
        raise _E("bad_magic", "not a KDTR bundle (bad magic bytes)")
    if file_size < FIXED.size + FOOTER.size or len(raw) < FIXED.size:
        raise _E("truncated", f"file is {file_size} bytes, shorter than the fixed header and footer")
    _, major, minor, entry_size, header_bytes, required, optional, count, config_nbytes, data_nbytes = \
        FIXED.unpack_from(raw)
    if (major, minor) not in SUPPORTED_VERSIONS:
        raise _E("unsupported_version", f"format version {major}.{minor} (this reader knows "
                 f"{VERSION[0]}.{VERSION[1]})")
    if required & ~KNOWN_REQUIRED_FEATURES:
        raise _E("unknown_required_feature", f"required feature bits {required:#x} are not understood")
    if entry_size != ENTRY.size:
        raise _E("bad_entry_size", f"table entry size {entry_size} (v1 uses {ENTRY.size})")
    if count > MAX_TENSORS:
        raise _E("too_many_tensors", f"tensor count {count} exceeds the cap {MAX_TENSORS}")
    if config_nbytes > MAX_CONFIG_BYTES:
        raise _E("config_too_large", f"config is {config_nbytes} bytes (cap {MAX_CONFIG_BYTES})")
    if header_bytes > MAX_HEADER_BYTES:
        raise _E("header_too_large", f"header is {header_bytes} bytes (cap {MAX_HEADER_BYTES})")
    want = align_up(FIXED.size + count * ENTRY.size + config_nbytes)
    if header_bytes != want:
        raise _E("bad_header_size", f"header_bytes {header_bytes} != {want} implied by {count} "
                 f"entries and a {config_nbytes}-byte config")
    if data_nbytes % ALIGN:
        raise _E("bad_data_size", f"data section size {data_nbytes} is not a multiple of {ALIGN}")
    fixed = Fixed((major, minor), header_bytes, optional, count, config_nbytes, data_nbytes)
    if file_size < fixed.file_bytes:
        raise _E("truncated", f"file is {file_size} bytes, the header declares {fixed.file_bytes}")
    if file_size > fixed.file_bytes:
        raise _E("trailing_bytes", f"file is {file_size} bytes, {file_size - fixed.file_bytes} "
                 f"past the {fixed.file_bytes} the header declares")
    return fixed


def check_footer(header: bytes, footer: bytes) -> None:
    """The footer repeats the magic and holds zlib.crc32 of the header bytes [0, header_bytes)."""
    crc, reserved, magic = FOOTER.unpack(footer)
    if magic != MAGIC or reserved != 0:
        raise _E("bad_footer", "footer magic or reserved bytes are wrong")
    if zlib.crc32(header) != crc:
        raise _E("header_checksum", "header/table/config CRC32 mismatch (file corrupted)")


def parse_table(header: bytes, fixed: Fixed) -> list[Entry]:
    """Decode and validate every table entry (names, dtype, rank, dims, exact nbytes)."""
    entries: list[Entry] = []
    seen: set[str] = set()
    for i in range(fixed.tensor_count):
        (name_len, code, rank, res3, *rest) = ENTRY.unpack_from(header, FIXED.size + i * ENTRY.size)
        dims_all, (offset, nbytes, crc, res4, name_field) = rest[:MAX_RANK], rest[MAX_RANK:]
        where = f"table entry {i}"
        if res3 != b"\0\0\0" or res4 != 0:
            raise _E("reserved_nonzero", f"{where}: reserved bytes are not zero")
        if not 1 <= name_len <= MAX_NAME_BYTES or any(name_field[name_len:]):
            raise _E("bad_name", f"{where}: name length {name_len} or name padding is invalid")
        try:
            name = name_field[:name_len].decode("utf-8")
        except UnicodeDecodeError:
            raise _E("bad_name", f"{where}: name is not valid UTF-8") from None
        check_name(name)
        where = f"tensor {name!r:.80}"
        if name.startswith(RESERVED_PREFIX) and name not in SECTIONS:
            raise _E("reserved_name", f"{where}: names starting with {RESERVED_PREFIX!r} are reserved")
        if name in seen:
            raise _E("duplicate_name", f"{where} appears twice in the table")
        seen.add(name)
        if code not in DTYPES:
            raise _E("bad_dtype", f"{where}: unknown dtype code {code}")
        if rank > MAX_RANK:
            raise _E("bad_rank", f"{where}: rank {rank} exceeds {MAX_RANK}")
        if any(dims_all[rank:]):
            raise _E("bad_dims", f"{where}: dims past the rank are not zero")
        shape = tuple(dims_all[:rank])
        if any(d > MAX_DIM for d in shape):
            raise _E("dim_too_large", f"{where}: dims {shape} exceed {MAX_DIM}")
        if tensor_nbytes(code, tuple(d for d in shape if d)) > MAX_ARRAY_BYTES:
            raise _E("dim_too_large", f"{where}: dims {shape} are too big for an array, even empty")
        if tensor_nbytes(code, shape) != nbytes:
            raise _E("nbytes_mismatch", f"{where}: nbytes {nbytes} != {tensor_nbytes(code, shape)} "
                     f"for {DTYPES[code][0]} {list(shape)}")
        entries.append(Entry(name, code, shape, offset, nbytes, crc))
    return entries


def check_layout(entries: list[Entry], data_nbytes: int) -> None:
    """Offsets in table order: aligned, in bounds, sorted, no overlap, no hole, exact data size."""
    prev_off = 0
    for e in entries:                   # first pass: each range on its own, and the order
        where = f"tensor {e.name!r:.80} at offset {e.offset}"
        if e.offset % ALIGN:
            raise _E("misaligned_offset", f"{where} is not {ALIGN}-byte aligned")
        if e.offset + e.nbytes > data_nbytes:
            raise _E("out_of_bounds", f"{where} with {e.nbytes} bytes ends past the data section "
                     f"({data_nbytes} bytes)")
        if e.offset < prev_off:
            raise _E("unsorted_offsets", f"{where} comes before the previous tensor's offset {prev_off}")
        prev_off = e.offset
    prev_end = 0
    for e in entries:                   # second pass: neighbours touch exactly (up to alignment)
        where = f"tensor {e.name!r:.80} at offset {e.offset}"
        if e.offset < prev_end:
            raise _E("overlap", f"{where} overlaps the previous tensor (ends at {prev_end})")
        if e.offset != align_up(prev_end):
            raise _E("hole", f"{where} leaves a gap after the previous tensor "
                     f"(expected {align_up(prev_end)})")
        prev_end = e.offset + e.nbytes
    if data_nbytes != align_up(prev_end):
        raise _E("bad_data_size", f"data section is {data_nbytes} bytes, tensors need {align_up(prev_end)}")


def parse_config(header: bytes, fixed: Fixed) -> dict[str, Any]:
    """The config block: strict JSON object with exactly the keys model, meta, provenance."""
    start = FIXED.size + fixed.tensor_count * ENTRY.size
    end = start + fixed.config_nbytes
    if any(header[end:fixed.header_bytes]):
        raise _E("bad_padding", "header padding after the config is not zero")
    obj = loads_strict(header[start:end])
    if set(obj) != {"model", "meta", "provenance"}:
        raise _E("bad_config_keys", f"config keys {sorted(obj)!r:.120} != ['meta', 'model', 'provenance']")
    for key in ("model", "meta", "provenance"):
        if not isinstance(obj[key], dict):
            raise _E("bad_config_keys", f"config[{key!r}] must be a JSON object")
    return obj


def encode_header(fixed: Fixed, entries: list[Entry], config: bytes) -> bytes:
    """Bytes [0, header_bytes): fixed header, table, config, zero padding (writer side)."""
    parts = [FIXED.pack(MAGIC, *fixed.version, ENTRY.size, fixed.header_bytes, 0, fixed.optional_features,
                        len(entries), len(config), fixed.data_nbytes)]
    for e in entries:
        raw = e.name.encode("utf-8")
        dims = list(e.shape) + [0] * (MAX_RANK - len(e.shape))
        parts.append(ENTRY.pack(len(raw), e.code, len(e.shape), b"\0\0\0", *dims, e.offset, e.nbytes,
                                e.crc32, 0, raw))
    parts.append(config)
    body = b"".join(parts)
    return body + b"\0" * (fixed.header_bytes - len(body))


def encode_footer(header: bytes) -> bytes:
    return FOOTER.pack(zlib.crc32(header), 0, MAGIC)
