"""The numba.cuda decode engine: AR and DDTree generation of a bundle on the GPU (or the CUDA simulator)."""
