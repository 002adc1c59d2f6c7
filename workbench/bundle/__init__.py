"""KDTR bundles: one validated binary file with a model config, tensors, prompt, golden tokens,
their margins, free-form meta and provenance. Spec: docs/kdtr-format.md.

    write_bundle(path, config=cfg, tensors=weights, prompt=p, golden=g, margins=m, meta={...})
    b = read_bundle(path)          # b.config, b.tensors, b.prompt, b.golden, b.margins, b.meta, b.weights()

Every malformed input raises BundleFormatError (a ValueError) with a ``reason`` code.
"""

from numformats.bf16 import BF16Array, bf16

from .format import ALIGN, DTYPES, MAGIC, MAX_RANK, VERSION, BundleFormatError, tensor_nbytes
from .header import Entry
from .payload import GROUP_SIZES, Int4Matrix, int4_matrices
from .reader import Bundle, read_bundle, read_bundle_bytes
from .writer import write_bundle

__all__ = [
    "ALIGN", "DTYPES", "MAGIC", "MAX_RANK", "VERSION", "BF16Array", "Bundle", "BundleFormatError", "Entry",
    "GROUP_SIZES", "Int4Matrix", "bf16", "int4_matrices", "read_bundle", "read_bundle_bytes",
    "tensor_nbytes", "write_bundle",
]
