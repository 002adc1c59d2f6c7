"""A HF checkpoint folder as a lazy weights mapping: tensors memory-mapped, read when used.

``open_checkpoint(dir, layers)`` parses config.json and every shard's safetensors header (never
the data), checks names, shapes, dtypes and the INT4 layout from the headers alone, and returns a
``LazyCheckpoint``: a read-only ``Mapping[str, array]`` under the internal names of
``workbench.weights`` for the model of the chosen layers (renumbered 0..n-1, with embed, final
norm and head), whose values are views of the mapped files. Whatever reads it (the reference, the
engine's upload, the bundle writer) pulls in one tensor at a time, so host memory follows the
tensors in use, not the checkpoint.

Layouts: DeepseekV3 / Kimi-K2 / K2-Thinking (config.json at the top level) and Kimi-K2.5 / K2.6
(``text_config``, tensors prefixed ``language_model.``, the vision tower and projector skipped),
sharded with ``model.safetensors.index.json`` or not; bf16 tensors as ``BF16Array``; INT4
compressed-tensors linears kept packed as ``X.packed`` / ``X.scale`` (``weight_shape`` checked).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array

from ..config import ModelConfig
from ..errors import InputError
from ..weights import expected_shapes, from_hf_name, is_linear_name
from .safetensors import INDEX, MappedFiles, TensorInfo, read_header, shard_files

_LAYER = re.compile(r"model\.layers\.(0|[1-9][0-9]*)\..+")
_FLOAT = ("BF16", "F16", "F32", "F64")
_TABLES = ("embed", "head")


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``"0..4"`` (0, 1, 2, 3: the end excluded, as range()), ``"0,3,5"`` or a mix ``"0,2..4"`` -> sorted
    distinct layer indices in [0, n_layers); InputError otherwise."""
    out: set[int] = set()
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:\.\.\s*([0-9]+)\s*)?", part)
        if m is None:
            raise InputError(f"--layers wants A..B (B excluded) or comma-separated layers, got {text!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo + 1
        if hi <= lo:
            raise InputError(f"--layers: empty range {part.strip()!r} (A..B takes layers A to B-1)")
        out.update(range(lo, hi))
    if max(out) >= n_layers:
        raise InputError(f"--layers: layer {max(out)} outside the checkpoint's {n_layers} layers")
    return sorted(out)


def truncated_config(cfg: ModelConfig, layers: Iterable[int]) -> ModelConfig:
    """The model of ``layers`` (sorted, renumbered 0..n-1): num_hidden_layers n, first_k_dense_replace
    the number of dense layers among them (dense layers come first in the full model, so in this one)."""
    layers = sorted(layers)
    dense = sum(not cfg.is_moe_layer(i) for i in layers)
    return cfg.replace(num_hidden_layers=len(layers), first_k_dense_replace=dense)


class LazyCheckpoint(Mapping):
    """The weights of a checkpoint folder's model (or of its chosen ``layers``), read on access.

    ``cfg`` the (truncated) model's config; ``layers`` the checkpoint's layer behind each of its
    layers; ``info`` as ``hf_checkpoint.load_hf_checkpoint`` reports it; ``reads`` counts accesses per
    key. Values are read-only views of the mapped shards; ``X.scale`` is checked (finite, > 0) when
    read. Pickles as (folder, layers): a worker process reopens it.
    """

    def __init__(self, path: str | Path, layers: Iterable[int] | None = None) -> None:
        from ..hf_checkpoint import VISION_PREFIXES, checkpoint_config
        d = Path(path)
        if not d.is_dir():
            raise InputError(f"{d}: not a checkpoint directory")
        self.path = d
        full, prefix, qcfg, group_sizes = checkpoint_config(d)
        self.full_cfg = full
        self.layers = list(range(full.num_hidden_layers)) if layers is None else sorted(set(layers))
        if not self.layers or min(self.layers) < 0 or max(self.layers) >= full.num_hidden_layers:
            raise InputError(f"layers {self.layers} outside the checkpoint's {full.num_hidden_layers} layers")
        self.cfg = truncated_config(full, self.layers)
        renumber = {old: new for new, old in enumerate(self.layers)}
        self._files = MappedFiles()
        self._entries: dict[str, TensorInfo] = {}
        shapes: dict[str, TensorInfo] = {}
        skipped, vision, seen = [], [], set()
        for f, names in shard_files(d):
            header = read_header(d / f)
            if names is not None and set(header) != names:
                raise InputError(f"{d / f}: tensors do not match {INDEX}")
            for hf, t in header.items():
                if hf in seen:
                    raise InputError(f"{hf} appears in more than one shard")
                seen.add(hf)
                if prefix and hf.startswith(VISION_PREFIXES):
                    vision.append(hf)
                    continue
                if prefix and not hf.startswith(prefix):
                    raise InputError(f"{hf}: a text_config checkpoint names its text tensors {prefix}*")
                name = hf[len(prefix):]
                m = _LAYER.fullmatch(name)
                layer = int(m.group(1)) if m else None
                past = layer is not None and layer >= full.num_hidden_layers
                if name.endswith("rotary_emb.inv_freq") or past:
                    skipped.append(hf)                                   # e.g. DeepSeek-V3's MTP layer
                    continue
                if name.endswith((".weight_zero_point", ".weight_g_idx")):
                    raise InputError(f"{hf}: asymmetric or act-order INT4 is not supported "
                                     "(symmetric group only)")
                shape_of = name.endswith(".weight_shape")
                internal = from_hf_name(name[: -len("shape")] + "packed" if shape_of else name)  # known name
                if layer is not None:
                    if layer not in renumber:
                        continue                                         # a layer not chosen: never read
                    internal = internal.replace(f"layers.{layer}.", f"layers.{renumber[layer]}.", 1)
                if shape_of:
                    shapes[internal[: -len(".packed")]] = t
                else:
                    self._entries[internal] = t
        self._check(shapes, qcfg, group_sizes)
        n_int4 = sum(k.endswith(".packed") for k in self._entries)
        self.info = {"quantization_config": qcfg, "group_sizes": sorted(group_sizes), "int4_linears": n_int4,
                     "skipped": sorted(skipped + vision), "vision_skipped": len(vision)}
        self._keys = list(self._entries)
        self.reads: dict[str, int] = {}

    # ---- checks from the headers ------------------------------------------------------------------
    def _check(self, shapes: dict[str, TensorInfo], qcfg: Any, group_sizes: set[int]) -> None:
        """Names, dtypes and shapes as ``weights.check_weights`` wants them, without reading data (scale
        values are checked on access); weight_shape tensors (16 bytes each) are read and compared."""
        ent, cfg = self._entries, self.cfg
        allowed: set[str] = set()
        for name, shape in expected_shapes(cfg).items():
            allowed.update((name, name + ".packed", name + ".scale"))
            if name in ent:
                t = ent[name]
                if name + ".packed" in ent:
                    raise InputError(f"{name} is present both dense and INT4-packed")
                if t.dtype not in _FLOAT:
                    raise InputError(f"{name} must be a float tensor, got {t.dtype}")
                if t.shape != shape:
                    raise InputError(f"{name} has shape {t.shape}, expected {shape}")
            elif name + ".packed" in ent:
                if not is_linear_name(name):
                    raise InputError(f"{name} is not a linear and cannot be INT4-packed")
                self._check_int4(name, shape, group_sizes, qcfg)
            else:
                raise InputError(f"missing weight tensor {name!r}")
        extra = sorted(k for k in ent if k not in allowed)
        if extra:
            raise InputError(f"unexpected weight tensor {extra[0]!r}"
                             + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""))
        stray = sorted(k[:-6] for k in ent if k.endswith(".scale") and k[:-6] + ".packed" not in ent)
        if stray:
            raise InputError(f"{stray[0]}.scale has no {stray[0]}.packed")
        for name, t in shapes.items():
            if name + ".packed" not in ent:
                raise InputError(f"{t.name}: a weight_shape without its weight_packed")
            a = np.asarray(self._files.tensor(t))
            want = expected_shapes(cfg)[name]
            if a.shape != (2,) or a.dtype.kind not in "iu" or tuple(int(v) for v in a) != want:
                raise InputError(f"{t.name} is {a.tolist()}, expected {list(want)}")

    def _check_int4(self, name: str, shape: tuple[int, ...], group_sizes: set[int], qcfg: Any) -> None:
        n, k = shape
        p, s = self._entries[name + ".packed"], self._entries.get(name + ".scale")
        if qcfg is None:
            raise InputError("checkpoint has INT4 weight_packed tensors but no quantization_config")
        if k % 8 or p.dtype != "I32" or p.shape != (n, k // 8):
            raise InputError(f"{name}.packed must be int32 [{n}, {k // 8}], got {p.dtype} {p.shape}")
        if s is None:
            raise InputError(f"missing weight tensor {name + '.scale'!r}")
        if s.dtype not in _FLOAT or len(s.shape) != 2 or s.shape[0] != n or s.shape[1] < 1 or k % s.shape[1]:
            raise InputError(f"{name}.scale must be float [{n}, K/G] (K={k} a multiple of its columns), "
                             f"got {s.dtype} {s.shape}")
        if k // s.shape[1] not in group_sizes:
            raise InputError(f"{name}: group size {k // s.shape[1]} is not in quantization_config's "
                             f"{sorted(group_sizes)}")

    # ---- the mapping ------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        t = self._entries[key]
        self.reads[key] = self.reads.get(key, 0) + 1
        a = self._files.tensor(t)
        if key.endswith(".scale"):
            s = a.float32() if t.dtype == "BF16" else np.asarray(a)
            if not (np.isfinite(s).all() and (s > 0).all()):
                raise InputError(f"{key}: INT4 scales must be finite and > 0 ({t.name} in {t.file.name})")
        if key in _TABLES:
            return RowTable(a.bits) if t.dtype == "BF16" else a
        return a

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def nbytes(self, key: str) -> int:
        """Stored bytes of one tensor (from its header)."""
        return self._entries[key].nbytes

    def layer_nbytes(self, layer: int) -> int:
        """Stored bytes of one (renumbered) layer's tensors."""
        p = f"layers.{layer}."
        return sum(t.nbytes for k, t in self._entries.items() if k.startswith(p))

    def __reduce__(self):
        return (_reopen, (str(self.path), tuple(self.layers)))


_OPENED: dict[tuple[str, tuple[int, ...]], LazyCheckpoint] = {}


def _reopen(path: str, layers: tuple[int, ...]) -> LazyCheckpoint:
    """One LazyCheckpoint per (folder, layers) per process: a worker parses the headers once."""
    key = (path, layers)
    if key not in _OPENED:
        _OPENED[key] = LazyCheckpoint(path, layers)
    return _OPENED[key]


def open_checkpoint(path: str | Path, layers: Iterable[int] | str | None = None) -> LazyCheckpoint:
    """A checkpoint folder's lazy weights; ``layers``: indices, a ``parse_layers`` string or None (all)."""
    if isinstance(layers, str):
        from ..hf_checkpoint import checkpoint_config
        layers = parse_layers(layers, checkpoint_config(Path(path))[0].num_hidden_layers)
    return LazyCheckpoint(path, layers)


# ---- embed / head: bf16 tables used by rows -----------------------------------------------------------
class RowTable(BF16Array):
    """A bf16 [V, D] table (embed, lm_head) that the reference uses without widening it whole:
    ``take_rows(ids)`` widens the rows asked for, ``matmul_t(x)`` is ``x @ W.T`` in row chunks. Still a
    ``BF16Array`` for everything else (the bundle writer, the engine's upload)."""

    __slots__ = ()
    CHUNK_ROWS = 8192

    def take_rows(self, ids: Any) -> np.ndarray:
        return BF16Array(self.bits[np.asarray(ids, dtype=np.int64)]).float32()           # [S, D]

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        v = self.bits.shape[0]
        out = np.empty((*x.shape[:-1], v), x.dtype)                                     # [..., V]
        for lo in range(0, v, self.CHUNK_ROWS):
            w = BF16Array(self.bits[lo:lo + self.CHUNK_ROWS]).float32()                 # [c, D] exact
            out[..., lo:lo + w.shape[0]] = x @ w.astype(x.dtype, copy=False).T
        return out
