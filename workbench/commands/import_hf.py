"""python -m workbench import-hf CKPT_DIR OUT.kdtr: a HF DeepseekV3 / Kimi-K2 / K2.6 checkpoint -> one bundle.

Tensors keep their stored form: bf16 stays bfloat16, INT4 compressed-tensors linears stay packed
(never dequantized). The checkpoint's quantization_config and skipped tensors go into the meta.
``--drafter DIR`` adds a public DFlash drafter folder (``workbench.dflash_checkpoint``): its tensors as
``drafter.*`` and its config as ``meta["drafter"]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import check_out_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt_dir", type=Path, help="checkpoint folder: config.json + *.safetensors (+ index)")
    p.add_argument("out", type=Path, help="bundle file to write (.kdtr)")
    p.add_argument("--drafter", type=Path, default=None, metavar="DFLASH_DIR",
                   help="a DFlash drafter folder (config.json + safetensors) to add as drafter.*")


def run(args: argparse.Namespace) -> int:
    from ..bundle import write_bundle
    from ..weights import load_hf_checkpoint

    check_out_file(args.out)
    cfg, weights, info = load_hf_checkpoint(args.ckpt_dir)
    meta = {"source": "import-hf", "checkpoint": str(args.ckpt_dir),
            "quantization_config": info["quantization_config"], "int4_linears": info["int4_linears"],
            "skipped_tensors": info["skipped"]}
    if args.drafter is not None:
        from ..dflash_checkpoint import load_dflash_drafter
        dcfg, drafter = load_dflash_drafter(args.drafter, cfg)
        weights.update(drafter)
        meta.update(drafter=dcfg.to_dict(), drafter_checkpoint=str(args.drafter))
    write_bundle(args.out, config=cfg, tensors=weights, meta=meta)
    if info["vision_skipped"]:
        print(f"note: {info['vision_skipped']} vision tensors (vision_tower, mm_projector) skipped: "
              "the bundle holds the text model only")
    print(f"wrote {args.out}: {cfg.model_type}, {cfg.num_hidden_layers} layers, {len(weights)} tensors"
          f" ({info['int4_linears']} INT4 linears, {len(info['skipped'])} checkpoint tensors skipped)")
    return 0
