"""Shared test models: random target weights with a random dflash drafter, and their greedy tokens."""

import dataclasses
import functools

import numpy as np

from workbench.config import preset
from workbench.ddtree.dflash import default_drafter_config, random_drafter_weights
from workbench.reference.generate import greedy_generate
from workbench.weights import random_weights

PROMPT = np.array([3, 17, 5, 42, 8, 11], dtype=np.int64)
N_TOKENS = 16


@functools.cache
def model(name: str):
    """(cfg, weights incl. drafter.*, drafter config) for a preset, seed 0 (built once per process)."""
    cfg = preset(name)
    dcfg = default_drafter_config(cfg)
    weights = random_weights(cfg, 0)
    weights.update(random_drafter_weights(cfg, dcfg, 0))
    return cfg, weights, dcfg


@functools.cache
def greedy(name: str, n: int):
    cfg, weights, _ = model(name)
    return greedy_generate(cfg, weights, PROMPT, n)


def dflash_layout(cfg):
    """A small drafter in the public DFlash layout for ``cfg``: GQA (4 query / 2 KV heads of 16),
    rotate-half RoPE with YaRN whose ramp lands inside the head (pairs 0-1 kept, 2+ interpolated), an
    attention factor != 1, its own final norm and eps; taps and block of ``default_drafter_config``."""
    return dataclasses.replace(default_drafter_config(cfg), n_heads=4, n_kv_heads=2, head_dim=16,
                               intermediate_size=96, rope_theta=500.0, rms_norm_eps=1e-5,
                               rope_layout="rotate_half", rope_scaling_type="yarn", rope_factor=4.0,
                               original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                               rope_attention_factor=1.1, own_norm=True)


@functools.cache
def dflash_model(name: str):
    """(cfg, weights, drafter config): ``model(name)``'s target with a fresh random drafter in the
    public DFlash layout (``dflash_layout``)."""
    cfg, weights, _ = model(name)
    dcfg = dflash_layout(cfg)
    w = {k: v for k, v in weights.items() if not k.startswith("drafter.")}
    w.update(random_drafter_weights(cfg, dcfg, 7))
    return cfg, w, dcfg
