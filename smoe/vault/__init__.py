"""Vault I/O: the reader (:class:`smoe.vault.reader.Vault`), the streaming writer and upgrade.

Built on :mod:`smoe.format` (layout and rules) and :mod:`smoe.quant` (codes).
"""

__all__ = ["companions", "reader", "upgrade", "writer"]  # submodules, imported on use
