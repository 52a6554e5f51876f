"""``smoe families``: the family registry (:mod:`smoe.families.registry`) as a table, as JSON,
and as the README's generated table.

Everything here is read from the registry at run time: a family added there is listed
without a change here. Each family appears once (an alias finds its family), sorted by
``model_type``; every field of :class:`~smoe.families.registry.Family` is in the JSON, enums
as their values, a :class:`~smoe.families.registry.Renorm` as ``{"key", "default"}``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from enum import Enum

from rich.console import Console
from rich.markup import escape

from smoe.cli.console import make_table, shown
from smoe.errors import UsageError
from smoe.families.registry import FAMILIES, Family, Flag, Refusal, Renorm, assumptions, family_of

__all__ = [
    "MARKERS",
    "families",
    "family_dict",
    "lookup",
    "markdown_table",
    "render_family",
    "render_table",
    "renorm_text",
    "splice_readme",
    "status",
]

MARKERS = ("<!-- families -->", "<!-- /families -->")
"""The lines around the README's generated family table."""

_LABELS = {
    "model_type": "model type",
    "aliases": "aliases",
    "layouts": "expert layouts",
    "renorm": "router renormalises top-k",
    "gated_q": "gated q (2 x heads rows)",
    "qk_norm": "q/k norms",
    "top_k": "top-k keys",
    "experts": "expert count keys",
    "moe_ffn": "expert width keys",
    "beyond": "beyond the arch block",
    "semantics": "beyond, in the code",
    "refuse_if": "refused when",
    "rope_switch": "RoPE only when",
    "silu_fixed": "SiLU whatever hidden_act",
    "architecture": "export architecture",
    "generate": "runs in generate",
    "rebuild": "export rebuilds config",
    "note": "note",
}
"""The text view's label of each field (a field without one: its name, spaced)."""


# ---- the data ------------------------------------------------------------------------------
def families() -> list[Family]:
    """Every registered family once (aliases are keys of ``FAMILIES`` too), by model_type.

    >>> [f.model_type for f in families()] == sorted({f.model_type for f in FAMILIES.values()})
    True
    """
    unique = {f.model_type: f for f in FAMILIES.values()}
    return [unique[k] for k in sorted(unique)]


def lookup(model_type: str) -> Family:
    """The family of ``model_type`` or of an alias; an unknown type is a UsageError naming
    it and what the sculptor assumes for it.

    >>> lookup("qwen3_moe").architecture
    'Qwen3MoeForCausalLM'
    >>> try:
    ...     lookup("new_moe")
    ... except UsageError as e:
    ...     print(str(e)[:60])
    model_type 'new_moe' is not in smoe's family registry (smoe
    """
    family = family_of(model_type)
    if family is None:
        raise UsageError(assumptions(model_type))
    return family


def status(family: Family) -> str:
    """``"converted"`` or ``"refused"``.

    >>> status(FAMILIES["qwen3_moe"]), status(FAMILIES["gpt_oss"])
    ('converted', 'refused')
    """
    return "converted" if family.converted else "refused"


def _plain(value: object) -> object:
    """A field's value as JSON data: enums as their values, dataclasses as objects, tuples
    as lists."""
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def family_dict(family: Family) -> dict[str, object]:
    """Every field of ``family`` as JSON data, and its ``status``.

    >>> d = family_dict(FAMILIES["qwen3_moe"])
    >>> d["status"], d["layouts"]
    ('converted', ['per expert', 'fused [E, 2I, H]'])
    >>> d["renorm"]
    {'key': 'norm_topk_prob', 'default': False, 'only_when': []}
    """
    doc = {f.name: _plain(getattr(family, f.name)) for f in dataclasses.fields(family)}
    doc["status"] = status(family)
    return doc


def renorm_text(family: Family) -> str:
    """The router's top-k renormalisation rule, in words.

    >>> renorm_text(FAMILIES["qwen3_moe"]), renorm_text(FAMILIES["mixtral"])
    ('config key norm_topk_prob, default false', 'fixed true')
    """
    r = family.renorm
    if isinstance(r, Renorm):
        return f"config key {r.key}, default {str(r.default).lower()}"
    return f"fixed {str(r).lower()}"


def _export_text(family: Family) -> str:
    how = "rebuilds" if family.rebuild else "needs the config copy"
    return f"{family.architecture or 'no architecture'}; {how}"


def _words(value: object) -> str:
    """A field's value for the terminal or Markdown."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, Flag):
        return f"config key {value.key}, default {str(value.default).lower()}"
    if isinstance(value, Refusal):
        if value.kind == "differs":
            return f"{value.key} differs from {value.other}: {value.reason}"
        if value.kind == "overrides":
            return f"{value.key} overrides a width: {value.reason}"
        return f"{value.key} set (not null or 0): {value.reason}"
    if isinstance(value, (tuple, list)):
        return ", ".join(_words(v) for v in value) or "-"
    if value is None or value == "":
        return "-"
    return str(value)


def _field_text(family: Family, name: str) -> str:
    value = getattr(family, name)
    if name == "renorm":
        return renorm_text(family)
    if name == "qk_norm" and value is None:
        return "from use_qk_norm or the tensors"
    if name == "rope_switch" and value:
        return f"{value[0]} is {value[1]}"
    return _words(value)


# ---- the terminal ---------------------------------------------------------------------------
def render_table(console: Console, long: bool = False) -> None:
    """One row per family; ``long``: also the config keys beyond the arch block and the
    note or refusal reason (else the refused families' reasons follow the table).

    >>> from smoe.cli.console import make_console
    >>> render_table(make_console())  # doctest: +ELLIPSIS
    model families (...; smoe families TYPE shows one in full, --long every field)
    model type  aliases  status     layouts ...
    ...
    qwen3_moe ... converted  per expert, ...
    ...
    """
    listed = families()
    table = make_table(
        console,
        f"model families ({len(listed)}; smoe families TYPE shows one in full, --long every field)",
    )
    for name in ("model type", "aliases", "status", "layouts", "router renormalises top-k"):
        table.add_column(name)
    table.add_column("gated q")
    table.add_column("export --hf (architecture; config)")
    table.add_column("generate")
    if long:
        table.add_column("beyond the arch block", overflow="fold")
        table.add_column("note / refusal reason", overflow="fold")
    for f in listed:
        cells = [f.model_type, _words(f.aliases), status(f)]
        if f.converted:
            cells += [_words(f.layouts), renorm_text(f), _words(f.gated_q), _export_text(f)]
            cells.append(_words(f.generate))
        else:  # what it would be read as does not apply
            cells += ["-", "-", "-", "-", "-"]
        if long:
            cells += [_words(f.beyond), f.refused or f.note or "-"]
        table.add_row(*(escape(shown(c)) for c in cells))
    console.print(table)
    if not long:
        for f in listed:
            if not f.converted:
                console.print(f"{escape(shown(f.model_type))} refused: {escape(shown(f.refused))}")


def render_family(console: Console, family: Family) -> None:
    """Every field of one family, one row each.

    >>> from smoe.cli.console import make_console
    >>> render_family(make_console(), FAMILIES["gpt_oss"])  # doctest: +ELLIPSIS
    family gpt_oss
    model type                 gpt_oss
    status                     refused
    refused because            ...
    """
    table = make_table(console, f"family {family.model_type}", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for field in dataclasses.fields(family):
        if field.name == "refused":
            table.add_row("status", status(family))
            if not family.converted:
                table.add_row("refused because", escape(shown(family.refused)))
            continue
        label = _LABELS.get(field.name, field.name.replace("_", " "))
        table.add_row(label, escape(shown(_field_text(family, field.name))))
    console.print(table)


# ---- the README ----------------------------------------------------------------------------
def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown_table(listed: Iterable[Family] | None = None) -> str:
    """The README's family table (every family unless ``listed``), generated from the
    registry: model type (aliases), status, layouts (converted families), whether
    ``smoe-stream generate`` runs it, notes or the refusal reason.

    >>> print(markdown_table([FAMILIES["qwen3_moe"]]))
    | model type (aliases) | status | layouts | generate | notes / refusal reason |
    |---|---|---|---|---|
    | `qwen3_moe` | converted | per expert, fused [E, 2I, H] | yes |  |
    <BLANKLINE>
    """
    lines = [
        "| model type (aliases) | status | layouts | generate | notes / refusal reason |",
        "|---|---|---|---|---|",
    ]
    for f in families() if listed is None else listed:
        name = f"`{f.model_type}`"
        if f.aliases:
            name += " (" + ", ".join(f"`{a}`" for a in f.aliases) + ")"
        notes = f.refused or f.note
        layouts = ", ".join(layout.value for layout in f.layouts) if f.converted else "-"
        runs = _words(f.generate) if f.converted else "-"
        lines.append(f"| {name} | {status(f)} | {_cell(layouts)} | {runs} | {_cell(notes)} |")
    return "\n".join(lines) + "\n"


_BLOCK = re.compile(
    rf"(^{re.escape(MARKERS[0])}\n)(.*?)(^{re.escape(MARKERS[1])}$)", re.MULTILINE | re.DOTALL
)


def splice_readme(text: str) -> str:
    """``text`` (the README) with the table between :data:`MARKERS` regenerated; a text
    without the markers is a ValueError.

    >>> old = "intro\\n<!-- families -->\\nstale\\n<!-- /families -->\\nend\\n"
    >>> new = splice_readme(old)
    >>> new.startswith("intro\\n<!-- families -->\\n| model type")
    True
    >>> new.endswith("|\\n<!-- /families -->\\nend\\n")
    True
    """
    if _BLOCK.search(text) is None:
        raise ValueError(f"no {MARKERS[0]} ... {MARKERS[1]} block (each on a line of its own)")
    return _BLOCK.sub(lambda m: m.group(1) + markdown_table() + m.group(3), text, count=1)
