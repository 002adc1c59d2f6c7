"""kdtree-workbench: validate and benchmark DDTree speculative decoding of a Kimi-K2-style model."""

__version__ = "0.1.0"
