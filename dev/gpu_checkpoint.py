"""The lazy checkpoint at real size, on an H200: write a Kimi-K2.6-layout checkpoint of K2's dimensions
(dense layer 0, then MoE layers of 384 INT4 experts; random values of K2's magnitudes,
``workbench.checkpoint.synthetic``), then run ``bench k2 --checkpoint`` on it and log the host's memory.

    python3 dev/gpu_checkpoint.py write DIR [--layers 2] [--workers 16]   # ~16 GB for 2 layers
    python3 dev/gpu_checkpoint.py bench DIR OUT [--layers 1,0]

``bench`` times the decode step and one 16-node tree (rows 1 and 17 instead of bench k2's eight row
counts: each row bucket compiles fused_moe anew, and the whole script has four minutes), with the
reference check of every layer, and prints the peak RSS of this process and of its worker processes
beside the checkpoint's and one MoE layer's size.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path


def _status() -> dict[str, float]:
    """This process's VmHWM / RssAnon / RssFile / RssShmem in GiB (a folder on tmpfs maps as shmem)."""
    lines = Path("/proc/self/status").read_text().splitlines()
    st = dict(line.split(":", 1) for line in lines if ":" in line)
    return {k: int(st[k].split()[0]) / 2 ** 20 for k in ("VmHWM", "RssAnon", "RssFile", "RssShmem")}


def write(args) -> int:
    from workbench.checkpoint.synthetic import write_k26_checkpoint
    from workbench.config import preset
    cfg = preset("k2_6").replace(num_hidden_layers=args.layers)
    t = time.perf_counter()
    d = write_k26_checkpoint(args.dir, cfg, seed=0, shards=args.workers, workers=args.workers)
    size = sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))
    print(f"wrote {d}: {cfg.num_hidden_layers} layers of K2.6, {size / 2 ** 30:.1f} GiB in "
          f"{time.perf_counter() - t:.1f} s")
    return 0


def bench(args) -> int:
    from workbench.bench import k2_layer
    from workbench.checkpoint import open_checkpoint
    from workbench.cli import main
    t = time.perf_counter()
    ck = open_checkpoint(args.dir)
    size = sum(ck.nbytes(k) for k in ck)
    moe = max(ck.layer_nbytes(i) for i in range(ck.cfg.num_hidden_layers))
    st = _status()
    print(f"opened {args.dir} lazily in {time.perf_counter() - t:.2f} s: {len(ck)} tensors, "
          f"{size / 2 ** 30:.1f} GiB, largest layer {moe / 2 ** 30:.2f} GiB; host RSS {st['VmHWM']:.2f} GiB")
    k2_layer.ROWS = (1, 17)                       # decode and a 16-node tree: two fused_moe row buckets
    rc = main(["bench", "k2", "--checkpoint", str(args.dir), "--layers", args.layers, "--reps", "10",
               "--context", "1024", "--workers", "16", "--out", str(args.out)])
    st = _status()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20
    mapped = st["RssFile"] + st["RssShmem"]
    print(f"bench k2 --checkpoint rc={rc}; host RSS peak {st['VmHWM']:.2f} GiB in this process (now "
          f"anonymous {st['RssAnon']:.2f}, file-backed {mapped:.2f}), {kids:.2f} GiB in the largest worker; "
          f"checkpoint {size / 2 ** 30:.1f} GiB, largest layer {moe / 2 ** 30:.2f} GiB")
    return rc


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir", type=Path)
    w.add_argument("--layers", type=int, default=2, help="layers: 1 dense + the rest MoE (default 2)")
    w.add_argument("--workers", type=int, default=16)
    b = sub.add_parser("bench")
    b.add_argument("dir", type=Path)
    b.add_argument("out", type=Path)
    b.add_argument("--layers", default="1,0", help="in this order (default 1,0: the MoE layer first)")
    return p.parse_args(argv)


if __name__ == "__main__":
    a = _args(sys.argv[1:])
    sys.exit(write(a) if a.what == "write" else bench(a))
