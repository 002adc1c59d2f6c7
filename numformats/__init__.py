"""Number formats that the workbench and its kernels share, in numpy alone (no numba, no torch): bfloat16
as uint16 bits (``bf16``), compressed-tensors INT4 words and their scales (``int4``), and the one
user-input error type (``errors``). ``kernels_numba`` imports nothing from ``workbench``; what both
need lives here, once.
"""
