"""One DDTree generation's state on the engine and its round steps, named as in the reference loop
(``workbench.ddtree.speculative``): draft, build_tree, verify, walk, commit.

Legend: P prompt length, V vocabulary, L drafted positions, B max budget, K = min(B, V) candidates per
position, N <= B tree nodes verified (root not counted), A accepted nodes (root included), T engine
rows (max_rows), W control-block width, F tapped layers, D model width.

``EngineSpecState(...)`` allocates every buffer, captures the verify steps and prefills the prompt, so
the state is complete when the first round starts. The tree lives in the host control block ``ctl``
(int32 [5, W], layout in kernels_numba/tree.py): the heap writes rows 0-2, ``verify`` adds the bonus,
the previous round's accepted path and the scalars, and uploads it once. A cost-aware budget cuts the
heap's tree to a prefix of its pop order (only N changes) and runs the verify step captured for the
smallest size >= N. The reference's commit (KV gather of the accepted rows) is split: ``commit`` does
the host bookkeeping, and the next round's verify step compacts the latent cache on the device before
it writes the new tree's rows. With a ``clock`` dict the timed steps add their host wall time to it.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from kernels_numba import ops
from kernels_numba.device import Mirror, head_rows, host_buffer, to_device, zeros

from ..ddtree.budget import TreeBudget
from ..ddtree.config import SamplingParams
from ..ddtree.dflash import DFlashDrafter
from ..ddtree.drafter import Drafter
from ..ddtree.oracle import OracleDrafter, oracle_logits
from ..ddtree.sampling import make_rng, sample_tokens
from ..ddtree.speculative import RoundStats, features
from .dflash import device_dflash_for, device_dflash_supported
from .runtime import Engine
from .tree_host import build_tree_host, walk_host

PHASES = ("draft_s", "build_s", "verify_s")        # the timed steps' clock keys


def timed(phase: str):
    """Add the step's host wall time to ``self.clock[phase]`` when the state has a clock."""
    def wrap(step):
        @functools.wraps(step)
        def run(self, *args):
            if self.clock is None:
                return step(self, *args)
            t0 = time.perf_counter()
            out = step(self, *args)
            self.clock[phase] += time.perf_counter() - t0
            return out
        return run
    return wrap


class EngineSpecState:
    """Everything the rounds of one generation read and write (the reference ``SpecState``, on the engine).

    As in the reference (a host drafter's ``propose`` is handed this object): start, the position of
    the bonus token (not yet committed); bonus; tokens, the generated ids (the bonus included);
    new_features [n, F*D], the tapped features of positions start-n .. start-1 the host drafter has
    not seen (empty without a host drafter); rounds. The latent cache is the engine's.
    new_rows [n]: the tap-buffer rows the device drafter has not read (the prompt, then the accepted
    nodes). prev_accepted [A], prev_start: the last round's accepted node indices and bonus position,
    which the next verify step's KV compaction keeps. steps: the verify step per size of ``budget.sizes``.
    prompt [P]: prefilled here. device_drafter: as in ``engine_ddtree_generate``. clock: None, or a dict
    the timed steps add to (keys PHASES). The caller has checked that the engine taps ``drafter.capture``
    and fits the request.
    """

    def __init__(self, engine: Engine, drafter: Drafter, budget: TreeBudget, sampling: SamplingParams,
                 prompt: np.ndarray, device_drafter: bool = True, clock: dict | None = None) -> None:
        cfg, buf = engine.cfg, engine.buf
        self.engine, self.drafter, self.budget, self.sampling = engine, drafter, budget, sampling
        self.clock = clock
        self.n_pos = n_pos = drafter.block_size - 1                          # L
        b = budget.max_nodes                                                  # B
        self.k = k = min(b, cfg.vocab_size)                                   # K
        self.tap_idx = [engine.taps.index(t) for t in drafter.capture]       # tap-buffer index per layer read
        self.lpk = Mirror(zeros((2, n_pos, k), np.float64))                   # [2, L, K] top-k log-probs, ids
        self.ctl_m = Mirror(buf.ctl)                                          # [5, W] control block
        self.ctl = self.ctl_m.host
        self.post = Mirror(buf.amax)                                          # [T] target's token per node
        self.ids_h = np.zeros((n_pos, k), np.int32)                           # [L, K] top-k token ids
        self.scores = np.zeros(b + 1, np.float64)                             # [B+1] log q(path), root 0
        self.device = None                                                    # the device dflash drafter
        if device_drafter and isinstance(drafter, DFlashDrafter) and \
                device_dflash_supported(drafter.weights, drafter.dcfg):
            self.device = device_dflash_for(engine, drafter.weights, drafter.dcfg)   # captured before timing
            self.tap_idx = []                                                 # no tapped feature to the host
        self.feats_h = host_buffer(buf.feats.shape, np.float32) if self.tap_idx else None   # [F, T, D]
        if self.device is not None:
            self.table = self.device.logits                                   # [L, V], written in place
        elif isinstance(drafter, OracleDrafter):                              # [S + L + 1, V], row = position
            self.table = oracle_table(engine, drafter, buf.max_len + n_pos + 1)
        else:
            self.table = zeros((n_pos, cfg.vocab_size), np.float32)          # [L, V], uploaded per round
        self.ctl[...] = 0
        self.acc = np.zeros(n_pos + 2, np.int32)                              # the walk's accepted nodes
        self.rng = make_rng(sampling)
        # the verify steps are captured first: a capture's warm-up run overwrites what a prefill leaves
        self.steps = {s: engine.verify_step(s) for s in budget.sizes}
        self.step_for = [min(s for s in budget.sizes if s >= n) for n in range(b + 1)]   # N -> size
        first, feats = self._prefill(prompt)
        p = len(prompt)
        self.start, self.bonus, self.tokens, self.rounds = p, first, [first], []
        self.new_features = features(feats, self.tap_idx, np.arange(p))      # [P, F*D]
        self.new_rows = np.arange(p, dtype=np.int32)
        self.prev_accepted, self.prev_start = np.zeros(0, np.int32), 0

    def _prefill(self, toks: np.ndarray) -> tuple[int, np.ndarray | None]:
        """Prefill the prompt [P]: the first token (the first bonus) and the tap buffer [F, T, D] (the
        reference's {layer: hidden}, indexed by tap_idx) when a host drafter reads it."""
        eng, p = self.engine, len(toks)
        eng.prefill(toks)
        if self.sampling.greedy:
            first = int(eng.fetch(eng.buf.amax)[p - 1])
        else:
            first = int(sample_tokens(eng.fetch(eng.buf.logits)[p - 1:p], self.sampling, self.rng)[0])
        return first, (eng.fetch(eng.buf.feats) if self.tap_idx else None)

    @timed("draft_s")
    def draft(self) -> None:
        """Draft logits for positions start+1 .. start+L -> per-position top-k on the device -> the
        [2, L, K] table copied back into ``lpk.host``."""
        eng = self.engine
        row0 = 0
        if self.device is not None:
            self.device.propose(self.bonus, self.start, self.new_rows, self.new_rows.size)
        elif isinstance(self.drafter, OracleDrafter):
            row0 = self.start + 1
        else:
            eng.put(self.table, np.asarray(self.drafter.propose(self), np.float32))    # [L, V]
        ops.topk_logprobs(self.lpk.dev, self.table, row0, self.k, self.n_pos, eng.stream)
        self.lpk.pull()
        eng.sync()

    @timed("build_s")
    def build_tree(self) -> int:
        """The best-first heap over the top-k table, into ctl rows 0-2 (root token left out), cut to the
        budget's choice (a cost-aware heap stops once no larger tree can win); returns N (the tree is
        ctl's first N + 1 columns)."""
        lpk = self.lpk.host
        np.copyto(self.ids_h, lpk[1], casting="unsafe")                      # token ids (exact in float64)
        return build_tree_host(lpk[0], self.ids_h, self.budget.max_nodes, self.n_pos, self.ctl, self.scores,
                               *self.budget.host_cost)

    @timed("verify_s")
    def verify(self, n: int) -> np.ndarray:
        """Upload the control block, run the verify step of the smallest captured size >= N (KV compaction
        of the previous round, tree compile, ONE forward over root + N nodes) and return the target's
        token per node [N+1]: the device's argmax at T = 0; at T > 0, N + 1 draws in node order from the
        copied-back logits."""
        eng, ctl, prev = self.engine, self.ctl, self.prev_accepted
        ctl[0, 0] = self.bonus
        ctl[3, :prev.size] = prev
        ctl[4, :4] = (self.start, prev.size, self.prev_start, n + 1)
        self.ctl_m.push()
        self.steps[self.step_for[n]].run(eng.stream)
        if self.sampling.greedy:
            self.post.pull()
            eng.sync()
            return self.post.host[:n + 1]
        return sample_tokens(eng.fetch(head_rows(eng.buf.logits, n + 1)), self.sampling, self.rng)

    def walk(self, n: int, post: np.ndarray) -> tuple[np.ndarray, int]:
        """The accepted node indices [A] (root first) and the bonus token."""
        count, bonus = walk_host(self.ctl, n, post, self.acc)
        return self.acc[:count].copy(), int(bonus)

    def commit(self, n: int, accepted: np.ndarray, bonus: int) -> None:
        """Append the accepted tokens and the bonus, queue the accepted nodes' features (host drafter) or
        tap rows (device drafter), record the round and move to the bonus."""
        eng, ctl = self.engine, self.ctl
        feats = eng.fetch_into(eng.buf.feats, self.feats_h) if self.tap_idx else None     # [F, T, D]
        self.tokens.extend(int(ctl[0, i]) for i in accepted[1:])
        self.tokens.append(bonus)
        self.rounds.append(RoundStats(tree_size=int(n), accepted_len=accepted.size,
                                      depth=int(ctl[1, 1:n + 1].max()) if n else 0))
        self.new_features = features(feats, self.tap_idx, accepted)          # [A, F*D]
        self.new_rows = self.prev_accepted = accepted
        self.prev_start = self.start
        self.start += accepted.size
        self.bonus = bonus


def oracle_table(engine: Engine, drafter: OracleDrafter, rows: int):
    """The oracle's logits for positions 0 .. rows-1 [rows, V] on the device, kept on the engine (one table
    at a time) for the next generation with the same oracle: at K2's vocabulary a table takes seconds
    of host time."""
    key = (drafter.p, drafter.seed, drafter.calibrated, drafter.vocab, rows, drafter.sequence.tobytes())
    hit = engine.drafters.get("oracle")
    if hit is None or hit[0] != key:
        engine.drafters.pop("oracle", None)                                  # free the old one first
        table = oracle_logits(drafter.sequence, drafter.vocab, -1, rows, drafter.p, drafter.seed,
                              drafter.calibrated)
        engine.drafters["oracle"] = (key, to_device(table))
    return engine.drafters["oracle"][1]


def run_rounds(state: EngineSpecState, n_tokens: int, progress=None) -> float:
    """The rounds until ``n_tokens`` are out, as the reference's loop reads: draft -> build_tree ->
    verify -> walk -> commit (``progress(done, total, what)`` after each); their wall seconds."""
    t0 = time.perf_counter()
    while len(state.tokens) < n_tokens:
        state.draft()                                        # drafter + top-k + copy back
        n = state.build_tree()                               # host heap (or chain), cut to the budget's N
        post = state.verify(n)                               # control upload + verify graph + copy back
        accepted, bonus = state.walk(n, post)
        state.commit(n, accepted, bonus)
        if progress is not None:
            progress(min(len(state.tokens), n_tokens), n_tokens, f"round {len(state.rounds)}")
    return time.perf_counter() - t0
