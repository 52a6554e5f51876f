"""The ``smoe`` subcommands: one ``cmd_<command>(args) -> exit status`` each.

Each takes the namespace :func:`smoe.cli.parser.build_parser` parses, prints its output
(rich text, or with ``--json`` one document) and returns the exit status; a failure is
raised and worded by :mod:`smoe.cli.failures`. The layers below are imported inside each
command, so that ``smoe --help`` stays quick.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

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

from smoe.cli.console import (
    make_console,
    make_table,
    print_json,
    print_notes,
    print_warnings,
    shown,
)
from smoe.cli.failures import fail
from smoe.format import findings
from smoe_gen import layout

if TYPE_CHECKING:
    from smoe.format.records import ArchInfo
    from smoe.format.verify import Report
    from smoe.sculpt import SculptOptions

__all__ = [
    "cmd_dump",
    "cmd_export",
    "cmd_families",
    "cmd_meta",
    "cmd_report",
    "cmd_sculpt",
    "cmd_spec",
    "cmd_upgrade",
    "cmd_verify",
    "cmd_warmup",
    "manifest_choice",
    "verdict",
]


# ---- shared by the vault-reading commands --------------------------------------------------
def manifest_choice(args: argparse.Namespace) -> str | Path | None:
    """``verify_path``'s ``manifest=``: "auto" (beside the vault), a given file, or None.

    >>> manifest_choice(argparse.Namespace(no_manifest=False, manifest=None))
    'auto'
    >>> manifest_choice(argparse.Namespace(no_manifest=True, manifest=None)) is None
    True
    """
    if args.no_manifest:
        return None
    return "auto" if args.manifest is None else args.manifest


def verdict(report: Report) -> int:
    """The exit status of a judged vault: 0 valid, 1 a rule broken, 2 unreadable (shorter
    than a header: ``header.size``).

    >>> from smoe.format.verify import verify_path
    >>> verdict(verify_path("fixtures/q4_v2.smoe"))
    0
    >>> verdict(verify_path("fixtures/corrupt/bad_magic.smoe"))
    1
    """
    if any(f.code == layout.Rule.HEADER_SIZE.code for f in report.errors):
        return 2
    return 0 if report.ok else 1


# ---- spec ----------------------------------------------------------------------------------
SPEC_SCHEMA = "smoe-spec/1"  # the "schema" of `smoe spec --json` (docs/JSON.md, Spec document)
FAMILIES_SCHEMA = "smoe-families/1"  # of `smoe families [TYPE] --json` (Families document)


def cmd_spec(args: argparse.Namespace) -> int:
    """Print the format's constants and struct layouts (from the generated layout), or with
    ``--ksy`` the Kaitai Struct spec itself (shipped in the package).

    >>> import contextlib, io, json
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = cmd_spec(argparse.Namespace(ksy=False, json=True))
    >>> code, json.loads(out.getvalue())["magic"]
    (0, '53 4d 4f 45 de ea 00 01')
    """
    if args.ksy:
        from importlib.resources import files

        sys.stdout.write(files("smoe_gen").joinpath("smoe.ksy").read_text(encoding="utf-8"))
        return 0
    summary = _spec_summary()
    if args.json:
        print_json(summary)
        return 0
    _show_spec(summary)
    return 0


def _spec_summary() -> dict:
    structs = {}
    for st in layout.STRUCTS:
        structs[st.name] = {
            "size": st.dtype.itemsize,
            "fields": [
                {
                    "name": f,
                    "offset": st.offsets[f],
                    "size": st.dtype[f].itemsize,
                    "doc": st.docs[f],
                }
                for f in st.dtype.names or ()  # a struct's dtype: names is set
            ],
        }
    return {
        "schema": SPEC_SCHEMA,
        "magic": layout.MAGIC.hex(" "),
        "arch_magic": layout.ARCH_MAGIC.hex(" "),
        "versions": [layout.VERSION_MIN, layout.VERSION_MAX],
        "page_size": layout.PAGE_SIZE,
        "group_size": layout.GROUP_SIZE,
        "supported_bits": list(layout.SUPPORTED_BITS),
        "structs": structs,
    }


def _show_spec(summary: dict) -> None:
    console = make_console(highlight=True)
    console.print(
        f"[bold].smoe format[/] v{summary['versions'][0]}..v{summary['versions'][1]}  "
        f"magic [cyan]{summary['magic']}[/]  page {summary['page_size']} B  "
        f"group {summary['group_size']}  bits {summary['supported_bits']}"
    )
    for name, info in summary["structs"].items():
        table = make_table(console, f"{name} ({info['size']} bytes)")
        table.add_column("offset", justify="right")
        table.add_column("size", justify="right")
        table.add_column("field")
        table.add_column("meaning", overflow="fold")
        for f in info["fields"]:
            table.add_row(str(f["offset"]), str(f["size"]), escape(f["name"]), escape(f["doc"]))
        console.print(table)


# ---- families ------------------------------------------------------------------------------
def cmd_families(args: argparse.Namespace) -> int:
    """List the model families of the registry (``model_type``: one in full, an alias finds
    its family; unknown: exit 2 naming what the sculptor would assume); ``--json`` every
    field, ``--markdown`` the README's table.

    >>> import contextlib, io, json
    >>> ns = argparse.Namespace(model_type="qwen3_moe", json=True, markdown=False, long=False)
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = cmd_families(ns)
    >>> code, json.loads(out.getvalue())["families"][0]["architecture"]
    (0, 'Qwen3MoeForCausalLM')
    """
    from smoe.cli import families as fam

    chosen = None if args.model_type is None else [fam.lookup(args.model_type)]
    listed = fam.families() if chosen is None else chosen
    if args.json:
        print_json({"schema": FAMILIES_SCHEMA, "families": [fam.family_dict(f) for f in listed]})
    elif args.markdown:
        sys.stdout.write(fam.markdown_table(listed))
    elif chosen is not None:
        fam.render_family(make_console(), chosen[0])
    else:
        fam.render_table(make_console(), long=args.long)
    return 0


# ---- sculpt --------------------------------------------------------------------------------
def cmd_sculpt(args: argparse.Namespace) -> int:
    """Convert a HuggingFace MoE checkpoint (a folder or a model id) into a vault and a scout.

    >>> import contextlib, io, json, tempfile
    >>> from smoe.cli.parser import build_parser
    >>> args = build_parser().parse_args(
    ...     ["sculpt", "fixtures/checkpoints/qwen3_moe", tempfile.mkdtemp(), "--dry-run", "--json"])
    >>> with contextlib.redirect_stdout(io.StringIO()) as out:
    ...     code = cmd_sculpt(args)
    >>> code, json.loads(out.getvalue())["experts"]
    (0, 16)
    """
    from smoe.cli.sculpt_output import finished, target
    from smoe.sculpt import SculptOptions
    from smoe.sculpt.paths import Paths
    from smoe.sculpt.source.hub import resolve

    where = target(args.out_dir, args.name)  # OUT/<stem>.smoe, or OUT itself if it ends .smoe
    # the local folder from here on (a model id resolved to its snapshot in the cache)
    args.model_dir, stem = resolve(args.model_dir, args.revision)
    opts = SculptOptions(
        bits=args.bits,
        version=args.format_version,
        max_layers=args.max_layers,
        max_experts=args.max_experts,
        jobs=args.jobs,
        resume=args.resume,
        dry_run=args.dry_run,
        replace=args.force or args.dry_run,  # a dry run writes nothing: an output is no bar
        scale=args.scale,
        name=where.name if where.name is not None else stem,
        imatrix=args.imatrix,
        calibrate=args.calibrate,
        device=args.device,
        calib_seq_len=args.calib_seq_len,
        calib_max_tokens=args.calib_max_tokens,
        title=args.title,
        description=args.description,
        license=args.license,
    )
    args.out_dir = where.out_dir
    vault = Paths.of(Path(args.model_dir), where.out_dir, opts.name)
    if args.dry_run:
        return _sculpt_dry_run(args, opts, vault.vault)
    if args.resume and not args.force and finished(vault):
        return _sculpt_complete(args, vault.vault)
    summary = _sculpt_with_progress(args, opts, make_console(stderr=True))
    if args.json:
        print_json(summary)
    else:
        _show_summary(summary)
    return 0


def _sculpt_dry_run(args: argparse.Namespace, opts: SculptOptions, vault: Path) -> int:
    """The plan, and where the vault would go: an existing one is said, not refused."""
    from smoe.sculpt import sculpt

    plan = sculpt(args.model_dir, args.out_dir, opts)
    assert isinstance(plan, dict)  # with dry_run: the planned layout
    exists = os.path.lexists(vault)
    if args.json:
        from smoe.sculpt.options import PLAN_SCHEMA

        print_json({"schema": PLAN_SCHEMA, **plan, "vault": str(vault), "vault_exists": exists})
    else:
        _show_dry_run(plan)
        if exists:
            print_notes([f"{vault}: exists; the run itself needs --force to replace it"])
    return 0


def _sculpt_complete(args: argparse.Namespace, vault: Path) -> int:
    """``--resume`` of a run that finished: nothing to resume, nothing written."""
    from smoe.cli.sculpt_output import RESUMED_SCHEMA

    if args.json:
        print_json({"schema": RESUMED_SCHEMA, "vault": str(vault), "complete": True})
    else:
        print_notes([f"{vault}: complete: the run finished, nothing to resume (--force redoes it)"])
    return 0


def _sculpt_with_progress(args: argparse.Namespace, opts: SculptOptions, err: Console) -> dict:
    """Sculpt with a progress bar on a terminal's stderr; the result's summary."""
    from smoe.sculpt import SculptResult, sculpt

    columns = (
        TextColumn("[bold]sculpt[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("experts"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(
        *columns, console=err, transient=True, disable=args.json or not err.is_terminal
    ) as bar:
        task = bar.add_task("sculpt", total=None, rate="")
        start = time.perf_counter()

        def progress(done: int, total: int, bytes_in: int) -> None:
            rate = bytes_in / 1e6 / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=done, total=total, rate=f"{rate:7.1f} MB/s")

        result = sculpt(args.model_dir, args.out_dir, opts, progress=progress)
    assert isinstance(result, SculptResult)  # without dry_run: what was written
    return result.summary()


def _show_dry_run(plan: dict) -> None:
    c = make_console(highlight=True)
    t = make_table(c, "planned vault (nothing written)", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("experts", str(plan["experts"]))
    t.add_row(
        "experts per layer", ", ".join(f"{k}: {v}" for k, v in plan["experts_per_layer"].items())
    )
    t.add_row("blob raw / padded bytes", f"{plan['blob_raw_sizes']} / {plan['blob_padded_sizes']}")
    t.add_row("data_offset", f"{plan['data_offset']:#x} ({plan['data_offset']})")
    t.add_row("arch block at", str(plan["reserved_ext"]) if plan["arch"] else "none (v1)")
    t.add_row("vault size", f"{plan['vault_bytes']:,} bytes")
    t.add_row("scout size", f"{plan['scout_bytes']:,} bytes ({plan['scout_tensors']} tensors)")
    c.print(t)
    if plan["arch"]:
        a = make_table(c, "arch block", show_header=False)
        for k, v in plan["arch"].items():
            a.add_row(k, str(v))
        c.print(a)
    print_warnings(plan["warnings"])


def _show_summary(s: dict) -> None:
    c = make_console(highlight=True)
    c.print(_summary_table(c, s))
    c.print(_snr_table(c, s))
    print_warnings(s["warnings"])


def _summary_table(c: Console, s: dict) -> Table:
    """What a sculpt wrote, read and took."""
    t = make_table(c, "sculpt summary", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("vault", escape(shown(s["vault"])))
    t.add_row("scout", escape(shown(s["scout"])))
    if s.get("config"):
        t.add_row("config", escape(shown(s["config"])))
    t.add_row("experts written", f"{s['experts_written']} (+{s['experts_resumed']} resumed)")
    t.add_row("expert bytes in", f"{s['expert_bytes_in']:,}")
    t.add_row("vault / scout bytes", f"{s['vault_bytes']:,} / {s['scout_bytes']:,}")
    where = s.get("placement")
    if where:  # what went where: a multimodal wrapper's vision tower, projector, lm_head
        t.add_row("to the vault", escape(shown(_placed_experts(where["vault"]))))
        groups = ", ".join(f"{k.rstrip('.')} {n}" for k, n in where["scout"].items())
        t.add_row("to the scout", escape(shown(f"{groups} tensors, unchanged")))
    if s["compression_ratio"]:
        t.add_row("compression", f"{s['compression_ratio']:.2f}x")
    phases = s.get("phases_s")
    split = " (" + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + ")" if phases else ""
    t.add_row("time", f"{s['seconds']:.2f} s{split}")
    if s["throughput_mb_s"]:
        t.add_row("throughput", f"{s['throughput_mb_s']:.1f} MB/s of expert weights")
    im = s.get("imatrix")
    if im:
        data = ", ".join(im["datasets"]) or "an unnamed dataset"  # (text from the file)
        t.add_row("imatrix", escape(shown(f"{im['path']} ({im['chunk_count']} chunks of {data})")))
    cal = s.get("calibration")
    if cal:
        t.add_row("calibration", escape(shown(calibration_line(cal))))
    return t


def calibration_line(cal: dict) -> str:
    """The summary's calibration row: the data, what it reached, what it gained.

    >>> print(calibration_line({"file": "c.npy", "tokens": 4096, "sequences": 16,
    ...     "device": "cpu", "experts_calibrated": 60, "experts_unrouted": 4,
    ...     "tensors_plain_fallback": 0, "median_gain_db": 3.5, "seconds": 12.25}))
    ... # doctest: +NORMALIZE_WHITESPACE
    c.npy: 4,096 tokens in 16 sequences on cpu, 12.2 s; 60 experts calibrated
    (median output SNR +3.50 dB over plain), 4 got no token (plain encoder)
    """
    gain = cal.get("median_gain_db")
    line = (
        f"{cal['file']}: {cal['tokens']:,} tokens in {cal['sequences']} sequences on "
        f"{cal['device']}, {cal['seconds']:.1f} s; {cal['experts_calibrated']} experts calibrated"
    )
    if gain is not None:
        line += f" (median output SNR {gain:+.2f} dB over plain)"
    if cal["experts_unrouted"]:
        line += f", {cal['experts_unrouted']} got no token (plain encoder)"
    if cal["tensors_plain_fallback"]:
        line += f", {cal['tensors_plain_fallback']} tensors kept the plain encoding"
    return line


def _placed_experts(vault: dict) -> str:
    """The vault's line of the placement: how many expert tensors, from where.

    >>> _placed_experts({"tensors": 48, "under": "model.layers."})
    'routed experts: 48 tensors under model.layers.*'
    """
    return f"routed experts: {vault['tensors']} tensors under {vault['under']}*"


def _snr_table(c: Console, s: dict) -> Table:
    """Per tensor kind: the quantisation SNR's min and median (also imatrix-weighted)."""
    weighted = s.get("weighted_snr_db")
    q = make_table(c, "quantisation SNR (dB)")
    q.add_column("tensor")
    q.add_column("min over experts", justify="right")
    q.add_column("median", justify="right")
    if weighted is not None:
        q.add_column("imatrix-weighted min", justify="right")
        q.add_column("median", justify="right")

    def cells(v: dict | None) -> tuple[str, str]:
        return ("-", "-") if v is None else (f"{v['min']:.2f}", f"{v['median']:.2f}")

    for name, v in s["snr_db"].items():
        q.add_row(name, *cells(v), *(cells(weighted.get(name)) if weighted is not None else ()))
    return q


# ---- verify, dump --------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    """Check every rule; exit 0 = no errors, 1 = errors, 2 = unreadable.

    >>> from smoe.cli.parser import build_parser
    >>> cmd_verify(build_parser().parse_args(["verify", "fixtures/q4_v1.smoe"]))
    fixtures/q4_v1.smoe: valid (0 errors, 0 warnings)
    0
    """
    from smoe.format.verify import verify_path

    report = verify_path(args.vault, deep=args.deep, manifest=manifest_choice(args))
    if args.json:
        doc = findings.document(str(args.vault), report.size, args.deep, report.findings)
        print_json(doc)
    else:
        _show_findings(args, report)
    return verdict(report)


def _show_findings(args: argparse.Namespace, report: Report) -> None:
    c = make_console()
    for f in report.findings:
        style = {"error": "bold red", "warning": "yellow", "info": "cyan"}[f.severity]
        c.print(f"[{style}]{escape(shown(f.line()))}[/]", soft_wrap=True)
    n_err, n_warn = len(report.errors), sum(f.severity == "warning" for f in report.findings)
    judged = "[bold green]valid[/]" if report.ok else "[bold red]INVALID[/]"
    c.print(
        f"{escape(shown(args.vault))}: {judged} ({n_err} errors, {n_warn} warnings"
        f"{', deep' if args.deep else ''})",
        soft_wrap=True,
    )


def cmd_dump(args: argparse.Namespace) -> int:
    """Show a vault: summary, header, arch block, table by layer, findings.

    ``--field NAME`` prints one value of the ``--json`` document instead (an unknown name:
    UsageError, exit 2); the exit status is the verdict either way.

    >>> from smoe.cli.parser import build_parser
    >>> cmd_dump(build_parser().parse_args(["dump", "fixtures/q4_v1.smoe"]))
    fixtures/q4_v1.smoe  147,456 bytes  v1  Q4  group 64  data_offset 0x4000  full vault, 8 experts
    ...
    └── findings (0)
    0
    >>> cmd_dump(build_parser().parse_args(
    ...     ["dump", "fixtures/q4_v2.smoe", "--field", "arch.model_type"]))
    olmoe
    0
    """
    from smoe.cli.dump import collect_path, document, field, field_text, render

    dump, report = collect_path(args.vault, deep=args.deep, manifest=manifest_choice(args))
    doc = document(dump)
    if args.field is not None:
        value = field(doc, args.field)
        if args.json:
            print_json(value)
        else:
            sys.stdout.write(field_text(value) + "\n")
    elif args.json:
        print_json(doc)
    else:
        render(dump, make_console(), experts=args.experts, layer=args.layer)
    return verdict(report)


# ---- export --------------------------------------------------------------------------------
EXPORT_SCHEMA = "smoe-export/1"  # the "schema" key of `smoe export --json` (docs/JSON.md)
EXPORT_HF_SCHEMA = "smoe-export-hf/1"  # that of `smoe export --hf --json` (docs/JSON.md)


def cmd_export(args: argparse.Namespace) -> int:
    """Dequantise experts to float32 safetensors, or (--hf) a whole HF checkpoint folder.

    >>> import os, tempfile
    >>> from smoe.cli.parser import build_parser
    >>> out = os.path.join(tempfile.mkdtemp(), "e.safetensors")
    >>> args = build_parser().parse_args(["export", "fixtures/q4_v2.smoe", out, "--layer", "1"])
    >>> cmd_export(args)
    wrote 12 float32 tensors (4 experts) to ...e.safetensors
    0
    """
    if args.hf:
        return _export_hf(args)
    for flag in ("scout", "config", "dtype", "max_shard_size"):
        if getattr(args, flag) is not None:
            return fail(args, f"--{flag.replace('_', '-')} needs --hf (see smoe export --help)", 2)
    if args.rebuild_config:
        return fail(args, "--rebuild-config needs --hf (see smoe export --help)", 2)
    from smoe.export.float32 import export

    names = export(args.vault, args.out, layer=args.layer, expert=args.expert, replace=args.force)
    if args.json:
        print_json({"schema": EXPORT_SCHEMA, "out": str(args.out), "tensors": names})
    else:
        make_console().print(
            f"wrote {len(names)} float32 tensors "
            f"({len(names) // 3} experts) to "
            f"{escape(shown(args.out))}",
            soft_wrap=True,
        )
    return 0


def _export_hf(args: argparse.Namespace) -> int:
    """``smoe export VAULT OUT_DIR --hf``: see :mod:`smoe.export.hf.checkpoint`."""
    from smoe.export.hf.checkpoint import MAX_SHARD_SIZE, export_hf

    if args.layer is not None or args.expert is not None:
        return fail(
            args,
            "--layer/--expert select experts of a float32 export; --hf writes "
            "the whole model (see smoe export --help)",
            2,
        )
    result = export_hf(
        args.vault,
        args.out,
        scout=args.scout,
        config=args.config,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size or MAX_SHARD_SIZE,
        rebuild_config=args.rebuild_config,
        replace=args.force,
    )
    summary = result.summary()
    if args.json:
        print_json({"schema": EXPORT_HF_SCHEMA, **summary})
        return 0
    print_notes(summary["notes"])
    origin = (
        f"copied from {shown(summary['config_path'])}"
        if summary["config"] == "copied"
        else "rebuilt from the arch block and the scout"
    )
    make_console().print(
        f"wrote {escape(shown(args.out))}: {len(summary['files'])} files, "
        f"{summary['tensors']} tensors ({summary['expert_tensors']} expert tensors in "
        f"{summary['dtype']}), {summary['bytes_out'] / 1e6:,.1f} MB; config.json "
        f"{escape(origin)}",
        soft_wrap=True,
    )
    return 0


# ---- upgrade -------------------------------------------------------------------------------
UPGRADE_SCHEMA = "smoe-upgrade/1"  # the "schema" key of `smoe upgrade --json` (docs/JSON.md)


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade a v1 vault to v2 (D7): in place when there is room, else --out NEW.

    >>> import contextlib, io, json, os, tempfile
    >>> from smoe.cli.parser import build_parser
    >>> out = os.path.join(tempfile.mkdtemp(), "v2.smoe")
    >>> args = build_parser().parse_args(["upgrade", "fixtures/q4_v1.smoe", "--out", out,
    ...     "--model", "fixtures/checkpoints/olmoe", "--json"])
    >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
    ...     code = cmd_upgrade(args)
    >>> code, json.loads(printed.getvalue())["mode"], json.loads(printed.getvalue())["schema"]
    (0, 'rewrite', 'smoe-upgrade/1')
    """
    from smoe.vault.upgrade import upgrade

    arch, warnings = _arch_of(args)
    result = upgrade(
        args.vault,
        arch,
        force=args.force,
        out=args.out,
        inputs=[args.config or args.model],
        replace=args.force,
    )
    info = {
        "schema": UPGRADE_SCHEMA,
        "path": str(result.path),
        "mode": result.mode,
        "arch_offset": result.arch_offset,
        "data_offset": result.data_offset,
        "warnings": warnings,
    }
    if args.json:
        print_json(info)
        return 0
    verb = {
        "in-place": "upgraded in place to v2",
        "re-stamp": "re-stamped the arch block of",
        "rewrite": "wrote a v2 copy",
        "current": "already version 2 with this arch block, nothing written",
    }[result.mode]
    make_console().print(
        f"{verb}: {escape(shown(result.path))} (arch block at {result.arch_offset}, "
        f"data_offset {result.data_offset})",
        soft_wrap=True,
    )
    print_warnings(warnings)
    return 0


def _arch_of(args: argparse.Namespace) -> tuple[ArchInfo, list[str]]:
    """The arch block to stamp, from ``--model`` (tensor shapes win) or ``--config``, and
    the warnings of reading it. The vault is opened first (an unreadable one is the error
    shown) and closed on return, before the upgrade writes it."""
    from smoe.families.config import arch_from_config, load_config
    from smoe.sculpt.source.checkpoint import Checkpoint
    from smoe.vault.reader import Vault

    vault = Vault.open(args.vault)
    if args.model is not None:
        ckpt = Checkpoint.open(args.model)
        return ckpt.arch_info(), ckpt.warnings
    rows = int(vault.descriptors[0, 0]["rows"]) if len(vault) else 0
    return arch_from_config(load_config(args.config), str(args.config), rows)


# ---- report --------------------------------------------------------------------------------
def cmd_report(args: argparse.Namespace) -> int:
    """Write one self-contained HTML page picturing a vault; exit status as ``smoe dump``.

    >>> import os, tempfile
    >>> from smoe.cli.parser import build_parser
    >>> out = os.path.join(tempfile.mkdtemp(), "q4.html")
    >>> cmd_report(build_parser().parse_args(["report", "fixtures/q4_v2.smoe", "-o", out]))
    wrote ...q4.html (... bytes): 8 experts in 2 layers, no SNR (no manifest); valid
    0
    """
    from smoe.cli.report import write_report

    result = write_report(
        args.vault, args.out, deep=args.deep, manifest=manifest_choice(args), replace=args.force
    )
    if args.json:
        print_json(result.to_dict())
    else:
        snr = f"SNR from {shown(result.manifest)}" if result.snr else "no SNR (no manifest)"
        errors = f"{result.errors} error{'' if result.errors == 1 else 's'}"
        judged = "valid" if result.ok else f"INVALID ({errors})"
        make_console().print(
            f"wrote {escape(shown(result.path))} ({result.bytes:,} bytes): "
            f"{result.experts:,} experts in {result.layers} layers, {escape(snr)}; {judged}",
            soft_wrap=True,
        )
    return 2 if result.unreadable else (0 if result.ok else 1)


# ---- meta ----------------------------------------------------------------------------------
def cmd_meta(args: argparse.Namespace) -> int:
    """Show a vault's metadata, or edit it (``--set KEY=VALUE``, ``--unset KEY``) in its
    manifest atomically, the blobs and checksums untouched (:mod:`smoe.vault.meta`).

    >>> from smoe.cli.parser import build_parser
    >>> cmd_meta(build_parser().parse_args(["meta", "fixtures/q4_v2.smoe", "--json"]))
    {
      "schema": "smoe-meta/1",
    ...
    0
    """
    from smoe.vault.meta import edit_meta, read_meta

    if args.set or args.unset:
        result = edit_meta(args.vault, dict(args.set), args.unset)
    else:
        result = read_meta(args.vault)
    if args.json:
        print_json(result.to_dict())
        return 0
    c = make_console()
    if args.set or args.unset:
        done = [f"set {', '.join(result.set)}"] if result.set else []
        done += [f"unset {', '.join(result.unset)}"] if result.unset else []
        what = f"updated: {'; '.join(done)}" if result.changed else "unchanged"
        c.print(f"{escape(shown(result.manifest))}: {what}", soft_wrap=True)
        if result.absent:
            has = ", ".join(result.metadata) or "none"
            keys = ", ".join(repr(k) for k in result.absent)
            print_notes([f"{result.manifest}: no key {keys} to unset (it has: {has})"])
        return 0
    if not result.metadata:
        print_notes([f"{result.vault}: no metadata (smoe meta VAULT --set KEY=VALUE adds some)"])
    for key, value in result.metadata.items():
        c.print(f"{key}: {escape(shown(value))}", soft_wrap=True, highlight=False)
    return 0


# ---- warmup --------------------------------------------------------------------------------
WARMUP_SCHEMA = "smoe-warmup/1"  # the "schema" key of `smoe warmup --json`
NUMPY_ONLY = "numpy kernels only (install smoe[fast] for the compiled ones)"


def cmd_warmup(args: argparse.Namespace) -> int:
    """Compile every compiled kernel now (or load it from numba's cache), so that no later
    command compiles; say how long it took. Without numba: numpy kernels only, exit 0.

    >>> import contextlib, io, json
    >>> from unittest import mock
    >>> from smoe.quant import dispatch
    >>> with mock.patch.dict(dispatch._FAST, {"module": None}):  # as if numba were missing
    ...     with contextlib.redirect_stdout(io.StringIO()) as out:
    ...         code = cmd_warmup(argparse.Namespace(json=True))
    >>> code, json.loads(out.getvalue())["kernels"]
    (0, [])
    """
    from smoe import quant

    start = time.perf_counter()
    done = quant.warmup()
    seconds = time.perf_counter() - start
    kernels = [
        {"name": w.name, "compiled": w.compiled, "seconds": round(w.seconds, 3)} for w in done or []
    ]
    damaged, not_kept = quant.cache_notes()
    doc = {
        "schema": WARMUP_SCHEMA,
        "kernels": kernels,
        "seconds": round(seconds, 3),
        "damaged": damaged,
        "not_kept": not_kept,
    }
    if done is None:
        doc["note"] = NUMPY_ONLY
    if args.json:
        print_json(doc)
        return 0
    c = make_console()
    if done is None:
        c.print(NUMPY_ONLY, markup=False, highlight=False, soft_wrap=True)
        return 0
    print_warnings(
        [f"numba's cache: damaged entry {d}" for d in damaged]
        + [f"numba's cache: not kept: {n}" for n in not_kept]
    )
    compiled = sum(w.compiled for w in done)
    how = (
        f"{compiled} compiled now, {len(done) - compiled} loaded from the cache"
        if compiled
        else "all loaded from the cache"
    )
    c.print(f"{len(done)} compiled kernels ready in {seconds:.1f} s ({how})", highlight=False)
    return 0
