"""INT4 W4A16 weights: quantize / pack / the W4A16 linear (int4.py) and weight policies (policy.py)."""
