"""The two training runs: the target on the corpus, then the drafter on the target's greedy continuations.

Layout of a run folder OUT:
  corpus_tokens.npz          train / heldout token streams (keyed by manifest and tokenizer hashes)
  target/{ckpt.pt, log.jsonl, report.json}
  drafter/{data.pt, ckpt.pt, log.jsonl, report.json}
Each ckpt.pt holds the modules, optimiser, step and step plan; rerunning a command resumes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError
from ..fileio import atomic_path, write_json_atomic
from ..torchk2.model import TorchTarget, greedy, update_router_bias
from .bodies import body_starts
from .corpus import load_manifest, read_corpus
from .drafter import TorchDrafter, anchor_labels, block_loss
from .humaneval import load_problems
from .loop import LoopConfig, adamw, run_loop, save_checkpoint
from .presets import Size
from .tokenizer import TextTokenizer, encode_documents, load_tokenizer


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available")
    return torch.device(name)


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)


# ---- data ------------------------------------------------------------------------------------
def corpus_tokens(out: Path, tok: TextTokenizer, max_files: int | None, wheels: str | None,
                  manifest_path: str | Path | None = None) -> dict[str, Any]:
    """{"train", "heldout": uint16 streams, "manifest_sha256", "tokenizer_sha256", "files"}, cached in OUT."""
    manifest, msha = load_manifest(manifest_path) if manifest_path else load_manifest()
    key = {"manifest_sha256": msha, "tokenizer_sha256": tok.sha256, "max_files": max_files}
    cache = out / "corpus_tokens.npz"
    if cache.exists():
        z = np.load(cache)
        if json.loads(str(z["key"])) == key:
            return {"train": z["train"], "heldout": z["heldout"], **key}
    streams = {}
    for split in ("train", "heldout"):
        texts = [text for _, text in read_corpus(manifest, wheels, split)]
        streams[split] = encode_documents(tok, texts[:max_files] if max_files else texts)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(cache) as tmp, open(tmp, "wb") as f:   # a file object: savez would append .npz
        np.savez(f, key=json.dumps(key), **streams)
    return {**streams, **key}


def windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """n random windows [n, length] of a token stream (int64)."""
    if stream.size <= length:
        raise InputError(f"token stream of {stream.size} tokens is too short for windows of {length}")
    starts = rng.integers(0, stream.size - length, n)
    return stream[starts[:, None] + np.arange(length)].astype(np.int64)


def windows_ending(stream: np.ndarray, ends: np.ndarray, n: int, length: int,
                   rng: np.random.Generator) -> np.ndarray:
    """n windows [n, length] of a token stream that end just before one of ``ends`` (drawn with
    replacement among those with room for the window)."""
    ok = ends[ends >= length]
    if ok.size == 0:
        raise InputError(f"no function body starts {length}+ tokens into the stream (body prompts)")
    stop = ok[rng.integers(0, ok.size, n)]
    return stream[stop[:, None] - length + np.arange(length)].astype(np.int64)


def fixed_windows(stream: np.ndarray, n: int, length: int) -> np.ndarray:
    """Up to n consecutive non-overlapping windows [k, length] from the start of a stream."""
    k = min(n, (stream.size - 1) // length)
    if k < 1:
        raise InputError(f"held-out stream of {stream.size} tokens is shorter than one window of {length}")
    return stream[:k * length].reshape(k, length).astype(np.int64)


# ---- target ----------------------------------------------------------------------------------
def _no_decay(name: str, p: torch.nn.Parameter) -> bool:
    return p.ndim < 2 or name == "embed"          # the MASK row of embed keeps its init for the drafter


def lm_loss(model: TorchTarget, batch: torch.Tensor, count: bool = False):
    out = model(batch[:, :-1], count_experts=count)
    loss = F.cross_entropy(out.logits.float().flatten(0, 1), batch[:, 1:].flatten())
    return loss, out.counts


@torch.no_grad()
def evaluate_target(model: TorchTarget, device: torch.device, heldout: torch.Tensor,
                    prompts: list[np.ndarray], chunk: int = 16) -> dict[str, Any]:
    """Held-out loss, loss on the HumanEval prompts' own tokens, and the experts' load on held-out text."""
    model.eval()
    losses, counts = [], None
    with _autocast(device):
        for i in range(0, heldout.shape[0], chunk):
            loss, c = lm_loss(model, heldout[i:i + chunk].to(device), count=True)
            losses.append(float(loss))
            c = torch.stack(c).cpu()
            counts = c if counts is None else counts + c
        total, n = 0.0, 0
        for p in prompts:
            t = torch.from_numpy(p)[None].to(device)
            logits = model(t[:, :-1]).logits.float()
            total += float(F.cross_entropy(logits[0], t[0, 1:], reduction="sum"))
            n += t.shape[1] - 1
    model.train()
    load = counts.double() / counts.sum(-1, keepdim=True) * counts.shape[-1]      # 1.0 = perfectly even
    return {"heldout_loss": float(np.mean(losses)), "humaneval_prompt_loss": total / max(n, 1),
            "expert_load": {"max_over_mean": load.max(-1).values.tolist(),
                            "min_over_mean": load.min(-1).values.tolist(),
                            "cv": (load.std(-1) / load.mean(-1)).tolist()},
            "expert_counts": counts.tolist()}


def train_target(out: Path, size: Size, tok: TextTokenizer, device: torch.device, wheels: str | None = None,
                 progress: bool = True) -> dict[str, Any]:
    t_stage = time.time()
    cfg, r = size.target, size.target_recipe
    if cfg.vocab_size != tok.vocab_size:
        raise InputError(f"target vocab {cfg.vocab_size} differs from the tokenizer's {tok.vocab_size}")
    data = corpus_tokens(out, tok, r.max_files, wheels)
    train = torch.from_numpy(data["train"].astype(np.int64)).to(device)
    heldout = torch.from_numpy(fixed_windows(data["heldout"], r.eval_windows, r.seq_len + 1))
    problems = load_problems(wheels)
    prompts = [tok.encode(p.prompt) for p in problems]
    scored = prompts[:r.eval_prompts] if r.eval_prompts else prompts
    torch.manual_seed(r.seed)
    model = TorchTarget(cfg)
    model.init_weights(r.seed)
    model.to(device).train()
    opt = adamw(list(model.named_parameters()), r.lr, r.weight_decay, _no_decay)
    tdir = out / "target"
    span = torch.arange(r.seq_len + 1, device=device)

    def step_fn(step: int) -> dict[str, float]:
        rng = np.random.default_rng([r.seed, step])
        starts = torch.from_numpy(rng.integers(0, train.numel() - r.seq_len - 1, r.batch)).to(device)
        batch = train[starts[:, None] + span]                                         # [B, T+1]
        with _autocast(device):
            loss, counts = lm_loss(model, batch, count=True)
        loss.backward()
        update_router_bias(model, counts, r.bias_rate)
        return {"loss": float(loss.detach()), "tokens": r.batch * r.seq_len}

    loop = LoopConfig(r.max_steps, r.minutes, r.lr, r.min_lr_ratio, r.warmup, r.clip, r.log_every,
                      r.eval_every, r.ckpt_seconds)
    t0 = time.time()
    res = run_loop("target", tdir, {"model": model}, opt, loop, step_fn,
                   lambda: evaluate_target(model, device, heldout, scored), progress=progress,
                   started=t_stage)
    completions = []
    model.eval()
    for p, ids in list(zip(problems, prompts, strict=True))[:r.n_completions]:
        got = greedy(model, torch.from_numpy(ids)[None].to(device), r.completion_tokens, torch.float32)[0]
        completions.append({"task_id": p.task_id, "completion": tok.decode(got.tolist())})
    report = {"config": cfg.to_dict(), "recipe": asdict(r), "steps": res["steps"],
              "final_train_loss": res["last"].get("loss"), "eval": res["eval"], "completions": completions,
              "train_tokens": int(data["train"].size), "heldout_tokens": int(data["heldout"].size),
              "manifest_sha256": data["manifest_sha256"], "tokenizer_sha256": data["tokenizer_sha256"],
              "device": str(device), "torch": torch.__version__, "seconds": time.time() - t0}
    write_json_atomic(tdir / "report.json", report)
    return report


def load_target(out: Path, size: Size, device: torch.device) -> TorchTarget:
    ckpt = out / "target" / "ckpt.pt"
    if not ckpt.exists():
        raise InputError(f"no trained target in {out} (run 'train target --out {out}' first)")
    model = TorchTarget(size.target)
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["modules"]["model"])
    return model.to(device).eval().requires_grad_(False)


# ---- drafter ----------------------------------------------------------------------------------
@torch.no_grad()
def continuations(model: TorchTarget, stream: np.ndarray, n: int, prompt_lens: tuple[int, ...], length: int,
                  batch: int, seed: int, device: torch.device, bodies: np.ndarray | None = None,
                  body_fraction: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n sequences of ``length`` tokens: corpus prompts continued greedily by the target in float32.
    Prompts come in groups of ``batch``; a ``body_fraction`` of the groups are windows ending where a
    function body starts (``bodies``, see workbench.train.bodies), the others random windows; each kind
    cycles through ``prompt_lens`` group by group. Returns tokens [n, length], the prompt lengths [n]
    and whether each prompt is a body prompt [n] (bool)."""
    rng = np.random.default_rng(seed)
    toks, plens, kinds = [], [], []
    counts = [0, 0]                                                  # groups made of each kind so far
    for g, i in enumerate(range(0, n, batch)):
        body = int((g + 1) * body_fraction) > int(g * body_fraction)
        p = int(prompt_lens[counts[body] % len(prompt_lens)])
        counts[body] += 1
        m = min(batch, n - i)
        w = windows_ending(stream, bodies, m, p, rng) if body else windows(stream, m, p, rng)
        prompts = torch.from_numpy(w).to(device)
        toks.append(torch.cat([prompts, greedy(model, prompts, length - p, torch.float32)], 1).cpu())
        plens += [p] * m
        kinds += [body] * m
    return torch.cat(toks), torch.tensor(plens), torch.tensor(kinds)


def features(model: TorchTarget, tokens: torch.Tensor, taps: tuple[int, ...]) -> torch.Tensor:
    """Tapped target features [B, T, F*D] (float32, no grad), concatenated in ``taps`` order."""
    with torch.no_grad():
        hidden = model(tokens, capture=taps).hidden
    return torch.cat([hidden[k] for k in taps], dim=-1).float()


def draw_anchors(prompt_lens: torch.Tensor, length: int, n_drafted: int, n: int,
                 rng: np.random.Generator) -> torch.Tensor:
    """n anchors per sequence [B, n], uniform over the generated part [prompt_len, length - n_drafted)."""
    lo = prompt_lens.numpy()
    hi = length - n_drafted
    if (lo >= hi).any():
        raise InputError(f"no room for a block of {n_drafted + 1} after the prompt in sequences of {length}")
    return torch.from_numpy(lo[:, None] + (rng.random((lo.size, n)) * (hi - lo)[:, None]).astype(np.int64))


@torch.no_grad()
def evaluate_drafter(drafter: TorchDrafter, target: TorchTarget, toks: torch.Tensor, plens: torch.Tensor,
                     device: torch.device, kinds: torch.Tensor | None = None, stride: int = 4,
                     chunk: int = 4) -> dict[str, Any]:
    """Top-1 accuracy per drafted position and the chain's mean accepted length (bonus included), over
    anchors every ``stride`` positions of the generated part of the evaluation sequences; with
    ``kinds`` (body prompt or not, per sequence) also the chain's length per prompt kind."""
    drafter.eval()
    dc = drafter.dcfg
    t = toks.shape[1]
    hits, runs, seq_of = [], [], []
    for i in range(0, toks.shape[0], chunk):
        tk, pl = toks[i:i + chunk].to(device), plens[i:i + chunk]
        n = (t - dc.n_drafted - int(pl.max()) + stride - 1) // stride
        anchors = (pl[:, None] + stride * torch.arange(n)).clamp(max=t - dc.n_drafted - 1).to(device)
        with _autocast(device):
            logits = drafter(target, tk, features(target, tk, dc.target_layer_ids), anchors)
        ok = (logits.argmax(-1) == anchor_labels(tk, anchors, dc.n_drafted)).flatten(0, 1).cpu()   # [B*A, L]
        hits.append(ok.double())
        runs.append(1 + ok.int().cumprod(-1).sum(-1).double())
        seq_of.append((i + torch.arange(tk.shape[0])).repeat_interleave(n))
    drafter.train()
    runs_all = torch.cat(runs)
    res = {"top1_by_position": torch.cat(hits).mean(0).tolist(), "chain_accepted_len": float(runs_all.mean())}
    if kinds is not None:
        body = kinds[torch.cat(seq_of)]
        res["chain_accepted_len_by_prompt"] = {k: float(runs_all[m].mean()) for k, m in
                                               (("window", ~body), ("body", body)) if m.any()}
    return res


def train_drafter(out: Path, size: Size, device: torch.device, progress: bool = True) -> dict[str, Any]:
    t_stage = time.time()
    cfg, dcfg, r = size.target, size.drafter, size.drafter_recipe
    target = load_target(out, size, device)
    ddir = out / "drafter"
    ddir.mkdir(parents=True, exist_ok=True)
    data_path = ddir / "data.pt"
    length = max(r.prompt_lens) + r.new_tokens
    if data_path.exists():
        data = torch.load(data_path, weights_only=False)
    else:
        streams = np.load(out / "corpus_tokens.npz")
        tok = load_tokenizer()
        t0 = time.time()
        data = {}
        for part, split, n, batch, seed in (("train", "train", r.n_seqs, r.gen_batch, r.seed),
                                            ("eval", "heldout", r.n_eval_seqs,
                                             max(1, r.n_eval_seqs // (2 * len(r.prompt_lens))), r.seed + 1)):
            stream = streams[split]
            bodies = body_starts(stream, tok) if r.body_fraction else None
            data[part] = continuations(target, stream, n, r.prompt_lens, length, batch, seed, device, bodies,
                                       r.body_fraction)
        data["seconds"] = time.time() - t0
        save_checkpoint(data_path, data)
    toks, plens, _ = data["train"]
    toks = toks.to(device)
    torch.manual_seed(r.seed)
    drafter = TorchDrafter(cfg, dcfg)
    drafter.init_weights(r.seed)
    drafter.to(device).train()
    opt = adamw(list(drafter.named_parameters()), r.lr, r.weight_decay, lambda n, p: p.ndim < 2)

    def step_fn(step: int) -> dict[str, float]:
        rng = np.random.default_rng([r.seed, step])
        idx = torch.from_numpy(rng.integers(0, toks.shape[0], r.batch))
        tk = toks[idx.to(device)]
        anchors = draw_anchors(plens[idx], length, dcfg.n_drafted, r.anchors, rng).to(device)
        feats = features(target, tk, dcfg.target_layer_ids)
        with _autocast(device):
            logits = drafter(target, tk, feats, anchors)
        loss = block_loss(logits, anchor_labels(tk, anchors, dcfg.n_drafted), r.gamma)
        loss.backward()
        return {"loss": float(loss.detach()), "blocks": r.batch * r.anchors}

    etoks, eplens, ekinds = data["eval"]
    loop = LoopConfig(r.max_steps, r.minutes, r.lr, r.min_lr_ratio, r.warmup, r.clip, r.log_every,
                      r.eval_every, r.ckpt_seconds)
    t0 = time.time()
    res = run_loop("drafter", ddir, {"drafter": drafter}, opt, loop, step_fn,
                   lambda: evaluate_drafter(drafter, target, etoks, eplens, device, ekinds),
                   progress=progress, started=t_stage)
    report = {"drafter": dcfg.to_dict(), "recipe": asdict(r), "steps": res["steps"],
              "final_train_loss": res["last"].get("loss"), "eval": res["eval"],
              "train_sequences": int(toks.shape[0]), "sequence_length": length,
              "generation_seconds": data["seconds"], "device": str(device), "torch": torch.__version__,
              "seconds": time.time() - t0}
    write_json_atomic(ddir / "report.json", report)
    return report


def load_drafter(out: Path, size: Size) -> TorchDrafter:
    ckpt = out / "drafter" / "ckpt.pt"
    if not ckpt.exists():
        raise InputError(f"no trained drafter in {out} (run 'train drafter --out {out}' first)")
    d = TorchDrafter(size.target, size.drafter)
    d.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["modules"]["drafter"])
    return d.eval()
