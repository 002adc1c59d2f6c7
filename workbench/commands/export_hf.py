"""python -m workbench export-hf BUNDLE OUT_DIR: a bundle -> a HF checkpoint folder transformers loads.

Writes config.json (+ quantization_config for INT4 linears) and safetensors shards with an index;
a drafter (drafter.* tensors with ``meta["drafter"]``) goes to OUT_DIR/drafter/ as a public DFlash
drafter folder (``workbench.dflash_checkpoint``; drafter.* without a config are left out). OUT_DIR must
not exist or be empty.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="bundle file (.kdtr)")
    p.add_argument("out_dir", type=Path, help="checkpoint folder to create")
    p.add_argument("--max-shard-mb", type=float, default=1024.0,
                   help="largest safetensors shard in MB (default 1024)")


def run(args: argparse.Namespace) -> int:
    from ..bundle import read_bundle
    from ..weights import save_hf_checkpoint

    if not args.max_shard_mb > 0:
        raise UserError(f"--max-shard-mb must be positive, got {args.max_shard_mb}")
    b = read_bundle(args.bundle)
    tensors = dict(b.tensors)                            # bf16 stays bf16 (weights() would widen it)
    dropped = sorted(k for k in tensors if k.startswith("drafter."))
    dmeta = b.meta.get("drafter") if isinstance(b.meta, dict) else None
    folder = None
    if dropped and dmeta is not None:                    # checked before anything is written
        from ..dflash_checkpoint import dflash_folder, write_dflash_folder
        folder = dflash_folder(b.config, drafter_config(b.config, dmeta), tensors)
    files = save_hf_checkpoint(args.out_dir, b.config, {k: v for k, v in tensors.items() if k not in dropped},
                               max_shard_bytes=max(1, int(args.max_shard_mb * 1e6)))
    note = f" ({len(dropped)} drafter tensors left out: no meta.drafter)" if dropped and not folder else ""
    print(f"wrote {args.out_dir}: {', '.join(files)}{note}")
    if folder is not None:
        out = args.out_dir / "drafter"
        print(f"wrote {out}: {', '.join(write_dflash_folder(out, folder))}")
    return 0


def drafter_config(cfg, d):
    """The bundle's DrafterConfig (meta.drafter), checked against the target; InputError otherwise."""
    from ..config import ConfigError
    from ..ddtree.config import DrafterConfig
    from ..errors import InputError
    try:
        dcfg = DrafterConfig.from_dict(d)
        dcfg.check_target(cfg)
    except ConfigError as e:
        raise InputError(f"meta.drafter: {e}") from None
    return dcfg
