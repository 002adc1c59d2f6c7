"""The numpy reference model of the Kimi-K2 / DeepSeek-V3 architecture: the spec everything is checked
against. float32 by default, float64 for tight checks. Plain functions over a weights dict
(internal names, see docs/conventions.md)."""
