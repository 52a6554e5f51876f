"""Test and benchmark support, not part of the installed package.

Synthetic checkpoints and sparse vaults (:mod:`.synth`) and the reference reader through the
safetensors library (:mod:`.library_reader`); used by ``tests/``, ``bench/`` and ``fuzz/``
from a checkout only.
"""

__all__ = ["library_reader", "synth"]  # submodules, imported on use
