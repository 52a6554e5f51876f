"""Command-line entry points: ``smoe <command>`` and ``smoe-dump``."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from smoe_gen import layout

STRUCTS = (
    ("SmoeHeader", layout.HEADER_DTYPE),
    ("SmoeArchBlock", layout.ARCH_BLOCK_DTYPE),
    ("ExpertEntry", layout.EXPERT_ENTRY_DTYPE),
    ("TensorDescriptor", layout.TENSOR_DESCRIPTOR_DTYPE),
)
DOC_KEYS = {
    "SmoeHeader": "header",
    "SmoeArchBlock": "arch_block",
    "ExpertEntry": "expert_entry",
    "TensorDescriptor": "tensor_descriptor",
}


def _spec_summary() -> dict:
    structs = {}
    for name, dtype in STRUCTS:
        docs = layout.FIELD_DOCS[DOC_KEYS[name]]
        structs[name] = {
            "size": dtype.itemsize,
            "fields": [
                {"name": f, "offset": dtype.fields[f][1], "size": dtype.fields[f][0].itemsize,
                 "doc": docs[f]}
                for f in dtype.names
            ],
        }
    return {
        "magic": layout.MAGIC.hex(" "),
        "arch_magic": layout.ARCH_MAGIC.hex(" "),
        "versions": [layout.VERSION_MIN, layout.VERSION_MAX],
        "page_size": layout.PAGE_SIZE,
        "group_size": layout.GROUP_SIZE,
        "supported_bits": list(layout.SUPPORTED_BITS),
        "structs": structs,
    }


def cmd_spec(args: argparse.Namespace) -> int:
    """Print the format's constants and struct layouts (from the generated layout)."""
    summary = _spec_summary()
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    console = Console()
    console.print(
        f"[bold].smoe format[/] v{summary['versions'][0]}..v{summary['versions'][1]}  "
        f"magic [cyan]{summary['magic']}[/]  page {summary['page_size']} B  "
        f"group {summary['group_size']}  bits {summary['supported_bits']}"
    )
    for name, info in summary["structs"].items():
        table = Table(title=f"{name} ({info['size']} bytes)", title_justify="left")
        table.add_column("offset", justify="right")
        table.add_column("size", justify="right")
        table.add_column("field")
        table.add_column("meaning", overflow="fold")
        for f in info["fields"]:
            table.add_row(str(f["offset"]), str(f["size"]), f["name"], f["doc"])
        console.print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="smoe", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("spec", help="show the format's constants and struct layouts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_spec)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
