"""KDTR v1 constants, the binary layouts, the dtype table, the caps and the one size function.

Byte-level spec: docs/kdtr-format.md. All integers are little-endian. Everything a reader must
agree on lives here, so the reader, the writer and the tests share one definition.
"""

from __future__ import annotations

import math
import struct

import numpy as np

MAGIC = b"\x89KDTR\r\n\x1a"          # non-ASCII first byte, CR-LF and ^Z catch text-mode transfers
VERSION = (1, 0)                      # (major, minor); this reader accepts exactly these pairs:
SUPPORTED_VERSIONS = frozenset({(1, 0)})
KNOWN_REQUIRED_FEATURES = 0           # v1.0 defines no required feature bits
ALIGN = 64                            # header size and every tensor offset are multiples of this

# fixed header (64 B): magic, major, minor, table_entry_size, header_bytes, required_features,
# optional_features, tensor_count, config_nbytes, data_nbytes
FIXED = struct.Struct("<8sHHIQQQQQQ")
# table entry (256 B): name_len, dtype, rank, 3 reserved, dims[8], offset, nbytes, crc32, 4 reserved, name
ENTRY = struct.Struct("<HHB3s8QQQII160s")
# footer (16 B): crc32 of bytes [0, header_bytes), 4 reserved zero bytes, magic again
FOOTER = struct.Struct("<II8s")

MAX_RANK = 8
MAX_NAME_BYTES = 160
MAX_TENSORS = 1 << 18                 # 262144 table entries (64 MiB of table)
MAX_CONFIG_BYTES = 1 << 20            # the JSON block
MAX_JSON_DEPTH = 32
MAX_JSON_INT_DIGITS = 40
MAX_DIM = 2**31 - 1                   # every dim fits int32 (kernels index with 32-bit ints)
MAX_ARRAY_BYTES = 2**63 - 1           # itemsize * prod(non-zero dims): numpy refuses more, even when empty
MAX_HEADER_BYTES = FIXED.size + MAX_TENSORS * ENTRY.size + MAX_CONFIG_BYTES + ALIGN

# the payload sections live in the table under these reserved names (dtype, rank 1)
PROMPT, GOLDEN, MARGINS = "__prompt__", "__golden__", "__margins__"
SECTIONS = {PROMPT: 5, GOLDEN: 5, MARGINS: 1}   # name -> required dtype code
RESERVED_PREFIX = "__"                 # every other name with this prefix is refused

# dtype code -> (name, numpy storage dtype). 0 is invalid; bfloat16 is stored as raw uint16 bits.
DTYPES: dict[int, tuple[str, np.dtype]] = {
    1: ("float32", np.dtype("<f4")),
    2: ("float16", np.dtype("<f2")),
    3: ("bfloat16", np.dtype("<u2")),
    4: ("float64", np.dtype("<f8")),
    5: ("int32", np.dtype("<i4")),
    6: ("int64", np.dtype("<i8")),
    7: ("uint8", np.dtype("|u1")),
    8: ("int8", np.dtype("|i1")),
}
BF16_CODE = 3
CODE_BY_NAME = {name: code for code, (name, _) in DTYPES.items()}


class BundleFormatError(ValueError):
    """A KDTR bundle (or the data handed to the writer) breaks the format.

    ``reason`` is a short snake_case code (listed in docs/kdtr-format.md); ``str(e)`` is one line.
    """

    def __init__(self, reason: str, message: str, path: str | None = None) -> None:
        self.reason = reason
        self.message = " ".join(str(message).split())      # always one line
        self.path = path
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}invalid KDTR bundle [{self.reason}]: {self.message}"

    def with_path(self, path: str) -> BundleFormatError:
        return BundleFormatError(self.reason, self.message, path)


def align_up(n: int) -> int:
    """The smallest multiple of ALIGN >= n (Python int: never wraps)."""
    return -(-n // ALIGN) * ALIGN


def tensor_nbytes(code: int, dims: tuple[int, ...]) -> int:
    """Exact byte size prod(dims) * itemsize in Python int; the only size arithmetic in the package.

    ``code`` must be a key of DTYPES; dims are non-negative ints (bool refused).
    """
    if code not in DTYPES:
        raise BundleFormatError("bad_dtype", f"unknown dtype code {code}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise BundleFormatError("bad_dims", f"dims must be non-negative ints, got {dims!r}")
    return math.prod(dims) * DTYPES[code][1].itemsize


def check_name(name: object) -> bytes:
    """UTF-8 bytes of a valid tensor name: non-empty, <= MAX_NAME_BYTES, no control characters.

    Reserved names (prefix ``__``) are checked by the caller, which knows the section names.
    """
    if not isinstance(name, str) or not name:
        raise BundleFormatError("bad_name", f"tensor name must be a non-empty str, got {name!r:.80}")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        raise BundleFormatError("bad_name", f"tensor name {name!r:.80} is not valid UTF-8") from None
    if len(raw) > MAX_NAME_BYTES:
        raise BundleFormatError("bad_name", f"tensor name is {len(raw)} bytes (cap {MAX_NAME_BYTES})")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise BundleFormatError("bad_name", f"tensor name {name!r:.80} contains a control character")
    return raw
