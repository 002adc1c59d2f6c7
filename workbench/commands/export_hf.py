"""python -m workbench export-hf BUNDLE OUT_DIR: a bundle -> a HF checkpoint folder transformers loads.

Writes config.json (+ quantization_config for INT4 linears) and safetensors shards with an index;
drafter.* tensors are not part of HF checkpoints and are left out. OUT_DIR must not exist or be empty.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import UserError, existing_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=existing_file, help="bundle file (.kdtr)")
    p.add_argument("out_dir", type=Path, help="checkpoint folder to create")
    p.add_argument("--max-shard-mb", type=float, default=1024.0,
                   help="largest safetensors shard in MB")


def run(args: argparse.Namespace) -> int:
    from ..bundle import read_bundle
    from ..hf_checkpoint import save_hf_checkpoint

    if not args.max_shard_mb > 0:
        raise UserError(f"--max-shard-mb must be positive, got {args.max_shard_mb}")
    b = read_bundle(args.bundle, model=True)
    tensors = dict(b.tensors)                            # bf16 stays bf16 (weights() would widen it)
    dropped = sorted(k for k in tensors if k.startswith("drafter."))
    files = save_hf_checkpoint(args.out_dir, b.config, {k: v for k, v in tensors.items() if k not in dropped},
                               max_shard_bytes=max(1, int(args.max_shard_mb * 1e6)))
    print(f"wrote {args.out_dir}: {', '.join(files)}"
          + (f" ({len(dropped)} drafter tensors left out)" if dropped else ""))
    return 0
