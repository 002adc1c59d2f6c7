"""GPU benchmarks: ``python -m workbench bench kernels`` (kernels.py) and ``bench engine`` (engine.py)."""
