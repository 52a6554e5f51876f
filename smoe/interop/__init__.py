"""Other projects' file formats, read and written with bounded memory.

:mod:`smoe.interop.safetensors_io`: shard headers without data, positioned tensor reads,
streamed writes. Knows nothing of vaults; sits just above :mod:`smoe.plumbing`.
"""

__all__ = ["safetensors_io"]  # submodules, imported on use
