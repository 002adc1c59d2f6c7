"""safetensors files without reading them: the header parsed here, the data memory-mapped.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, offsets
relative to the first byte after the header), then the tensors' bytes, little-endian, C order.
``tensor`` hands out a read-only view of the mapped file: nothing is read until the view is used.
bf16 tensors come out as the bundle's ``BF16Array`` over their uint16 bits.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array

from ..errors import InputError

# safetensors dtype name -> numpy little-endian dtype (BF16 as its uint16 bits)
DTYPES = {"BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8"}
MAX_HEADER = 256 << 20          # larger headers are damage, not checkpoints (K2.6's are ~ 2 MB)
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    name: str
    dtype: str                  # a DTYPES key
    shape: tuple[int, ...]
    start: int                  # absolute byte offsets in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def shard_files(d: Path) -> list[tuple[str, set[str] | None]]:
    """(file name, the tensor names the index puts there, or None without an index) for every
    safetensors shard of checkpoint folder ``d``: the index's shards, else every ``*.safetensors``."""
    if not (d / INDEX).is_file():
        files = sorted(p.name for p in d.glob("*.safetensors"))
        if not files:
            raise InputError(f"{d}: no *.safetensors files")
        return [(f, None) for f in files]
    from ..hf_checkpoint import _read_json
    index = _read_json(d / INDEX)                       # within the JSON size, depth and number limits
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        raise InputError(f"{d / INDEX}: weight_map missing or malformed")
    out: dict[str, set[str]] = {}
    for name, f in wm.items():
        out.setdefault(f, set()).add(name)
    for f in out:
        if Path(f).name != f or not (d / f).is_file():
            raise InputError(f"{d / INDEX}: shard {f!r} is missing or not a plain file name")
    return sorted(out.items())


def read_header(path: Path) -> dict[str, TensorInfo]:
    """name -> TensorInfo of every tensor in one file; InputError for a damaged or unsupported file (first
    ``hf_checkpoint.shard_header``'s checks: a regular file, JSON limits, dims, non-overlapping ranges)."""
    from ..hf_checkpoint import shard_header
    shard_header(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise InputError(f"{path}: not a safetensors file (header length {n}, file {size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise InputError(f"{path}: not readable ({e.strerror})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: safetensors header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is not a JSON object")
    base = 8 + n
    out: dict[str, TensorInfo] = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        out[name] = _info(path, name, t, base, size)
    return out


def _info(path: Path, name: str, t: Any, base: int, size: int) -> TensorInfo:
    if not isinstance(t, dict) or not {"dtype", "shape", "data_offsets"} <= t.keys():
        raise InputError(f"{path}: tensor {name!r} has no dtype / shape / data_offsets")
    dtype, shape, offs = t["dtype"], t["shape"], t["data_offsets"]
    if dtype not in DTYPES:
        raise InputError(f"{name}: unsupported tensor dtype {dtype} (dequantize FP8 checkpoints first)")
    def ints(v: Any) -> bool:
        return isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)
    ok = ints(shape) and ints(offs) and len(offs) == 2
    if not ok:
        raise InputError(f"{path}: tensor {name!r} has a malformed shape or data_offsets")
    begin, end = offs
    want = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
    if not 0 <= begin <= end or end - begin != want or base + end > size:
        raise InputError(f"{path}: tensor {name!r} data_offsets {offs} do not hold {dtype} {shape} "
                         f"inside the file")
    return TensorInfo(path, name, dtype, tuple(shape), base + begin, base + end)


class MappedFiles:
    """One read-only memory map per file, opened on first use."""

    def __init__(self) -> None:
        self._maps: dict[Path, np.memmap] = {}

    def tensor(self, info: TensorInfo) -> Any:
        """A read-only view of the tensor's bytes (BF16Array for BF16): pages are read when touched."""
        mm = self._maps.get(info.file)
        if mm is None:
            mm = self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
        a = mm[info.start:info.end].view(DTYPES[info.dtype]).reshape(info.shape)
        a = a.view(np.ndarray)                           # a plain view: the map stays open through its base
        return BF16Array(a) if info.dtype == "BF16" else a
