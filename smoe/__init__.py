"""smoe: spec-first toolchain for .smoe vaults of 2/4-bit quantised MoE expert weights.

Format constants and struct layouts live in the generated ``smoe_gen.layout`` module
(from ``spec/smoe.ksy``); this package holds the hand-written tools around them.

``import smoe`` is light (no numpy); ``smoe.Vault`` is imported on first use::

    from smoe import Vault
    v = Vault.open("model.smoe")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"  # the package's only version string (pyproject.toml reads it)
__all__ = ["Vault", "__version__"]

if TYPE_CHECKING:
    from smoe.vault.reader import Vault


def __getattr__(name: str) -> object:
    """Lazy attributes: ``smoe.Vault`` imports :mod:`smoe.vault.reader` (and numpy) when asked
    for."""
    if name == "Vault":
        from smoe.vault.reader import Vault

        return Vault
    raise AttributeError(f"module 'smoe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
