"""An independent encoder/decoder of the KDTR v1 layout (written from docs/kdtr-format.md, sharing no
code with workbench.bundle) used to craft malformed bundles, plus the small valid bundle the tests
start from. ``RawBundle.encode`` recomputes every derived field (counts, sizes, CRCs, data layout)
unless a test overrides it, so each test breaks exactly one rule.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from workbench.bundle import BundleFormatError, bf16, read_bundle_bytes, write_bundle
from workbench.config import preset

MAGIC = b"\x89KDTR\r\n\x1a"
FIXED = struct.Struct("<8sHHIQQQQQQ")
ENTRY = struct.Struct("<HHB3s8QQQII160s")
FOOTER = struct.Struct("<II8s")
CODES = {"float32": 1, "float16": 2, "bfloat16": 3, "float64": 4, "int32": 5, "int64": 6, "uint8": 7,
         "int8": 8}


def pad64(n: int) -> int:
    return (n + 63) // 64 * 64


@dataclass
class RawEntry:
    name: bytes
    code: int
    dims: list[int]
    offset: int
    nbytes: int
    data: bytes = b""
    crc: int | None = None            # None: crc32(data)
    rank: int | None = None           # None: len(dims)
    name_len: int | None = None       # None: len(name)
    reserved3: bytes = b"\0\0\0"
    reserved4: int = 0


@dataclass
class RawBundle:
    entries: list[RawEntry]
    config: bytes
    major: int = 1
    minor: int = 0
    entry_size: int = 256
    required: int = 0
    optional: int = 0
    header_bytes: int | None = None   # None: derived
    count: int | None = None
    config_nbytes: int | None = None
    data_nbytes: int | None = None
    data: bytes | None = None         # None: built from the entries' data at their offsets
    header_pad: bytes | None = None   # None: zeros up to the next multiple of 64
    header_crc: int | None = None
    footer_reserved: int = 0
    footer_magic: bytes = MAGIC
    magic: bytes = MAGIC

    def copy(self) -> RawBundle:
        return dataclasses.replace(self, entries=[dataclasses.replace(e) for e in self.entries])

    def build_data(self) -> bytes:
        end = max((e.offset + len(e.data) for e in self.entries), default=0)
        buf = bytearray(pad64(end))
        for e in self.entries:
            buf[e.offset:e.offset + len(e.data)] = e.data
        return bytes(buf)

    def encode(self) -> bytes:
        data = self.build_data() if self.data is None else self.data
        table = b"".join(
            ENTRY.pack(len(e.name) if e.name_len is None else e.name_len, e.code,
                       len(e.dims) if e.rank is None else e.rank, e.reserved3,
                       *(list(e.dims) + [0] * 8)[:8], e.offset, e.nbytes,
                       zlib.crc32(e.data) if e.crc is None else e.crc, e.reserved4, e.name)
            for e in self.entries)
        body_len = FIXED.size + len(table) + len(self.config)
        pad = b"\0" * (pad64(body_len) - body_len) if self.header_pad is None else self.header_pad
        hb = body_len + len(pad) if self.header_bytes is None else self.header_bytes
        fixed = FIXED.pack(self.magic, self.major, self.minor, self.entry_size, hb, self.required,
                           self.optional, len(self.entries) if self.count is None else self.count,
                           len(self.config) if self.config_nbytes is None else self.config_nbytes,
                           len(data) if self.data_nbytes is None else self.data_nbytes)
        header = fixed + table + self.config + pad
        crc = zlib.crc32(header) if self.header_crc is None else self.header_crc
        return header + data + FOOTER.pack(crc, self.footer_reserved, self.footer_magic)

    @classmethod
    def decode(cls, raw: bytes) -> RawBundle:
        """Split a valid bundle into fields (every derived field left None, so encode recomputes it)."""
        _, major, minor, esize, hb, req, opt, count, cfg_n, data_n = FIXED.unpack_from(raw)
        entries = []
        for i in range(count):
            name_len, code, rank, _, *rest = ENTRY.unpack_from(raw, FIXED.size + i * ENTRY.size)
            dims, (off, nbytes, _crc, _, name) = rest[:8], rest[8:]
            start = hb + off
            entries.append(RawEntry(name[:name_len], code, list(dims[:rank]), off, nbytes,
                                    raw[start:start + nbytes]))
        cfg_at = FIXED.size + count * ENTRY.size
        return cls(entries, raw[cfg_at:cfg_at + cfg_n], major, minor, esize, req, opt)

    def entry(self, name: str) -> RawEntry:
        return next(e for e in self.entries if e.name == name.encode())

    def relayout(self) -> None:
        """Recompute offsets and nbytes from each entry's data (after a test changed some data)."""
        end = 0
        for e in self.entries:
            e.offset, e.nbytes = pad64(end), len(e.data)
            end = e.offset + e.nbytes

    def config_obj(self) -> dict:
        return json.loads(self.config)

    def set_config(self, obj: dict) -> None:
        self.config = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def small_inputs() -> dict:
    """Inputs of the small valid bundle: tiny config, every dtype, an INT4 pair, 0-d and empty tensors."""
    rng = np.random.default_rng(1234)
    tensors = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "b": bf16(rng.standard_normal(4)),
        "c.packed": rng.integers(-2**31, 2**31, (2, 4), dtype=np.int64).astype(np.int32),
        "c.scale": np.array([[0.25], [0.5]], dtype=np.float16),
        "d": np.array(7, dtype=np.int64),
        "e": np.zeros((0, 3), dtype=np.uint8),
        "f": rng.standard_normal(3),
        "g": np.arange(-3, 3, dtype=np.int8),
    }
    return dict(config=preset("tiny"), tensors=tensors, prompt=[1, 2, 3], golden=[5, 6, 7, 8],
                margins=[1.5, 0.25, 3.0, 2.0], meta={"seed": 1234, "note": "kdtr test"})


def small_bundle(tmp_dir) -> bytes:
    path = tmp_dir / "small.kdtr"
    write_bundle(path, **small_inputs())
    return path.read_bytes()


def reason_of(raw: bytes, verify: bool = True) -> str | None:
    """The BundleFormatError reason for ``raw``, or None when it loads."""
    try:
        read_bundle_bytes(raw, verify_checksums=verify)
    except BundleFormatError as e:
        return e.reason
    return None


def content(b) -> tuple:
    """Everything a loaded bundle means, as comparable plain values."""
    def raw(v):
        bits = v.bits if hasattr(v, "bits") else v
        return (str(bits.dtype), bits.shape, np.ascontiguousarray(bits).tobytes())
    return (b.config, sorted((k, hasattr(v, "bits"), raw(v)) for k, v in b.tensors.items()),
            raw(b.prompt), raw(b.golden), raw(b.margins), json.dumps(b.meta, sort_keys=True),
            json.dumps(b.provenance, sort_keys=True))
