"""DDTree speculative decoding on the numpy reference: drafters (dflash, oracle), the best-first draft
tree, one-pass tree verification, the walk, and lossless sampling. The spec the GPU engine is checked
against."""

from .ar import ARResult, ar_generate
from .budget import CostCurve, TreeBudget, expected_tokens, load_cost_curve, tree_budget
from .config import DRAFTERS, DrafterConfig, SamplingParams
from .dflash import DFlashDrafter, default_drafter_config, random_drafter_weights
from .oracle import OracleDrafter
from .speculative import RoundStats, RoundTrace, SpecResult, ddtree_generate
from .tree import Tree, build_tree, compile_tree
from .walk import walk

__all__ = ["ARResult", "ar_generate", "CostCurve", "TreeBudget", "expected_tokens", "load_cost_curve",
           "tree_budget", "DRAFTERS", "DrafterConfig", "SamplingParams", "DFlashDrafter",
           "default_drafter_config", "random_drafter_weights", "OracleDrafter", "RoundStats", "RoundTrace",
           "SpecResult", "ddtree_generate", "Tree", "build_tree", "compile_tree", "walk"]
