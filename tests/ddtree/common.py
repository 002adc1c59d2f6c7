"""Shared test models: random target weights with a random dflash drafter, and their greedy tokens."""

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
