"""Seeded synthetic weights at any size, generated tensor by tensor (and row block by row block).

One model per (config, seed), built without a weights file, identically on every machine: the
GPU engine uploads it, the numpy reference reads it through ``SeededWeights`` (a lazy mapping that
generates only the tensors it is asked for, so a forward touches only the experts it routes to).

The generator (docs/seeded-weights.md has the full definition):
- a stream per (seed, tensor name, row block of BLOCK_ROWS rows): PCG64 seeded by
  ``SeedSequence([SCHEME, seed, blake2b64(name), block])``; only its raw 64-bit words are used,
  read as little-endian 16-bit words u. Everything after that is integer table lookups built
  once from correctly rounded float32 operations, so no result depends on the CPU or on BLAS.
- every tensor except the routed experts holds bfloat16 values: ``v(u) = bf16(m + a (2u - 65535) / 65535)``,
  uniform on [m - a, m + a], with (m, a) per kind (``fp_kind``) so activations stay O(1).
- routed expert linears are INT4 W4A16, group 32: the words of ``X.packed`` are the stream's 32-bit
  words with every zero nibble (q = -8) replaced by 8 (q = 0), so codes are symmetric in [-7, 7];
  ``X.scale`` comes from the stream of name ``X.scale``: ``f16(s0 (1/2 + u / 65536))``.

Layouts store that model (``LAYOUTS``): ``experts`` (routed experts INT4 with float16 scales, the
rest bf16: Kimi-K2-Thinking's layout), ``mlp`` (also the dense and shared MLPs INT4, quantized from
their bf16 values by ``quantize_int4``), ``bf16`` (everything bf16; experts = bf16 of the dequantized
INT4 weights) and ``fp32`` (everything float32, exact: the INT4 model's weights dequantized).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np

from numformats.bf16 import BF16Array, bf16

from .config import ModelConfig
from .errors import InputError
from .quant.int4 import dequantize_packed, pack_int4, quantize_int4
from .quant.policy import policy_names
from .weights import HEAD_LOGIT_STD, expected_shapes

SCHEME = 1                 # version of the generator; part of every stream's seed
BLOCK_ROWS = 256           # rows per stream: a row range is generated block by block
EXPERT_GROUP = 32          # INT4 group size of the routed experts (K2-Thinking's)
LAYOUTS = ("experts", "mlp", "bf16", "fp32")
_EXPERT = re.compile(r"layers\.(0|[1-9][0-9]*)\.ffn\.experts\.(0|[1-9][0-9]*)\.(w[123])")
_NORMS = ("attn_norm", "ffn_norm", "q_norm", "kv_norm")
# E[q^2] of the codes (0 twice as likely as each other value in [-7, 7]) times E[(1/2 + u)^2]
_CODE_POWER = 17.5 * 13.0 / 12.0


# ---- streams ---------------------------------------------------------------------------------
def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def stream_words(seed: int, name: str, block: int, n: int) -> np.ndarray:
    """The first ``n`` 16-bit words (uint16) of the stream of (seed, name, block)."""
    bg = np.random.PCG64(np.random.SeedSequence([SCHEME, int(seed), _name_key(name), int(block)]))
    raw = np.ascontiguousarray(bg.random_raw(-(-n // 4)), dtype="<u8")
    return raw.view("<u2")[:n]


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


# ---- tables ----------------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _value_table(m: float, a: float) -> np.ndarray:
    """bf16 bits [65536] of v(u) = m + a (2u - 65535) / 65535 (float32 ops, then round to nearest even)."""
    odd = (2 * np.arange(65536, dtype=np.int64) - 65535).astype(np.float32)      # exact
    v = np.float32(m) + np.float32(a / 65535.0) * odd
    t = bf16(v).bits
    t.flags.writeable = False
    return t


@lru_cache(maxsize=1)
def _nibble_table() -> np.ndarray:
    """16-bit word -> the same word with each zero nibble (q = -8) set to 8 (q = 0)."""
    u = np.arange(65536, dtype=np.uint32)
    out = u.copy()
    for shift in (0, 4, 8, 12):
        zero = ((u >> shift) & 0xF) == 0
        out[zero] |= np.uint32(8 << shift)
    t = out.astype("<u2")
    t.flags.writeable = False
    return t


@lru_cache(maxsize=64)
def _scale_table(s0: float) -> np.ndarray:
    """float16 [65536]: s0 (1/2 + u / 65536), mean s0."""
    u = np.arange(65536, dtype=np.float32)
    t = (np.float32(s0) * (np.float32(0.5) + u * np.float32(2.0 ** -16))).astype(np.float16)
    t.flags.writeable = False
    return t


# ---- what each tensor is -----------------------------------------------------------------------
def is_routed_expert(name: str) -> bool:
    return _EXPERT.fullmatch(name) is not None


def fp_kind(cfg: ModelConfig, name: str) -> tuple[float, float]:
    """(m, a) of a bf16 tensor: values uniform on [m - a, m + a].

    embed std 1; lm_head std HEAD_LOGIT_STD / sqrt(D) (logits of std ~3 for a unit-RMS input);
    norms 1 +- 0.1; router bias +- 0.01; every linear (and the router) std 1 / sqrt(in).
    """
    shape = _shape(cfg, name)
    leaf = name.rsplit(".", 1)[-1]
    if name == "embed":
        return 0.0, math.sqrt(3.0)
    if name == "head":
        return 0.0, math.sqrt(3.0) * HEAD_LOGIT_STD / math.sqrt(shape[1])
    if name == "norm" or leaf in _NORMS:
        return 1.0, 0.1
    if leaf == "gate_bias":  # below the gaps between top-k sigmoid scores: nudges, never decides, routing
        return 0.0, 0.01
    return 0.0, math.sqrt(3.0 / shape[1])


def expert_scale_mean(k: int) -> float:
    """s0: the mean group scale of an expert linear with K inputs (weights of RMS 1 / sqrt(K))."""
    return 1.0 / math.sqrt(_CODE_POWER * k)


@lru_cache(maxsize=16)
def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return expected_shapes(cfg)


def _shape(cfg: ModelConfig, name: str) -> tuple[int, ...]:
    try:
        return _shapes(cfg)[name]
    except KeyError:
        raise InputError(f"no tensor {name!r} in this model") from None


def _rows(shape: tuple[int, ...], rows: Any) -> tuple[int, int]:
    n = shape[0] if len(shape) == 2 else 1
    if rows is None:
        return 0, n
    lo, hi, step = rows.indices(n) if isinstance(rows, slice) else (None, None, None)
    if lo is None or step != 1 or hi < lo:
        raise InputError(f"rows must be a contiguous slice, got {rows!r}")
    return lo, hi


def _blocks(seed: int, name: str, lo: int, hi: int, per_row: int, fn) -> np.ndarray:
    """Rows [lo, hi) of a row-blocked stream: row r is words [(r % B) per_row, +per_row) of block r // B,
    mapped by fn (B = BLOCK_ROWS)."""
    parts = []
    for b in range(lo // BLOCK_ROWS, -(-hi // BLOCK_ROWS)):
        b0 = b * BLOCK_ROWS
        r1 = min(hi, b0 + BLOCK_ROWS) - b0                 # a stream's words are a prefix: draw only to r1
        block = fn(stream_words(seed, name, b, r1 * per_row)).reshape(r1, -1)
        parts.append(block[max(lo, b0) - b0:])
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


# ---- the generators (what the engine calls) ------------------------------------------------------
def fp_bits(cfg: ModelConfig, seed: int, name: str, rows: slice | None = None) -> np.ndarray:
    """bf16 bits (uint16) of a tensor that is not a routed expert: [N, K] (rows [lo, hi) if given) or [N].

    ``rows`` (a contiguous slice) lets embed/lm_head ([V, D]) be generated and used in chunks.
    """
    seed = _check_seed(seed)
    if is_routed_expert(name):
        raise InputError(f"{name} is a routed expert: use expert_int4")
    shape = _shape(cfg, name)
    table = _value_table(*fp_kind(cfg, name))
    if len(shape) == 1:
        if rows is not None:
            raise InputError(f"{name} is 1-D: no rows to select")
        return table[stream_words(seed, name, 0, shape[0])]
    lo, hi = _rows(shape, rows)
    return _blocks(seed, name, lo, hi, shape[1], lambda u: table[u])


def expert_int4(cfg: ModelConfig, seed: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A routed expert linear [N, K]: (packed int32 [N, K/8], scale float16 [N, K/32]).

    ``packed`` is in compressed-tensors pack-quantized order (``pack_int4``: q + 8 per nibble, low
    nibble = lowest column), what ``repack_int4`` / ``prepare_moe`` take.
    """
    seed = _check_seed(seed)
    if not is_routed_expert(name):
        raise InputError(f"{name} is not a routed expert linear")
    n, k = _shape(cfg, name)
    if k % EXPERT_GROUP:
        raise InputError(f"{name}: K={k} is not a multiple of the INT4 group size {EXPERT_GROUP}")
    nib = _nibble_table()
    packed = _blocks(seed, name, 0, n, k // 4, lambda u: nib[u].view("<i4"))
    st = _scale_table(expert_scale_mean(k))
    scale = _blocks(seed, name + ".scale", 0, n, k // EXPERT_GROUP, lambda u: st[u])
    return packed.astype(np.int32), scale


def expert_float32(cfg: ModelConfig, seed: int, name: str) -> np.ndarray:
    """The routed expert's weight [N, K] float32: its INT4 codes times their scales (exact)."""
    return dequantize_packed(*expert_int4(cfg, seed, name))


def expert_bf16_bits(cfg: ModelConfig, seed: int, name: str) -> np.ndarray:
    """The routed expert's weight [N, K] in the ``bf16`` layout: bf16 bits (uint16) of ``expert_float32``
    (round to nearest even, as ``numformats.bf16``; in uint32 arithmetic, which these finite values allow)."""
    u = expert_float32(cfg, seed, name).view(np.uint32)
    u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def expert_stack(cfg: ModelConfig, seed: int, layer: int, proj: str, experts: Any = None,
                 workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Routed experts ``experts`` (default all) of ``layer``, projection ``proj`` in w1 / w3 / w2:
    (packed int32 [E, N, K/8], scale float16 [E, N, K/32]), the stacks ``prepare_moe`` takes.

    ``workers`` threads generate experts in parallel (numpy releases the GIL in both steps).
    """
    if proj not in ("w1", "w2", "w3"):
        raise InputError(f"proj must be w1, w2 or w3, got {proj!r}")
    if not cfg.is_moe_layer(layer) or layer >= cfg.num_hidden_layers:
        raise InputError(f"layer {layer} is not a MoE layer")
    ids = range(cfg.n_routed_experts) if experts is None else [int(e) for e in experts]
    names = [f"layers.{layer}.ffn.experts.{e}.{proj}" for e in ids]
    n, k = _shape(cfg, names[0])
    packed = np.empty((len(names), n, k // 8), np.int32)
    scale = np.empty((len(names), n, k // EXPERT_GROUP), np.float16)

    def one(j: int) -> None:
        packed[j], scale[j] = expert_int4(cfg, seed, names[j])
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(len(names))))
    else:
        for j in range(len(names)):
            one(j)
    return packed, scale


# ---- layouts ---------------------------------------------------------------------------------
def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise InputError(f"unknown seeded layout {layout!r} (choose from {', '.join(LAYOUTS)})")


@lru_cache(maxsize=16)
def int4_names(cfg: ModelConfig, layout: str) -> frozenset[str]:
    """The linears ``layout`` stores INT4 (its quantization policy's; none for bf16 / fp32)."""
    _check_layout(layout)
    return frozenset(policy_names(cfg, layout)) if layout in ("experts", "mlp") else frozenset()


def layout_names(cfg: ModelConfig, layout: str) -> list[str]:
    """Every stored tensor name of ``layout`` in checkpoint order (``X.packed``, ``X.scale`` for INT4 X)."""
    q = int4_names(cfg, layout)
    out: list[str] = []
    for name in _shapes(cfg):
        out += [name + ".packed", name + ".scale"] if name in q else [name]
    return out


def stored(cfg: ModelConfig, seed: int, name: str, layout: str) -> dict[str, Any]:
    """The stored form of tensor ``name`` in ``layout``: {name: BF16Array | float32} or, for an INT4
    linear, {name.packed: int32 [N, K/8], name.scale: float16 [N, K/G]} (G = 32)."""
    if name in int4_names(cfg, layout):
        if is_routed_expert(name):
            packed, scale = expert_int4(cfg, seed, name)
        else:  # mlp layout: the dense / shared MLP quantized from its bf16 values
            codes, scale = quantize_int4(BF16Array(fp_bits(cfg, seed, name)).float32(), EXPERT_GROUP)
            packed = pack_int4(codes)
        return {name + ".packed": packed, name + ".scale": scale}
    if is_routed_expert(name):
        return {name: expert_float32(cfg, seed, name) if layout == "fp32"
                else BF16Array(expert_bf16_bits(cfg, seed, name))}
    bits = BF16Array(fp_bits(cfg, seed, name))
    return {name: bits.float32() if layout == "fp32" else bits}


def seeded_weights(cfg: ModelConfig, seed: int, layout: str = "experts") -> dict[str, Any]:
    """The whole model as a plain weights dict (stored forms): for small configs, bundles and tests."""
    out: dict[str, Any] = {}
    for name in _shapes(cfg):
        out.update(stored(cfg, seed, name, layout))
    return out


# ---- the lazy mapping the reference reads --------------------------------------------------------
class RowTable:
    """embed / lm_head [V, D] without a float32 copy: rows generated per BLOCK_ROWS block on demand.

    ``take_rows(ids)`` generates only the blocks holding those rows; ``matmul_t(x)`` is ``x @ W.T``
    over row chunks; with ``keep_bits`` the bf16 bits (2 bytes per value) are kept after first use.
    """

    def __init__(self, cfg: ModelConfig, seed: int, name: str, keep_bits: bool, chunk_rows: int = 8192):
        self.cfg, self.seed, self.name = cfg, seed, name
        self.shape = _shape(cfg, name)
        self.keep_bits, self.chunk_rows = keep_bits, chunk_rows
        self._bits: np.ndarray | None = None
        self.generated_rows = 0

    def _chunk(self, lo: int, hi: int) -> np.ndarray:
        if self._bits is not None:
            return self._bits[lo:hi]
        self.generated_rows += hi - lo
        return fp_bits(self.cfg, self.seed, self.name, slice(lo, hi))

    def take_rows(self, ids: Any) -> np.ndarray:
        """float32 rows [len(ids), D] of ``ids``."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((ids.size, self.shape[1]), np.float32)
        for b in np.unique(ids // BLOCK_ROWS):
            lo = int(b) * BLOCK_ROWS
            block = self._chunk(lo, min(lo + BLOCK_ROWS, self.shape[0]))
            sel = np.nonzero(ids // BLOCK_ROWS == b)[0]
            out[sel] = BF16Array(block[ids[sel] - lo]).float32()
        return out

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        """``x [..., D] @ W.T -> [..., V]`` in x's dtype, one row chunk of W at a time."""
        v = self.shape[0]
        out = np.empty((*x.shape[:-1], v), x.dtype)
        keep = np.empty(self.shape, np.uint16) if self.keep_bits and self._bits is None else None
        wide = np.empty((min(self.chunk_rows, v), self.shape[1]), np.uint32)    # one buffer for every chunk
        for lo in range(0, v, self.chunk_rows):
            hi = min(lo + self.chunk_rows, v)
            bits = self._chunk(lo, hi)
            if keep is not None:
                keep[lo:hi] = bits
            w = np.left_shift(bits, np.uint32(16), out=wide[:hi - lo], dtype=np.uint32).view(np.float32)
            out[..., lo:hi] = x @ w.astype(x.dtype, copy=False).T                # exact bf16 -> float32
        if keep is not None:
            self._bits = keep
        return out

    def float32(self) -> np.ndarray:
        """The whole table in float32 (4 bytes per value: for small configs)."""
        return BF16Array(self._chunk(0, self.shape[0])).float32()


class SeededWeights(Mapping):
    """A read-only weights mapping of the seeded model in ``layout`` that generates on access.

    Keys are ``layout_names(cfg, layout)``. Values are what the reference reads: float32 arrays
    for bf16 / fp32 tensors (bf16 values widened exactly), ``X.packed`` / ``X.scale`` for INT4
    linears, and ``RowTable`` objects for embed and head (never widened whole; head's bf16 bits kept
    after the first forward when ``keep_head_bits``). Every other tensor but the routed experts is
    generated once and kept (a forward reads them all); routed experts go through an LRU cache of at
    most ``expert_cache_bytes``. ``generated`` counts generations per tensor name.
    """

    def __init__(self, cfg: ModelConfig, seed: int, layout: str = "experts",
                 expert_cache_bytes: int = 1 << 30, keep_head_bits: bool = True):
        _check_layout(layout)
        self.cfg, self.seed, self.layout = cfg, _check_seed(seed), layout
        self._names = layout_names(cfg, layout)
        self._keys = frozenset(self._names)
        self._base = {}
        for name in _shapes(cfg):
            for k in ((name + ".packed", name + ".scale") if name in int4_names(cfg, layout) else (name,)):
                self._base[k] = name
        self._tables = {"embed": RowTable(cfg, self.seed, "embed", False),
                        "head": RowTable(cfg, self.seed, "head", keep_head_bits)}
        self.expert_cache_bytes = expert_cache_bytes
        self._kept: dict[str, dict[str, np.ndarray]] = {}
        self._experts: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._expert_bytes = 0
        self.generated: Counter[str] = Counter()

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        if key in self._tables:
            return self._tables[key]
        base = self._base[key]
        hit = self._kept.get(base) or self._experts.get(base)
        if hit is not None:
            if base in self._experts:
                self._experts.move_to_end(base)
            return hit[key]
        parts = {k: _readonly(v.float32() if isinstance(v, BF16Array) else v)
                 for k, v in stored(self.cfg, self.seed, base, self.layout).items()}
        self.generated[base] += 1
        if not is_routed_expert(base):
            self._kept[base] = parts
            return parts[key]
        size = sum(v.nbytes for v in parts.values())
        while self._experts and self._expert_bytes + size > self.expert_cache_bytes:
            _, old = self._experts.popitem(last=False)
            self._expert_bytes -= sum(v.nbytes for v in old.values())
        if size <= self.expert_cache_bytes:
            self._experts[base] = parts
            self._expert_bytes += size
        return parts[key]

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def generated_experts(self, layer: int) -> set[int]:
        """Indices of the routed experts of ``layer`` generated so far."""
        out = set()
        for name in self.generated:
            m = _EXPERT.fullmatch(name)
            if m is not None and int(m.group(1)) == layer:
                out.add(int(m.group(2)))
        return out


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a
