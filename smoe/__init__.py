"""smoe: spec-first toolchain for .smoe vaults of 2/4-bit quantised MoE expert weights.

Format constants and struct layouts live in the generated ``smoe_gen.layout`` module
(from ``spec/smoe.ksy``); this package holds the hand-written tools around them.
"""

__version__ = "0.1.0"
