"""Arch block rules (version 2), over one read of its 128 bytes; and ``header.ffn_dim``,
which weighs the header against the arch block.

Order: the magic gate first (a block without "SARC" is not an arch block: nothing else of
it is judged).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from smoe.format.verify.report import Collector, Given, Report
from smoe.format.verify.rules import Section, rule
from smoe.format.view import Data, Geometry, arch_block, header_view
from smoe_gen import layout
from smoe_gen.layout import Rule

__all__ = ["ARCH", "check_arch", "check_ffn_dim"]

_AT = layout.ARCH_BLOCK_OFFSETS  # field -> offset in the block
_HEADER_AT = layout.HEADER_OFFSETS


class _Arch:
    """What the arch rules read: the block's bytes, as a record, and where it lies."""

    def __init__(self, block: np.ndarray, base: int, report: Report, moe_layers: int) -> None:
        self.c = Collector(report)
        self.block = block
        self.base = base
        self.moe_layers = moe_layers  # the header's num_moe_layers

    @cached_property
    def a(self) -> np.void:
        record: np.void = self.block.view(layout.ARCH_BLOCK_DTYPE)[0]
        return record

    def bad(self, rule: Rule, name: str, message: str, expected: Given, actual: Given) -> None:
        """A finding of ``rule`` at field ``name`` of the block."""
        self.c.one(rule, self.base + _AT[name], f"arch.{name}", message, expected, actual)


ARCH: Section[_Arch] = Section("arch")
"""The arch block rules, in the order they run."""


def check_arch(data: Data, geo: Geometry, report: Report) -> None:
    """Arch block rules (only when ``geo.arch_readable``); one read of its 128 bytes.

    >>> from smoe.format.verify.header import check_header
    >>> from smoe.format.view import FileView
    >>> with FileView.open("fixtures/corrupt/head_dim_300.smoe") as view:
    ...     report = Report(size=len(view))
    ...     check_arch(view, check_header(view, report), report)
    >>> [(f.code, f.offset, f.message, f.expected, f.actual) for f in report.errors]
    [('arch.head_dim', 1564, 'head_dim must be in 1..256', '1..256', 300)]
    """
    moe_layers = int(header_view(data)["num_moe_layers"])
    ARCH.run(_Arch(arch_block(data, geo), geo.reserved_ext, report, moe_layers))


@ARCH.rule(Rule.ARCH_MAGIC, gate=True)
def _magic(f: _Arch) -> bool:
    magic = bytes(f.a["magic"])
    if magic == layout.ARCH_MAGIC:
        return True
    f.bad(
        Rule.ARCH_MAGIC,
        "magic",
        'the arch block must start with "SARC"',
        layout.ARCH_MAGIC.hex(" "),
        magic.hex(" "),
    )
    return False


@ARCH.rule(Rule.ARCH_BLOCK_VERSION)
def _block_version(f: _Arch) -> None:
    if int(f.a["block_version"]) != layout.ARCH_BLOCK_VERSION:
        f.bad(
            Rule.ARCH_BLOCK_VERSION,
            "block_version",
            "unknown arch block version",
            layout.ARCH_BLOCK_VERSION,
            int(f.a["block_version"]),
        )


@ARCH.rule(Rule.ARCH_BLOCK_SIZE)
def _block_size(f: _Arch) -> None:
    if int(f.a["block_size"]) != layout.ARCH_BLOCK_SIZE:
        f.bad(
            Rule.ARCH_BLOCK_SIZE,
            "block_size",
            f"arch block size must be {layout.ARCH_BLOCK_SIZE}",
            layout.ARCH_BLOCK_SIZE,
            int(f.a["block_size"]),
        )


@ARCH.rule(Rule.ARCH_FLAGS)
def _flags(f: _Arch) -> None:
    flags = int(f.a["flags"])
    if flags & ~layout.FLAGS_KNOWN_MASK:
        f.bad(
            Rule.ARCH_FLAGS,
            "flags",
            "unknown flag bits 3..31 set",
            flags & layout.FLAGS_KNOWN_MASK,
            flags,
        )


@ARCH.rule(Rule.ARCH_NUM_HEADS)
def _num_heads(f: _Arch) -> None:
    heads = int(f.a["num_heads"])
    if heads < 1:
        f.bad(Rule.ARCH_NUM_HEADS, "num_heads", "num_heads must be at least 1", ">= 1", heads)


@ARCH.rule(Rule.ARCH_NUM_KV_HEADS)
def _num_kv_heads(f: _Arch) -> None:
    heads, kv = int(f.a["num_heads"]), int(f.a["num_kv_heads"])
    if kv < 1:
        f.bad(Rule.ARCH_NUM_KV_HEADS, "num_kv_heads", "num_kv_heads must be at least 1", ">= 1", kv)
    elif heads % kv:
        f.bad(
            Rule.ARCH_NUM_KV_HEADS,
            "num_kv_heads",
            f"num_heads {heads} is not divisible by num_kv_heads {kv}",
            f"a divisor of {heads}",
            kv,
        )


@ARCH.rule(Rule.ARCH_HEAD_DIM)
def _head_dim(f: _Arch) -> None:
    hd = int(f.a["head_dim"])
    if not 1 <= hd <= layout.MAX_HEAD_DIM:
        f.bad(
            Rule.ARCH_HEAD_DIM,
            "head_dim",
            f"head_dim must be in 1..{layout.MAX_HEAD_DIM}",
            f"1..{layout.MAX_HEAD_DIM}",
            hd,
        )


@ARCH.rule(Rule.ARCH_MOE_TOP_K)
def _moe_top_k(f: _Arch) -> None:
    k = int(f.a["moe_top_k"])
    if not 1 <= k <= layout.MAX_MOE_TOP_K:
        f.bad(
            Rule.ARCH_MOE_TOP_K,
            "moe_top_k",
            f"moe_top_k must be in 1..{layout.MAX_MOE_TOP_K}",
            f"1..{layout.MAX_MOE_TOP_K}",
            k,
        )


@ARCH.rule(Rule.ARCH_NUM_HIDDEN_LAYERS)
def _num_hidden_layers(f: _Arch) -> None:
    """The block counts every layer, and has no field for multi-token-prediction layers:
    a model of fewer layers than the header has MoE layers is not one model."""
    layers = int(f.a["num_hidden_layers"])
    if layers < f.moe_layers:
        f.bad(
            Rule.ARCH_NUM_HIDDEN_LAYERS,
            "num_hidden_layers",
            f"num_hidden_layers {layers} is less than the header's num_moe_layers {f.moe_layers}",
            f">= {f.moe_layers}",
            layers,
        )


@ARCH.rule(Rule.ARCH_ACTIVATION)
def _activation(f: _Arch) -> None:
    act = int(f.a["activation"])
    if act != layout.Activation.SILU:
        f.bad(Rule.ARCH_ACTIVATION, "activation", "only activation 0 (SiLU) is implemented", 0, act)


@ARCH.rule(Rule.ARCH_RESERVED)
def _reserved(f: _Arch) -> None:
    res = np.asarray(f.a["reserved"])
    if res.any():
        first = int(np.flatnonzero(res)[0])
        f.c.one(
            Rule.ARCH_RESERVED,
            f.base + _AT["reserved"] + first,
            "arch.reserved",
            "reserved bytes must be zero",
            0,
            int(res[first]),
        )


@ARCH.rule(Rule.ARCH_MODEL_TYPE)
def _model_type(f: _Arch) -> None:
    mt = f.base + _AT["model_type"]
    raw = bytes(f.block[_AT["model_type"] : _AT["model_type"] + layout.MODEL_TYPE_SIZE])
    stem, nul, rest = raw.partition(b"\0")
    try:
        stem.decode("utf-8")
    except UnicodeDecodeError as e:
        f.c.one(
            Rule.ARCH_MODEL_TYPE,
            mt + e.start,
            "arch.model_type",
            "model_type is not valid UTF-8",
            "UTF-8",
            raw.hex(),
        )
    if rest.strip(b"\0"):
        at = len(stem) + len(nul) + next(i for i, b in enumerate(rest) if b)
        f.c.one(
            Rule.ARCH_MODEL_TYPE,
            mt + at,
            "arch.model_type",
            "model_type is not NUL-padded (bytes after the first NUL must be zero, ruling R2)",
            0,
            raw[at],
        )


# One checker for both: a non-finite rope_theta is reported between rms_norm_eps's two
# findings (out of tolerance, not finite), as it always was.
@ARCH.rule(Rule.ARCH_RMS_NORM_EPS, Rule.ARCH_ROPE_THETA)
def _floats(f: _Arch) -> None:
    eps = float(f.a["rms_norm_eps"])
    ref = layout.REFERENCE_RMS_NORM_EPS
    if np.isfinite(eps) and not abs(eps - ref) <= layout.RMS_NORM_EPS_TOLERANCE * ref:
        f.bad(
            Rule.ARCH_RMS_NORM_EPS,
            "rms_norm_eps",
            f"differs from the kernels' {ref:g} by more than {layout.RMS_NORM_EPS_TOLERANCE:.0%}",
            ref,
            eps,
        )
    for r, name in (
        (Rule.ARCH_ROPE_THETA, "rope_theta"),
        (Rule.ARCH_RMS_NORM_EPS, "rms_norm_eps"),
    ):  # not load rules (D6, R5)
        if not np.isfinite(f.a[name]):
            f.bad(r, name, f"{name} is not finite", "finite", float(f.a[name]))


@rule(Rule.HEADER_FFN_DIM, section="header and arch")
def check_ffn_dim(header: np.void, arch: np.void | None, report: Report) -> None:
    """D5: warn on vaults whose ffn_dim looks like the reference Sculptor's d_model mistake
    (``arch``: the arch block's record, None when the vault has none that can be read).

    >>> from smoe.format.view import FileView, header_view
    >>> with FileView.open("fixtures/noroom_v1.smoe") as view:  # ffn_dim == d_model
    ...     report = Report(size=len(view))
    ...     check_ffn_dim(header_view(view), None, report)
    >>> [(f.code, f.expected, f.actual) for f in report.findings]
    [('header.ffn_dim', 'dense/shared FFN size', 8)]
    """
    c = Collector(report)
    ffn, d_model = int(header["ffn_dim"]), int(header["d_model"])
    want = None
    if arch is not None and bytes(arch["magic"]) == layout.ARCH_MAGIC:
        want = int(arch["dense_ffn_dim"]) or int(arch["shared_expert_ffn_dim"]) or None
    if want is not None and ffn != want:
        c.one(
            Rule.HEADER_FFN_DIM,
            _HEADER_AT["ffn_dim"],
            "header.ffn_dim",
            "differs from the arch block's dense/shared FFN size (D5)",
            want,
            ffn,
        )
    elif want is None and ffn == d_model:
        c.one(
            Rule.HEADER_FFN_DIM,
            _HEADER_AT["ffn_dim"],
            "header.ffn_dim",
            "equals d_model, as the reference Sculptor wrote it; routed-expert shapes come "
            "from the descriptors (D5)",
            "dense/shared FFN size",
            ffn,
        )
