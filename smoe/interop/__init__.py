"""Other projects' file formats, read and written with bounded memory.

:mod:`smoe.interop.safetensors_io`: shard headers without data, positioned tensor reads,
streamed writes. :mod:`smoe.interop.gguf_io`: llama.cpp's GGUF header, key-values and
tensor infos, every count bounded by the file size. Knows nothing of vaults; sits just
above :mod:`smoe.plumbing`.
"""

__all__ = ["gguf_io", "safetensors_io"]  # submodules, imported on use
