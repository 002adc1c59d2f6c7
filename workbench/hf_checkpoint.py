"""HF checkpoint folders (config.json + safetensors shards, compressed-tensors INT4) <-> weights dicts.

Names go through ``workbench.weights`` (the one name map). bf16 tensors map to the bundle's
``BF16Array``; INT4 ``weight_packed`` / ``weight_scale`` stay packed, bit for bit. torch and
safetensors are imported on use.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import json_limits
from .config import ModelConfig
from .errors import InputError
from .fileio import with_path
from .weights import (
    check_model_size,
    check_weights,
    expected_shapes,
    from_hf_name,
    is_bf16,
    is_linear_name,
    tensor_shape,
    to_hf_name,
)

# K2-Thinking's ignore list: with exactly the routed experts quantized, these four rules cover the rest.
K2_IGNORE = ["lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*",
             r"re:.*mlp\.(gate|up|gate_up|down)_proj.*"]
_INDEX = "model.safetensors.index.json"
_LABEL = "workbench_model_type"  # the config's own model_type when config.json says deepseek_v3
# Kimi-K2.5 / K2.6 layout: config.json nests the text model under text_config, its tensors carry
# this prefix, and the vision encoder's tensors (skipped: the workbench models text only) these.
TEXT_PREFIX = "language_model."
VISION_PREFIXES = ("vision_tower.", "mm_projector.")
# text_config fields without which the model is unknown (a missing one is never filled by a default)
TEXT_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                 "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace")


def load_hf_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, Any], dict[str, Any]]:
    """Read a DeepseekV3 / Kimi-K2 checkpoint directory -> (cfg, weights, quant_info).

    config.json (model_type deepseek_v3 or kimi_k2; quantization_config validated when present) and
    either ``model.safetensors.index.json`` with its shards or every ``*.safetensors`` file. bf16
    tensors become bundle bfloat16 arrays (float32 if ``workbench.bundle`` is unavailable); INT4
    ``weight_packed`` / ``weight_scale`` stay packed, ``weight_shape`` is checked and dropped. Layers
    past num_hidden_layers (DeepSeek-V3's MTP layer) and ``rotary_emb.inv_freq`` are skipped.
    The Kimi-K2.5 / K2.6 layout is read too: the text model's config under ``text_config`` (every
    TEXT_REQUIRED field present), its tensors prefixed ``language_model.``, the vision tower and
    projector (VISION_PREFIXES) skipped unread; quantization_config at the top level or in text_config.
    quant_info: {"quantization_config": dict | None, "group_sizes": [G...], "int4_linears": n,
    "skipped": [hf names], "vision_skipped": n}.
    """
    d = Path(path)
    if not d.is_dir():
        raise InputError(f"{d}: not a checkpoint directory")
    cfg, prefix, qcfg, group_sizes = checkpoint_config(d)
    vision = (lambda hf: hf.startswith(VISION_PREFIXES)) if prefix else (lambda hf: False)
    check_shards_against_config(d, cfg, prefix, vision)
    tensors, vision_names = _read_safetensors(d, skip=vision)
    weights: dict[str, Any] = {}
    shape_tensors: dict[str, Any] = {}
    skipped = list(vision_names)
    for hf, arr in tensors.items():
        if prefix and not hf.startswith(prefix):
            raise InputError(f"{hf}: a text_config checkpoint names its text tensors {prefix}*")
        name = hf[len(prefix):]
        m = re.match(r"model\.layers\.([0-9]+)\.", name)
        past = m is not None and int(m.group(1)) >= cfg.num_hidden_layers           # e.g. an MTP layer
        if past or name.endswith("rotary_emb.inv_freq"):
            skipped.append(hf)
        elif name.endswith((".weight_zero_point", ".weight_g_idx")):
            raise InputError(f"{hf}: asymmetric or act-order INT4 is not supported (symmetric group only)")
        elif name.endswith(".weight_shape"):
            shape_tensors[from_hf_name(name[: -len("shape")] + "packed")[: -len(".packed")]] = arr
        else:
            weights[from_hf_name(name)] = arr
    check_weights(cfg, weights)
    expected = expected_shapes(cfg)
    packed = [n[: -len(".packed")] for n in weights if n.endswith(".packed")]
    if packed and qcfg is None:
        raise InputError("checkpoint has INT4 weight_packed tensors but no quantization_config")
    for name in packed:
        g = expected[name][1] // tensor_shape(weights[name + ".scale"])[1]
        if g not in group_sizes:
            raise InputError(f"{name}: group size {g} is not in quantization_config's {sorted(group_sizes)}")
    for name, arr in shape_tensors.items():
        if name not in packed:
            raise InputError(f"{to_hf_name(name)}_shape without {to_hf_name(name)}_packed")
        a = np.asarray(arr)
        if a.shape != (2,) or a.dtype.kind not in "iu" or tuple(int(v) for v in a) != expected[name]:
            raise InputError(f"{to_hf_name(name)}_shape is {a.tolist()}, expected {list(expected[name])}")
    info = {"quantization_config": qcfg, "group_sizes": sorted(group_sizes), "int4_linears": len(packed),
            "skipped": sorted(skipped), "vision_skipped": len(vision_names)}
    return cfg, weights, info


def checkpoint_config(d: Path) -> tuple[ModelConfig, str, Any, set[int]]:
    """(the text model's config, its tensors' name prefix, quantization_config or None, its group sizes)
    of checkpoint folder ``d``, from config.json alone."""
    raw = _read_json(d / "config.json")
    text, prefix = _text_config(raw)
    cfg = ModelConfig.from_hf_dict(text)
    if text.get(_LABEL) in ("kimi_k2", "deepseek_v3"):  # written by save_hf_checkpoint, see there
        cfg = cfg.replace(model_type=text[_LABEL])
    qcfg = text.get("quantization_config")
    return cfg, prefix, qcfg, (_parse_quant_config(qcfg) if qcfg is not None else set())


def _text_config(raw: Any) -> tuple[dict[str, Any], str]:
    """(the text model's config dict, the prefix of its tensor names): raw itself and "" for a
    DeepseekV3 / Kimi-K2 config.json; text_config and TEXT_PREFIX for the K2.5 / K2.6 layout."""
    if not isinstance(raw, dict) or "text_config" not in raw:
        return raw, ""
    text = raw["text_config"]
    if not isinstance(text, dict):
        raise InputError("config.json: text_config must be a JSON object")
    missing = [k for k in TEXT_REQUIRED if k not in text]
    if missing:
        raise InputError(f"config.json: text_config lacks {', '.join(missing)}")
    text = {"model_type": "kimi_k2", **text}
    if "quantization_config" in raw:            # K2.6 may carry it in both places: then they must agree
        if "quantization_config" in text and text["quantization_config"] != raw["quantization_config"]:
            raise InputError("config.json: quantization_config differs between the top level and text_config")
        text["quantization_config"] = raw["quantization_config"]
    return text, TEXT_PREFIX


def _read_json(p: Path) -> Any:
    if not p.exists():
        raise InputError(f"{p.parent}: no {p.name}")
    return json_limits.load_file(p, MAX_JSON_BYTES)


# ---- shard validation: headers only, before any tensor data is read ------------------------------
MAX_JSON_BYTES = 64 << 20             # config.json and the index (a K2 index is a few MB)
MAX_HEADER_BYTES = 100 << 20          # safetensors' own cap on the JSON header
MAX_DIM = 2**31 - 1                   # the bundle's cap on every dim
# safetensors dtype -> bytes per element
ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def shard_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} of one safetensors file, validated from its header alone: a regular file
    (a FIFO would hang the reader), header length within the file and the cap, JSON within
    json_limits, known dtypes, dims non-negative ints <= MAX_DIM, and each tensor's byte range equal to
    dtype size x numel, in order, without overlap, inside the file. InputError naming the file otherwise.
    """
    def bad(detail: str) -> InputError:
        return InputError(f"{path}: not a readable safetensors file ({detail})")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise bad(f"cannot open: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad("not a regular file")
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise bad(f"{st.st_size} bytes")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER_BYTES, st.st_size - 8):
            raise bad(f"header length {n} exceeds the file ({st.st_size} bytes) or the cap")
        raw = os.pread(fd, n, 8)
    except OSError as e:
        raise bad(f"cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        header = json_limits.loads(raw, "header")
    except InputError as e:
        raise bad(str(e)) from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    data_bytes = st.st_size - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"tensor {name[:120]!r}"
        if not isinstance(info, dict):
            raise bad(f"{where}: header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in ST_DTYPES:
            raise bad(f"{where}: unknown dtype {dtype!r:.40}")
        if not isinstance(shape, list) or len(shape) > 8 or any(
                isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_DIM for x in shape):
            raise bad(f"{where}: shape {shape!r:.80} (want at most 8 dims, each in [0, {MAX_DIM}])")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in offsets)):
            raise bad(f"{where}: data_offsets {offsets!r:.80} are not two non-negative ints")
        begin, end = offsets
        nbytes = math.prod(shape) * ST_DTYPES[dtype]                 # Python int: never wraps
        if end - begin != nbytes:
            raise bad(f"{where}: data_offsets span {end - begin} bytes, {dtype} {shape} needs "
                      f"{nbytes}")
        if end > data_bytes:
            raise bad(f"{where}: data ends at {end}, past the file's {data_bytes} data bytes")
        ranges.append((begin, end, name))
        out[name] = (dtype, tuple(shape))
    ranges.sort()
    for (_, e0, a), (b1, _, b) in zip(ranges, ranges[1:], strict=False):
        if b1 < e0:
            raise bad(f"tensors {a[:80]!r} and {b[:80]!r} overlap")
    return out


def _available_memory() -> int:
    """Bytes of memory available now (psutil), the bound on what an import may read."""
    import psutil
    return int(psutil.virtual_memory().available)


def _shard_paths(d: Path) -> list[Path]:
    """The shard files: the index's (each a plain name of a regular file) or every *.safetensors."""
    if (d / _INDEX).exists():
        index = _read_json(d / _INDEX)
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise InputError(f"{d / _INDEX}: weight_map missing or malformed")
        names = sorted(set(wm.values()))
        for f in names:
            if Path(f).name != f or not (d / f).is_file():
                raise InputError(f"{d / _INDEX}: shard {f!r} is missing or not a plain file name")
        return [d / f for f in names]
    return sorted(d.glob("*.safetensors"))


def check_shards_against_config(d: Path, cfg: ModelConfig, prefix: str = "",
                                skip: Any = lambda n: False) -> None:
    """Every shard's header validated, and the config's implied tensors against them, before any data
    is read: a tiny config.json declaring 10^9 layers or 2^31 experts fails here within a second, and a
    tensor whose header shape disagrees with the config fails before its (maybe 64 GiB) data is read."""
    headers: dict[str, tuple[str, tuple[int, ...]]] = {}
    for p in _shard_paths(d):
        headers.update(shard_header(p))
    model: dict[str, tuple[int, ...]] = {}
    total = 0                                              # bytes the import will hold in memory
    for hf, (dtype, shape) in headers.items():
        if not skip(hf):
            total += math.prod(shape) * ST_DTYPES[dtype]
        name = hf[len(prefix):] if prefix and hf.startswith(prefix) else hf
        m = re.match(r"model\.layers\.([0-9]+)\.", name)
        if skip(hf) or (m is not None and int(m.group(1)) >= cfg.num_hidden_layers) \
                or name.endswith(("rotary_emb.inv_freq", ".weight_shape")):
            continue
        try:
            model[from_hf_name(name)] = shape
        except InputError:
            continue                     # reported with its name by the reading loop
    check_model_size(cfg, len(model))
    expected = expected_shapes(cfg)
    for name, shape in model.items():
        want = expected.get(name)
        if want is not None and shape != want:
            raise InputError(f"{name} has shape {list(shape)} ({to_hf_name(name)}), config.json implies "
                             f"{list(want)}")
        base = name.rsplit(".", 1)[0] if name.endswith((".packed", ".scale")) else None
        want = expected.get(base) if base else None
        if want is not None and (len(shape) != 2 or shape[0] != want[0]
                                 or (name.endswith(".packed") and shape[1] * 8 != want[1])):
            raise InputError(f"{name} has shape {list(shape)} ({to_hf_name(name)}), config.json implies rows "
                             f"{want[0]}" + (f" and {want[1] // 8} packed columns" if name.endswith(".packed")
                                             else ""))
    free = _available_memory()
    if total > free:
        raise InputError(f"{d}: the checkpoint's tensors take {total / 2**30:.1f} GiB, more than the "
                         f"{free / 2**30:.1f} GiB of memory available")


def _parse_quant_config(q: Any) -> set[int]:
    """Validate a compressed-tensors pack-quantized W4A16 symmetric group config; return its group sizes."""
    def bad(msg: str) -> InputError:
        return InputError(f"unsupported quantization_config: {msg}")
    if not isinstance(q, dict):
        raise bad("not a JSON object")
    if q.get("quant_method") != "compressed-tensors":
        raise bad(f"quant_method {q.get('quant_method')!r} (want 'compressed-tensors')")
    if q.get("format") != "pack-quantized":
        raise bad(f"format {q.get('format')!r} (want 'pack-quantized')")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise bad("config_groups missing or empty")
    sizes = set()
    for gname, g in groups.items():
        w = g.get("weights") if isinstance(g, dict) else None
        if not isinstance(w, dict):
            raise bad(f"{gname} has no weights scheme")
        want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
        for key, val in want.items():
            if w.get(key) != val or isinstance(w.get(key), bool) != isinstance(val, bool):
                raise bad(f"{gname}.weights.{key} = {w.get(key)!r} (want {val!r})")
        gs = w.get("group_size")
        if isinstance(gs, bool) or not isinstance(gs, int) or gs < 1:
            raise bad(f"{gname}.weights.group_size = {gs!r}")
        if w.get("actorder") not in (None, False) or w.get("dynamic") not in (None, False):
            raise bad(f"{gname}: act-order or dynamic quantization")
        if g.get("input_activations") is not None:
            raise bad(f"{gname}: quantized activations (only weight-only W4A16)")
        sizes.add(gs)
    return sizes


def _read_safetensors(d: Path, skip: Any = lambda name: False) -> tuple[dict[str, Any], list[str]]:
    """(hf name -> array for every tensor of the checkpoint (bf16 -> bundle bfloat16 or float32) but
    those ``skip(name)`` picks, the names of those, left unread)."""
    from safetensors import SafetensorError, safe_open
    if (d / _INDEX).exists():
        index = _read_json(d / _INDEX)
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
            raise InputError(f"{d / _INDEX}: weight_map missing or malformed")
        files = sorted(set(wm.values()))
        for f in files:
            if Path(f).name != f or not (d / f).is_file():
                raise InputError(f"{d / _INDEX}: shard {f!r} is missing or not a plain file name")
    else:
        wm = None
        files = sorted(p.name for p in d.glob("*.safetensors"))
        if not files:
            raise InputError(f"{d}: no *.safetensors files")
    out: dict[str, Any] = {}
    skipped: list[str] = []
    for f in files:
        try:
            with safe_open(str(d / f), framework="pt") as st:
                keys = list(st.keys())
                if wm is not None and set(keys) != {k for k, v in wm.items() if v == f}:
                    raise InputError(f"{d / f}: tensors do not match {_INDEX}")
                for k in keys:
                    if k in out or k in skipped:
                        raise InputError(f"{k} appears in more than one shard")
                    if skip(k):
                        skipped.append(k)
                    else:
                        out[k] = _from_torch(st.get_tensor(k), k)
        except (OSError, SafetensorError, RuntimeError, MemoryError) as e:   # RuntimeError: torch's mmap
            raise InputError(f"{d / f}: not a readable safetensors file ({e})") from None
    return out, skipped


def _from_torch(t: Any, name: str) -> Any:
    import torch
    if t.dtype == torch.bfloat16:
        bits = t.view(torch.int16).numpy().view(np.uint16)
        try:
            from .bundle import BF16Array
        except ImportError:  # no bundle module: widen (exactly) to float32
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return BF16Array(bits)
    if t.dtype in (torch.float16, torch.float32, torch.float64, torch.int32, torch.int64):
        return t.numpy()
    raise InputError(f"{name}: unsupported tensor dtype {t.dtype} (dequantize FP8 checkpoints first)")


def _to_torch(a: Any) -> Any:
    import torch
    if is_bf16(a):
        return torch.from_numpy(np.array(a.bits, dtype=np.uint16).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, order="C"))                                 # a private, writable copy


def _dtype_name(a: Any) -> str:
    return "bfloat16" if is_bf16(a) else np.dtype(a.dtype).name


def _ignore_list(fp_modules: list[str], quantized: list[str]) -> list[str]:
    """K2-Thinking-style ignore rules that hit no quantized module, plus any FP linear they miss."""
    def hits(rule: str, module: str) -> bool:
        return re.match(rule[3:], module) is not None if rule.startswith("re:") else rule == module
    rules = [r for r in K2_IGNORE if not any(hits(r, m) for m in quantized)]
    rules += [m for m in fp_modules if not any(hits(r, m) for r in rules)]
    return rules


def quantization_config(group_size: int, ignore: list[str]) -> dict[str, Any]:
    """The compressed-tensors pack-quantized W4A16 symmetric group config (K2-Thinking's layout)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size,
               "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None, "output_activations": None}},
            "ignore": ignore, "kv_cache_scheme": None}


def save_hf_checkpoint(path: str | os.PathLike, cfg: ModelConfig, weights: dict[str, Any],
                       max_shard_bytes: int = 2 ** 30) -> list[str]:
    """Write a checkpoint directory transformers loads; returns the file names written.

    config.json (``cfg.to_hf_dict()``, plus ``quantization_config`` when INT4 tensors exist) and
    safetensors shards of at most max_shard_bytes each (a larger tensor gets its own shard), with
    ``model.safetensors.index.json`` when there is more than one. ``drafter.*`` tensors are left out.
    config.json says model_type deepseek_v3 (what transformers implements) and keeps cfg.model_type in
    ``workbench_model_type``, which load_hf_checkpoint restores. Atomic: everything goes to a temporary
    sibling directory renamed onto ``path``, which must not exist or be an empty directory.
    """
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise InputError(f"max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
    check_weights(cfg, weights)
    dest = Path(path)
    _check_dest(dest)
    tensors: list[tuple[str, Any]] = []  # (hf name, array) in canonical order
    fp_modules, quantized, groups = [], [], set()
    dtype = _dtype_name(weights["embed"])
    for name, shape in expected_shapes(cfg).items():
        if name in weights:
            tensors.append((to_hf_name(name), weights[name]))
            if is_linear_name(name):
                fp_modules.append(to_hf_name(name)[: -len(".weight")])
            continue
        hf = to_hf_name(name)
        scale = weights[name + ".scale"]
        tensors += [(hf + "_packed", weights[name + ".packed"]), (hf + "_scale", _scale_as(scale, dtype)),
                    (hf + "_shape", np.asarray(shape, dtype=np.int64))]
        quantized.append(hf[: -len(".weight")])
        groups.add(shape[1] // tensor_shape(scale)[1])
    config = cfg.to_hf_dict()
    # transformers implements (and converts expert weights for) model_type deepseek_v3 only; a
    # kimi_k2 label would load unfused experts silently, so keep the label in a side key.
    config["model_type"] = "deepseek_v3"
    config[_LABEL] = cfg.model_type
    config["torch_dtype"] = dtype
    if quantized:
        if len(groups) > 1:
            raise InputError(f"INT4 linears use several group sizes {sorted(groups)}; one is supported")
        config["quantization_config"] = quantization_config(groups.pop(), _ignore_list(fp_modules, quantized))
    shards: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for hf, a in tensors:
        nbytes = a.bits.nbytes if is_bf16(a) else a.nbytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((hf, a))
        size += nbytes
    return _write_checkpoint(dest, config, shards)


def _scale_as(scale: Any, dtype: str) -> Any:
    """INT4 scales in the checkpoint's own float format, so transformers dequantizes them without a
    float16 detour: bf16 in a bf16 checkpoint (K2-Thinking's layout) when bf16 holds them exactly,
    float32 (exact) otherwise."""
    from .quant.int4 import scales_to_float32
    if dtype == "bfloat16" and is_bf16(scale):
        return scale
    s32 = scales_to_float32(scale)
    if dtype == "bfloat16":
        from .bundle import bf16
        b = bf16(s32)
        if np.array_equal(b.float32(), s32):
            return b
    return s32


def _check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} exists and is not an empty directory")
    ancestor = next(p for p in dest.absolute().parents if p.exists())  # where the new folders start
    if not ancestor.is_dir():
        raise InputError(f"{dest}: {ancestor} is not a directory")


def _write_checkpoint(dest: Path, config: dict[str, Any], shards: list[list[tuple[str, Any]]]) -> list[str]:
    from safetensors.torch import save_file
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        files = ["config.json"]
        _write_text(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
        n = len(shards)
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            _save_shard(save_file, {hf: _to_torch(a) for hf, a in shard}, tmp / fname, dest / fname)
            _fsync(tmp / fname)
            files.append(fname)
            for hf, a in shard:
                weight_map[hf] = fname
                total += a.bits.nbytes if is_bf16(a) else a.nbytes
        if n > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            _write_text(tmp / _INDEX, json.dumps(index, indent=2) + "\n")
            files.append(_INDEX)
        _fsync(tmp)
        _check_dest(dest)
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
        _fsync(dest.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise with_path(e, dest) from None
        raise
    return files


def _save_shard(save_file: Any, tensors: dict[str, Any], path: Path, shown: Path) -> None:
    """safetensors' save_file with its Rust I/O errors (a full disk) as an OSError naming ``shown``."""
    from safetensors import SafetensorError
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        m = re.search(r"os error (\d+)", str(e))
        if m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code), str(shown)) from None


def _write_text(p: Path, text: str) -> None:
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
