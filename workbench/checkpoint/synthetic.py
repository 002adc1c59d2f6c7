"""Synthetic checkpoints in Kimi-K2.6's exact layout, at any size, random with K2's magnitudes.

For tests and the GPU check of the lazy loader, where the real 595 GB folder is not at hand. The
layout is K2.6's: config.json with the text model under ``text_config`` and ``quantization_config``
at the top level *and* in ``text_config`` (the same dict), every text tensor prefixed
``language_model.``, vision tensors (``vision_tower.*``, ``mm_projector.*``), the routed experts
compressed-tensors INT4 pack-quantized (``weight_packed`` int32, ``weight_scale`` bf16,
``weight_shape`` int32 [2]), the router bias float32, everything else bf16; shards
``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``.

Values (one numpy stream per (seed, tensor name), generated and written one tensor at a time so
memory stays one tensor): bf16 tensors uniform with ``seeded.fp_kind``'s (mean, half-width): unit
embeddings, norms near 1, linears of RMS 1/sqrt(in); INT4 codes uniform on [-7, 7] (no -8, like
Kimi's experts) with group-32 scales around ``seeded.expert_scale_mean``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from numformats.bf16 import bf16

from ..config import ModelConfig
from ..errors import InputError
from ..hf_checkpoint import K2_IGNORE, quantization_config
from ..seeded import EXPERT_GROUP, expert_scale_mean, fp_kind, is_routed_expert
from ..weights import expected_shapes, from_hf_name, to_hf_name
from .safetensors import INDEX

PREFIX = "language_model."
# K2-Thinking's ignore rules under the text prefix, and the vision encoder
IGNORE = ["re:.*vision_tower.*", "re:.*mm_projector.*"] + [
    "re:language_model\\." + r[3:] if r.startswith("re:") else PREFIX + r for r in K2_IGNORE]
VISION = {"vision_tower.patch_embed.proj.weight": (16, 3, 14, 14),
          "vision_tower.encoder.blocks.0.wqkv.weight": (48, 16),
          "mm_projector.proj.0.weight": (64, 64)}
_DT = {"BF16": "<u2", "F32": "<f4", "I32": "<i4"}
Item = tuple[str, str, tuple[int, ...], str]      # HF name, dtype, shape, internal name


def k26_tensors(cfg: ModelConfig) -> list[Item]:
    """(HF name, dtype, shape, internal name or "") of every tensor, in checkpoint order."""
    out = []
    for name, shape in expected_shapes(cfg).items():
        hf = PREFIX + to_hf_name(name)
        if is_routed_expert(name):
            n, k = shape
            out += [(hf + "_packed", "I32", (n, k // 8), name + ".packed"),
                    (hf + "_scale", "BF16", (n, k // EXPERT_GROUP), name + ".scale"),
                    (hf + "_shape", "I32", (2,), "")]
        else:
            out.append((hf, "F32" if name.endswith("gate_bias") else "BF16", shape, name))
    out += [(hf, "BF16", shape, "") for hf, shape in VISION.items()]
    return out


_UNIT = ((2 * np.arange(65536, dtype=np.float32) - 65535) / 65535).astype(np.float32)   # u16 -> [-1, 1]


@lru_cache(maxsize=1)
def _nibbles() -> np.ndarray:
    """16-bit word -> the same word with each zero nibble (q = -8) set to 8 (q = 0)."""
    u = np.arange(65536, dtype=np.uint32)
    out = u.copy()
    for shift in (0, 4, 8, 12):
        out[((u >> shift) & 0xF) == 0] |= np.uint32(8 << shift)
    return out.astype("<u2")


@lru_cache(maxsize=256)
def _bf16_table(m: float, a: float) -> np.ndarray:
    """u16 -> bf16 bits of m + a * unit(u): a tensor's values by one lookup per value."""
    return bf16(np.float32(m) + np.float32(a) * _UNIT).bits.astype("<u2")


@lru_cache(maxsize=4)
def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return expected_shapes(cfg)


def _values(cfg: ModelConfig, seed: int, hf: str, dtype: str, shape: tuple[int, ...],
            name: str) -> Iterator[np.ndarray]:
    """The tensor's values in row blocks of about 64 MB (little-endian arrays, written as they come)."""
    if hf.endswith("_shape"):
        yield np.asarray(_logical(cfg, hf), "<i4")
        return
    if hf.endswith("_packed"):
        table = _nibbles()
    elif hf.endswith("_scale"):                                  # group scales s0 +- 50 %
        s0 = expert_scale_mean(_shapes(cfg)[name[: -len(".scale")]][1])
        table = _bf16_table(s0, 0.5 * s0)
    elif not name:                                               # a vision tensor
        table = _bf16_table(0.0, 0.02)
    else:
        m, a = fp_kind(cfg, name)
        table = None if dtype == "F32" else _bf16_table(m, a)
    rng = np.random.default_rng([seed, zlib.crc32(hf.encode())])
    rows = shape[0] if len(shape) > 1 else 1
    per = int(np.prod(shape)) // rows
    step = max(1, (64 << 20) // (per * 2))
    for lo in range(0, rows, step):
        n = (min(rows, lo + step) - lo) * per
        words = np.frombuffer(rng.bytes(n * (4 if dtype == "I32" else 2)), "<u2")
        if table is None:                                        # the float32 router bias
            yield (np.float32(m) + np.float32(a) * _UNIT[words]).astype("<f4")
        else:
            v = table[words]
            yield v.view("<i4") if dtype == "I32" else v


def _logical(cfg: ModelConfig, hf: str) -> tuple[int, ...]:
    """[N, K] of the INT4 linear whose ``weight_shape`` is ``hf``."""
    return _shapes(cfg)[from_hf_name(hf[len(PREFIX):-len("shape")] + "packed")[: -len(".packed")]]


def _write_shard(path: Path, cfg: ModelConfig, seed: int, items: list[Item]) -> int:
    """One safetensors file of ``items``; returns its data bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for hf, dt, shape, _ in items:
        nbytes = int(np.prod(shape)) * np.dtype(_DT[dt]).itemsize
        header[hf] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for hf, dt, shape, name in items:
            for block in _values(cfg, seed, hf, dt, shape, name):
                f.write(memoryview(np.ascontiguousarray(block)).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    return off


def _nbytes(item: Item) -> int:
    return int(np.prod(item[2])) * np.dtype(_DT[item[1]]).itemsize


def write_k26_checkpoint(path: str | Path, cfg: ModelConfig, seed: int = 0, shards: int = 2,
                         quant_in_text: bool = True, workers: int = 1) -> Path:
    """Write the K2.6-layout checkpoint of ``cfg`` (routed experts INT4, group 32) into new folder ``path``:
    ``shards`` files of about equal size, written by ``workers`` processes; ``quant_in_text``:
    quantization_config also inside text_config, as K2.6 ships it."""
    dest = Path(path)
    if dest.exists():
        raise InputError(f"{dest} exists")
    if cfg.moe_intermediate_size % EXPERT_GROUP or cfg.hidden_size % EXPERT_GROUP:
        raise InputError(f"expert widths must be multiples of {EXPERT_GROUP}")
    items = k26_tensors(cfg)
    target = sum(map(_nbytes, items)) / shards
    groups: list[list[Item]] = [[]]
    size = 0
    for it in items:                                              # in order, a new shard past each target
        if groups[-1] and size >= target * len(groups) and len(groups) < shards:
            groups.append([])
        groups[-1].append(it)
        size += _nbytes(it)
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        jobs = [(tmp / f, cfg, seed, g) for f, g in zip(names, groups, strict=True)]
        if workers > 1:
            with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
                sizes = list(pool.map(_write_shard, *zip(*jobs, strict=True)))
        else:
            sizes = [_write_shard(*j) for j in jobs]
        weight_map = {hf: f for f, g in zip(names, groups, strict=True) for hf, *_ in g}
        index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
        (tmp / INDEX).write_text(json.dumps(index))
        q = quantization_config(EXPERT_GROUP, IGNORE)
        text = {**cfg.to_hf_dict(), "model_type": "kimi_k2", "torch_dtype": "bfloat16"}
        if quant_in_text:
            text["quantization_config"] = q
        conf = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                "text_config": text, "quantization_config": q,
                "vision_config": {"patch_size": 14, "vt_hidden_size": 16},
                "media_placeholder_token_id": 163605}
        (tmp / "config.json").write_text(json.dumps(conf, indent=2))
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
