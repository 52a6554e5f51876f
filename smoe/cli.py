"""Command-line entry points: ``smoe <command>`` and ``smoe-dump``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from smoe.errors import SmoeError
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


def _print_json(obj: object) -> None:
    print(json.dumps(obj, indent=2, default=str))


def cmd_sculpt(args: argparse.Namespace) -> int:
    """Convert a HuggingFace MoE checkpoint into a vault and a scout."""
    from smoe.sculpt import SculptOptions, sculpt

    opts = SculptOptions(bits=args.bits, version=args.format_version, max_layers=args.max_layers,
                         max_experts=args.max_experts, jobs=args.jobs, resume=args.resume,
                         dry_run=args.dry_run, scale=args.scale)
    err = Console(stderr=True)
    if args.dry_run:
        plan = sculpt(args.model_dir, args.out_dir, opts)
        if args.json:
            _print_json(plan)
        else:
            _show_dry_run(plan)
        return 0
    columns = (TextColumn("[bold]sculpt[/]"), BarColumn(), MofNCompleteColumn(),
               TextColumn("experts"), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True,
                  disable=args.json or not err.is_terminal) as bar:
        task = bar.add_task("sculpt", total=None, rate="")
        start = time.perf_counter()

        def progress(done: int, total: int, bytes_in: int) -> None:
            rate = bytes_in / 1e6 / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=done, total=total, rate=f"{rate:7.1f} MB/s")

        result = sculpt(args.model_dir, args.out_dir, opts, progress=progress)
    summary = result.summary()
    if args.json:
        _print_json(summary)
    else:
        _show_summary(summary)
    return 0


def _show_dry_run(plan: dict) -> None:
    c = Console()
    t = Table(title="planned vault (nothing written)", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("experts", str(plan["experts"]))
    t.add_row("experts per layer", ", ".join(f"{k}: {v}"
                                             for k, v in plan["experts_per_layer"].items()))
    t.add_row("blob raw / padded bytes", f"{plan['blob_raw_sizes']} / {plan['blob_padded_sizes']}")
    t.add_row("data_offset", f"{plan['data_offset']:#x} ({plan['data_offset']})")
    t.add_row("arch block at", str(plan["reserved_ext"]) if plan["arch"] else "none (v1)")
    t.add_row("vault size", f"{plan['vault_bytes']:,} bytes")
    t.add_row("scout size", f"{plan['scout_bytes']:,} bytes ({plan['scout_tensors']} tensors)")
    c.print(t)
    if plan["arch"]:
        a = Table(title="arch block", title_justify="left", show_header=False)
        for k, v in plan["arch"].items():
            a.add_row(k, str(v))
        c.print(a)
    for w in plan["warnings"]:
        c.print(f"[yellow]warning:[/] {w}")


def _show_summary(s: dict) -> None:
    c = Console()
    t = Table(title="sculpt summary", title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("vault", s["vault"])
    t.add_row("scout", s["scout"])
    t.add_row("experts written", f"{s['experts_written']} (+{s['experts_resumed']} resumed)")
    t.add_row("expert bytes in", f"{s['expert_bytes_in']:,}")
    t.add_row("vault / scout bytes", f"{s['vault_bytes']:,} / {s['scout_bytes']:,}")
    if s["compression_ratio"]:
        t.add_row("compression", f"{s['compression_ratio']:.2f}x")
    t.add_row("time", f"{s['seconds']:.2f} s")
    if s["throughput_mb_s"]:
        t.add_row("throughput", f"{s['throughput_mb_s']:.1f} MB/s of expert weights")
    c.print(t)
    q = Table(title="quantisation SNR (dB)", title_justify="left")
    q.add_column("tensor")
    q.add_column("min over experts", justify="right")
    q.add_column("median", justify="right")
    for name, v in s["snr_db"].items():
        q.add_row(name, *(("-", "-") if v is None else (f"{v['min']:.2f}", f"{v['median']:.2f}")))
    c.print(q)
    for w in s["warnings"]:
        c.print(f"[yellow]warning:[/] {w}")


def _open_bytes(path: Path):
    """The file as a read-only uint8 map; Unreadable when it cannot be read at all."""
    from smoe.reader import map_file

    try:
        return map_file(path)
    except SmoeError as e:
        raise Unreadable(str(e)) from None


class Unreadable(SmoeError):
    """Exit status 2: the input cannot be read at all."""


def cmd_verify(args: argparse.Namespace) -> int:
    """Check every rule; exit 0 = no errors, 1 = errors, 2 = unreadable."""
    from smoe.verify import verify

    data = _open_bytes(args.vault)
    report = verify(data, deep=args.deep)
    unreadable = any(f.code == "header.size" for f in report.errors)
    if args.json:
        _print_json({"file": str(args.vault), "size": report.size, "deep": args.deep,
                     "ok": report.ok, "errors": len(report.errors),
                     "findings": [f.to_dict() for f in report.findings]})
    else:
        c = Console(highlight=False)
        for f in report.findings:
            style = {"error": "bold red", "warning": "yellow", "info": "cyan"}[f.severity]
            c.print(f"[{style}]{escape(f.line())}[/]", soft_wrap=True)
        n_err, n_warn = len(report.errors), sum(f.severity == "warning" for f in report.findings)
        verdict = "[bold green]valid[/]" if report.ok else "[bold red]INVALID[/]"
        c.print(f"{args.vault}: {verdict} ({n_err} errors, {n_warn} warnings"
                f"{', deep' if args.deep else ''})")
    return 2 if unreadable else (0 if report.ok else 1)


def cmd_dump(args: argparse.Namespace) -> int:
    """Show a vault: summary, header, arch block, table by layer, findings."""
    from smoe.dump import collect, render

    data = _open_bytes(args.vault)
    dump, report = collect(args.vault, data, deep=args.deep)
    if args.json:
        _print_json({k: dump[k] for k in ("file", "header", "arch", "experts", "findings")})
    else:
        render(dump, Console(highlight=False), experts=args.experts, layer=args.layer)
    if any(f.code == "header.size" for f in report.errors):
        return 2
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace) -> int:
    """Dequantise experts to float32 safetensors."""
    from smoe.export import export

    names = export(args.vault, args.out, layer=args.layer, expert=args.expert)
    if args.json:
        _print_json({"out": str(args.out), "tensors": names})
    else:
        Console(highlight=False).print(f"wrote {len(names)} float32 tensors "
                                       f"({len(names) // 3} experts) to {args.out}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade a v1 vault to v2 (D7): in place when there is room, else --out NEW."""
    from smoe.checkpoint import Checkpoint
    from smoe.config import arch_from_config, load_config
    from smoe.reader import Vault
    from smoe.upgrade import upgrade

    vault = Vault.open(args.vault)
    if args.model is not None:
        ckpt = Checkpoint.open(args.model)
        arch, warnings = ckpt.arch_info(), ckpt.warnings
    else:
        rows = int(vault.descriptors[0, 0]["rows"]) if len(vault) else 0
        arch, warnings = arch_from_config(load_config(args.config), str(args.config), rows)
    del vault
    result = upgrade(args.vault, arch, force=args.force, out=args.out)
    info = {"path": str(result.path), "mode": result.mode, "arch_offset": result.arch_offset,
            "data_offset": result.data_offset, "warnings": warnings}
    if args.json:
        _print_json(info)
    else:
        c = Console(highlight=False)
        verb = {"in-place": "upgraded in place to v2", "re-stamp": "re-stamped the arch block of",
                "rewrite": "wrote a v2 copy"}[result.mode]
        c.print(f"{verb}: {result.path} (arch block at {result.arch_offset}, "
                f"data_offset {result.data_offset})")
        for w in warnings:
            c.print(f"[yellow]warning:[/] {w}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="smoe", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("spec", help="show the format's constants and struct layouts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_spec)

    p = sub.add_parser("sculpt", help="convert a HuggingFace MoE checkpoint into a vault + scout")
    p.add_argument("model_dir", type=Path, help="checkpoint directory (config.json, *.safetensors)")
    p.add_argument("out_dir", type=Path, help="where <stem>.smoe and <stem>.scout.safetensors go")
    p.add_argument("--bits", type=int, choices=layout.SUPPORTED_BITS, default=layout.BITS_Q4)
    p.add_argument("--format-version", type=int, default=layout.VERSION_MAX,
                   choices=range(layout.VERSION_MIN, layout.VERSION_MAX + 1))
    p.add_argument("--max-layers", type=int, help="only the first N MoE layers (partial vault)")
    p.add_argument("--max-experts", type=int, help="only the first N experts of each layer")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--dry-run", action="store_true", help="print the planned layout, write nothing")
    p.add_argument("--scale", choices=("optimal", "absmax"), default="optimal",
                   help="how each group's scale is chosen (absmax = the reference Sculptor)")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    p.set_defaults(func=cmd_sculpt)

    p = sub.add_parser("verify", help="check every rule of the format")
    p.add_argument("vault", type=Path)
    p.add_argument("--deep", action="store_true", help="also read every blob (linear in size)")
    p.add_argument("--json", action="store_true", help="machine-readable findings")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("dump", help="show a vault as a tree (same as smoe-dump)")
    _dump_args(p)

    p = sub.add_parser("export", help="dequantise experts to float32 safetensors")
    p.add_argument("vault", type=Path)
    p.add_argument("out", type=Path, help="output .safetensors file")
    p.add_argument("--layer", type=int, help="only this layer")
    p.add_argument("--expert", type=int, help="only this expert id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("upgrade", help="upgrade a v1 vault to v2 (arch block)")
    p.add_argument("vault", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="the model's config.json")
    src.add_argument("--model", type=Path, help="the model directory (tensor shapes win)")
    p.add_argument("--force", action="store_true", help="re-stamp the arch block of a v2 vault")
    p.add_argument("--out", type=Path, help="write a v2 copy here instead of editing in place")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_upgrade)
    return ap


def _dump_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("vault", type=Path)
    p.add_argument("--experts", action="store_true", help="list every expert and its tensors")
    p.add_argument("--layer", type=int, help="expand one layer")
    p.add_argument("--deep", action="store_true", help="verify blob contents too")
    p.add_argument("--json", action="store_true", help="the same content as JSON")
    p.set_defaults(func=cmd_dump)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except Unreadable as e:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False,
                                   soft_wrap=True)
        return 2
    except SmoeError as e:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(e))}", highlight=False,
                                   soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        hint = ("; run the same command with --resume to continue"
                if getattr(args, "func", None) is cmd_sculpt else "")
        Console(stderr=True).print(f"interrupted{hint}", highlight=False)
        return 130
    except BrokenPipeError:  # e.g. `smoe-dump --json VAULT | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def dump_main(argv: list[str] | None = None) -> int:
    """``smoe-dump VAULT``."""
    ap = argparse.ArgumentParser(prog="smoe-dump", description=cmd_dump.__doc__)
    _dump_args(ap)
    return _run(ap.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    return _run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
