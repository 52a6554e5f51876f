"""The compiled encoder and decoder (numba, the optional ``fast`` extra).

Byte-identical to the numpy code in :mod:`smoe.quant`; only chosen when numba imports.
"""

__all__ = ["code_cache", "decode", "encode", "jit"]  # submodules, imported on use
