"""HF checkpoint folders opened lazily: safetensors headers parsed here, data memory-mapped, a layer
selection as a truncated model (docs/checkpoints.md)."""

from .lazy import LazyCheckpoint, RowTable, open_checkpoint, parse_layers, truncated_config

__all__ = ["LazyCheckpoint", "RowTable", "open_checkpoint", "parse_layers", "truncated_config"]
