"""python -m workbench import-hf CKPT_DIR OUT.kdtr [--layers 0..N]: a HF DeepseekV3 / Kimi-K2 / K2.6
checkpoint (or the model of some of its layers) -> one bundle.

The folder is opened lazily (``workbench.checkpoint``): tensors are memory-mapped and copied into the
bundle one at a time, so host memory stays about one tensor whatever the checkpoint's size. Tensors
keep their stored form: bf16 stays bfloat16, INT4 compressed-tensors linears stay packed (never
dequantized). The checkpoint's quantization_config and skipped tensors go into the meta; a Kimi
``tiktoken.model`` (with tokenizer_config.json's special tokens) goes with the bundle as its tokenizer.
``--layers`` keeps the chosen layers (renumbered, with embed, final norm and head) and stores the
reference's greedy tokens of that truncated model on a prompt: golden tokens for native engines' tests.
``--drafter DIR`` adds a public DFlash drafter folder (``workbench.dflash_checkpoint``): its tensors as
``drafter.*`` and its config as ``meta["drafter"]``.
"""

from __future__ import annotations

import argparse
from collections import ChainMap
from collections.abc import Mapping
from pathlib import Path

from ..cli import UserError, check_out_file

GOLDEN_PROMPT = "1,17,42,99,7,256,3,128"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt_dir", type=Path, help="checkpoint folder: config.json + *.safetensors (+ index)")
    p.add_argument("out", type=Path, help="bundle file to write (.kdtr)")
    p.add_argument("--layers", default=None,
                   help="keep these layers only: A..B (B excluded), or a comma list such as 0,1,30; "
                        "the bundle then holds the reference's golden tokens of that model (default: all)")
    p.add_argument("--golden", type=int, default=None,
                   help="golden tokens to store (default 32 with --layers, none without)")
    p.add_argument("--prompt", default=GOLDEN_PROMPT, help=f"golden prompt ids (default {GOLDEN_PROMPT})")
    p.add_argument("--drafter", type=Path, default=None, metavar="DFLASH_DIR",
                   help="a DFlash drafter folder (config.json + safetensors) to add as drafter.* "
                        "(default: none)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..bundle import write_bundle
    from ..checkpoint import open_checkpoint
    from ..reference.generate import greedy_generate
    from ..tokenizers import checkpoint_tokenizer

    check_out_file(args.out)
    golden = args.golden if args.golden is not None else (32 if args.layers else 0)
    if golden < 0:
        raise UserError(f"--golden must be >= 0, got {golden}")
    try:
        prompt = [int(t) for t in args.prompt.split(",")]
    except ValueError:
        raise UserError(f"--prompt must be comma-separated token ids, got {args.prompt!r}") from None
    ck = open_checkpoint(args.ckpt_dir, args.layers)
    cfg, info = ck.cfg, ck.info
    meta = {"source": "import-hf", "checkpoint": str(args.ckpt_dir),
            "quantization_config": info["quantization_config"], "int4_linears": info["int4_linears"],
            "skipped_tensors": info["skipped"]}
    if args.layers:
        meta.update(checkpoint_layers=ck.layers, checkpoint_num_hidden_layers=ck.full_cfg.num_hidden_layers)
    tok = checkpoint_tokenizer(args.ckpt_dir)
    if tok is not None:
        if tok.vocab_size > cfg.vocab_size:
            raise UserError(f"{args.ckpt_dir}: tiktoken.model and its specials make {tok.vocab_size} ids, "
                            f"more than the model's vocab_size {cfg.vocab_size}")
        meta["tokenizer"] = tok.meta()
    extra = {}
    if golden:
        g = greedy_generate(cfg, ck, prompt, golden)
        extra = {"prompt": np.asarray(prompt, np.int32), "golden": g.tokens.astype(np.int32),
                 "margins": g.margins.astype(np.float32)}
        meta["golden_reference"] = "float32 numpy reference, greedy (margins: its top-1 minus top-2 logits)"
    tensors: Mapping = Scales16(ck)
    if args.drafter is not None:
        from ..dflash_checkpoint import load_dflash_drafter
        dcfg, drafter = load_dflash_drafter(args.drafter, cfg)
        tensors = ChainMap(drafter, tensors)
        meta.update(drafter=dcfg.to_dict(), drafter_checkpoint=str(args.drafter))
    write_bundle(args.out, config=cfg, tensors=tensors, meta=meta, **extra)
    if info["vision_skipped"]:
        print(f"note: {info['vision_skipped']} vision tensors (vision_tower, mm_projector) skipped: "
              "the bundle holds the text model only")
    kept = f" (layers {_ranges(ck.layers)} of {ck.full_cfg.num_hidden_layers})" if args.layers else ""
    print(f"wrote {args.out}: {cfg.model_type}, {cfg.num_hidden_layers} layers{kept}, {len(ck)} tensors"
          f" ({info['int4_linears']} INT4 linears, {len(info['skipped'])} checkpoint tensors skipped)"
          + (f", {golden} golden tokens" if golden else "") + (f", tokenizer {tok.kind}" if tok else ""))
    return 0


class Scales16(Mapping):
    """The checkpoint's tensors with float32 INT4 scales (a float32 export's) in the 16-bit form a bundle
    stores: bf16 when it holds them exactly, else float16 when that does; InputError otherwise."""

    def __init__(self, weights: Mapping) -> None:
        self.w = weights

    def __getitem__(self, key: str):
        import numpy as np

        from ..bundle import bf16
        a = self.w[key]
        if not key.endswith(".scale") or not isinstance(a, np.ndarray) or a.dtype != np.float32:
            return a
        b = bf16(a)
        if np.array_equal(b.float32(), a):
            return b
        if np.array_equal(a.astype(np.float16).astype(np.float32), a):
            return a.astype(np.float16)
        raise UserError(f"{key}: float32 INT4 scales that neither bf16 nor float16 holds exactly "
                        "(a bundle stores 16-bit scales)")

    def __iter__(self):
        return iter(self.w)

    def __len__(self) -> int:
        return len(self.w)


def _ranges(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0..3,5" (the --layers syntax)."""
    out, start = [], layers[0]
    for a, b in zip(layers, [*layers[1:], None], strict=True):
        if b != a + 1:
            out.append(str(a) if a == start else f"{start}..{a + 1}")
            start = b
    return ",".join(out)
