"""``smoe export VAULT OUT_DIR --hf``: a runnable HuggingFace checkpoint folder.

The folder holds the scout's tensors byte for byte, every routed expert dequantised under
the names and in the layout of the source checkpoint (:mod:`smoe.export.hf.names`), in shards of
at most ``max_shard_size`` bytes with ``model.safetensors.index.json`` when there are
several (as ``save_pretrained`` writes them), and ``config.json``
(:mod:`smoe.export.hf.transformers_config`).

* **Complete or absent**: everything is written in a temporary folder beside ``OUT_DIR``
  (``.<name>.<hex>.tmp``), each file fsynced, the marker ``smoe-export.json`` last (every
  file with its size and SHA-256: :mod:`smoe.export.hf.folder`), then the folder is renamed
  onto ``OUT_DIR`` (which must not exist, or be an empty folder; with ``--force`` an earlier
  export its marker vouches for) under the lock ``.<name>.lock``; on any error the
  temporary folder is removed.
* **Bounded memory**: vault tensors are decoded ahead by worker threads (one per usable
  core), each of ``2 * threads`` slots holding one tensor in reused buffers; the calling
  thread writes each at its place; scout tensors are copied in chunks.
* **Inputs untouched**: ``OUT_DIR`` may not be, or contain, the vault, its manifest, the
  scout or the config, nor be the checkpoint the vault was sculpted from.
* **Only whole models**: a partial vault (``sculpt --max-layers/--max-experts``) is
  refused, naming the layers and experts it lacks; a manifest that describes another vault
  is refused; each blob's CRC-32C is checked against the manifest as it is read.
* **Another model's inputs refused**: before anything is written, the config
  (:func:`smoe.vault.contradictions.refuse_contradictions`: model type, widths, layer, head and
  expert counts against the arch block, header and descriptors) and the scout
  (:func:`_check_scout`: embedding ``[vocab, d_model]``, the model's layers and no more,
  each MoE layer's router ``[experts, d_model]`` in the block the experts go to), each
  contradiction naming both values.
* **config.json**: copied (``--config``, else ``<stem>.config.json`` beside the vault), or
  rebuilt from the arch block and the scout; a family whose config a vault cannot give
  exactly (``Family.rebuild`` false) is rebuilt only when asked (``rebuild_config``).
* **FP8 sources**: when the manifest records experts dequantised from FP8
  (``experts[].tensors[].fp8``), they are written in BF16 (unless ``dtype``) and the copied
  config loses its ``quantization_config``; a scout that still holds FP8 tensors (or their
  scales) is refused, since the experts would have to be requantised to FP8 to match it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smoe.errors import RefusedInput, UsageError
from smoe.export.hf import folder
from smoe.export.hf import transformers_config as hf_config
from smoe.export.hf.decode import Decoder, expert_tasks
from smoe.export.hf.inputs import refuse_partial, scout_dtype
from smoe.export.hf.names import OutTensor, family_layout, manifest_layout
from smoe.export.hf.output import refuse_outputs, write_folder
from smoe.export.hf.plan import ExportPlan, Sources
from smoe.export.hf.scout import check_scout
from smoe.families.config import parse_json
from smoe.format.records import model_type_str
from smoe.interop.fp8 import FP8_DTYPES
from smoe.interop.safetensors_io import (
    TensorInfo,
    read_header,
)
from smoe.plumbing import fileio
from smoe.plumbing.atomic_folder import AtomicFolder
from smoe.plumbing.cpus import usable_cores
from smoe.plumbing.lock import Lock, lock_for
from smoe.vault.companions import companions
from smoe.vault.contradictions import refuse_contradictions, stated
from smoe.vault.names import load_manifest, natural_key
from smoe.vault.reader import Vault

__all__ = ["MAX_SHARD_SIZE", "HfExportResult", "export_hf"]


MAX_SHARD_SIZE = 5 * 10**9
"""Default bytes of tensor data per shard (``save_pretrained``'s ``max_shard_size`` "5GB")."""


@dataclass
class HfExportResult:
    """What an export wrote; :meth:`summary` is what the CLI prints.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}  # [vocab, H]
    >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
    ...           for i in (0, 1)}  # the routers [experts, H]
    >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
    >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", threads=1)
    >>> result.files, result.tensors, result.expert_tensors, result.dtype
    (['model.safetensors', 'config.json', 'smoe-export.json'], 27, 24, 'F32')
    >>> result.config, result.config_path, result.assumed[1]
    ('rebuilt', None, 'max_position_embeddings 4096')
    """

    out: Path
    files: list[str]
    tensors: int
    expert_tensors: int
    bytes_out: int
    expert_bytes_out: int
    dtype: str
    config: str  # "copied" or "rebuilt"
    seconds: float
    notes: list[str] = field(default_factory=list)
    config_path: Path | None = None  # the config copied (None: rebuilt)
    assumed: list[str] = field(default_factory=list)  # what a rebuilt config assumed

    def summary(self) -> dict[str, Any]:
        """The result as a JSON object (``smoe export --hf --json``), with the throughput.

        >>> import tempfile, numpy as np
        >>> from safetensors.numpy import save_file
        >>> d = tempfile.mkdtemp()
        >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}
        >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
        ...           for i in (0, 1)}
        >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
        >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", threads=1)
        >>> doc = result.summary()
        >>> doc["bytes_out"], doc["config"], doc["config_path"], doc["throughput_mb_s"] > 0
        (280576, 'rebuilt', None, True)
        >>> doc["assumed"][0]
        "rope_type 'default' (no rope scaling)"
        """
        return {
            "out": str(self.out),
            "files": self.files,
            "tensors": self.tensors,
            "expert_tensors": self.expert_tensors,
            "bytes_out": self.bytes_out,
            "expert_bytes_out": self.expert_bytes_out,
            "dtype": self.dtype,
            "config": self.config,
            "config_path": None if self.config_path is None else str(self.config_path),
            "assumed": self.assumed,
            "seconds": self.seconds,
            "throughput_mb_s": (
                self.expert_bytes_out / 1e6 / self.seconds if self.seconds > 0 else None
            ),
            "notes": self.notes,
        }


def export_hf(
    vault_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    scout: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    dtype: str | None = None,
    max_shard_size: int = MAX_SHARD_SIZE,
    threads: int | None = None,
    rebuild_config: bool = False,
    replace: bool = False,
) -> HfExportResult:
    """Write the checkpoint folder ``out_dir`` for ``vault_path`` (see the module docstring).

    ``scout``: default ``<stem>.scout.safetensors`` beside the vault; ``config``: default
    ``<stem>.config.json`` beside it, else rebuilt (refused for a family whose config the
    vault cannot give exactly); ``rebuild_config``: rebuild it, not copy it, even then
    (not with ``config``); ``dtype`` (``bf16``, ``f16``, ``f32``): the experts' dtype,
    default the source's (manifest; BF16 for FP8 sources), else the scout's, else bf16;
    ``threads``: decoding threads (default: the usable cores); ``replace`` (``--force``):
    replace a non-empty ``out_dir`` that an earlier export wrote, as its marker
    ``smoe-export.json`` lists it, else refused (:mod:`smoe.export.hf.folder`; the checkpoint
    the vault was sculpted from always is); the new folder takes its place in one rename.

    >>> import tempfile, numpy as np
    >>> from safetensors.numpy import save_file
    >>> d = tempfile.mkdtemp()
    >>> scout = {"model.embed_tokens.weight": np.zeros((320, 64), np.float32)}  # [vocab, H]
    >>> scout |= {f"model.layers.{i}.mlp.gate.weight": np.zeros((4, 64), np.float32)
    ...           for i in (0, 1)}  # the routers [experts, H]
    >>> save_file(scout, f"{d}/scout.st")  # a scout: the tensors besides the experts
    >>> result = export_hf("fixtures/q4_v2.smoe", f"{d}/hf", scout=f"{d}/scout.st", dtype="bf16")
    >>> sorted(os.listdir(result.out)), result.expert_bytes_out
    (['config.json', 'model.safetensors', 'smoe-export.json'], 98304)
    >>> export_hf("fixtures/partial_vault.smoe", f"{d}/hf2", scout=f"{d}/scout.st")
    Traceback (most recent call last):
    smoe.errors.RefusedInput: fixtures/partial_vault.smoe: a partial vault...: sculpt the model \
again without --max-layers/--max-experts
    """
    t0 = time.perf_counter()
    vault_path, out_dir = Path(vault_path), Path(out_dir)
    _check_options(dtype, threads, max_shard_size)
    if rebuild_config and config is not None:
        raise UsageError(
            "--rebuild-config and --config: choose one (the config.json to copy, or one "
            "rebuilt from the vault)"
        )
    notes: list[str] = []
    with Vault.open(vault_path) as vault:
        src = _open_sources(vault, vault_path, scout)
        experts = _expert_layout(vault, src, notes)
        fp8 = src.fp8_sources
        if fp8:
            _refuse_fp8_scout(src)
        explicit = hf_config.DTYPES[dtype] if dtype is not None else None
        fallback = scout_dtype(src.scout) or "BF16"
        dtypes = {
            n: explicit or o.dtype or ("BF16" if n in fp8 else fallback) for n, o in experts.items()
        }
        cfg = _config_file(vault, src, config, explicit, fallback, notes, rebuild_config)
        check_scout(vault, src, experts, cfg.facts)
        inputs = [vault_path, src.manifest_path, src.scout_path, cfg.path]
        refuse_outputs(out_dir, inputs, replace, src.doc, hashes=False)  # before any work
        plan = ExportPlan.build(src.scout, experts, dtypes, max_shard_size)
        files = _write_checkpoint(
            vault, src, plan, cfg.data, out_dir, inputs, threads, replace, notes
        )
    return HfExportResult(
        out_dir,
        files,
        len(plan.names()),
        len(experts),
        sum(plan.nbytes(n) for n in plan.names()),
        sum(plan.nbytes(n) for n in experts),
        explicit or _common_dtype(dtypes),
        cfg.origin,
        time.perf_counter() - t0,
        notes,
        cfg.path if cfg.origin == "copied" else None,
        cfg.assumed,
    )


def _check_options(dtype: str | None, threads: int | None, max_shard_size: int) -> None:
    """Refuse options no export takes (before any input is read)."""
    if dtype is not None and dtype not in hf_config.DTYPES:
        raise UsageError(f"--dtype: {dtype!r} is not one of {', '.join(hf_config.DTYPES)}")
    if threads is not None and threads < 1:
        raise UsageError(f"threads: must be at least 1, got {threads}")
    if max_shard_size < 1:
        raise UsageError(f"--max-shard-size: must be at least 1 byte, got {max_shard_size}")


def _fp8_scout_tensor(scout: dict[str, TensorInfo]) -> str | None:
    """The first of the scout's tensors (natural name order) that is FP8 or an FP8 scale
    (``*_scale_inv``, ``*weight_scale``), as the refusal names it; None if there is none."""
    for name in sorted(scout, key=natural_key):
        dtype = scout[name].dtype
        if dtype in FP8_DTYPES:
            return f"the FP8 tensor {name!r} ({dtype})"
        if name.endswith(("_scale_inv", "weight_scale")):
            return f"the FP8 scale tensor {name!r}"
    return None


def _refuse_fp8_scout(src: Sources) -> None:
    """A vault whose experts were dequantised from FP8 exports as an unquantised
    checkpoint only: refused if its scout still holds FP8 tensors or scales."""
    found = _fp8_scout_tensor(src.scout)
    if found is None:
        return
    raise RefusedInput(
        f"{src.scout_path}: holds {found}, while the vault's experts were dequantised "
        "from FP8: a checkpoint of both would need the experts requantised to FP8, which "
        "export --hf does not do; convert the scout's FP8 tensors to BF16 first "
        "(dequantised with their scales, the scale tensors removed), then export it "
        "unquantised"
    )


def _open_sources(vault: Vault, vault_path: Path, scout: str | os.PathLike | None) -> Sources:
    """The manifest (checked to describe ``vault``, which must be whole) and the scout's
    header (``scout``, default the one beside the vault; checked to belong to its model
    by :func:`check_scout` once the config is known)."""
    doc, manifest_path = load_manifest(vault)
    refuse_partial(vault, doc)
    scout_path = Path(scout) if scout is not None else companions(vault_path)[0]
    if scout is None and not os.path.lexists(scout_path):
        raise RefusedInput(
            f"{vault_path}: no scout beside it (looked for {scout_path.name}, "
            "which the sculptor writes); name it with --scout"
        )
    return Sources(vault_path, doc, manifest_path, scout_path, read_header(scout_path))


def _expert_layout(vault: Vault, src: Sources, notes: list[str]) -> dict[str, OutTensor]:
    """The output's expert tensors: the source's names and layout (manifest), else the
    family's standard names (noted); refused if the scout already has one of them."""
    experts = manifest_layout(vault, src.doc, src.manifest_path) if src.doc is not None else None
    if experts is None:
        model_type = "" if vault.arch is None else model_type_str(vault.arch["model_type"])
        experts = family_layout(vault, set(src.scout), model_type)
        first = next(iter(experts))
        why = (
            "no manifest beside the vault"
            if src.doc is None
            else f"{src.manifest_path.name} records no source tensors"
        )
        notes.append(
            f"{why}: experts named as the family's checkpoints name them "
            f"({first.replace('.0.', '.{L}.', 1)} ...)"
        )
    clash = sorted(set(experts) & set(src.scout))
    if clash:
        raise RefusedInput(
            f"{src.scout_path}: already has {clash[0]!r}, which the vault's experts "
            "would write: the scout belongs to another vault"
        )
    return experts


def _common_dtype(dtypes: dict[str, str]) -> str:
    """The experts' one dtype, or ``mixed``."""
    return dtypes[next(iter(dtypes))] if len(set(dtypes.values())) == 1 else "mixed"


@dataclass
class _ConfigFile:
    """The config.json to write: its bytes, where they came from (``copied`` or
    ``rebuilt``), the path of the copied (or looked-for) config, what a rebuild assumed,
    and what the config says of the vault's shapes (:func:`smoe.vault.contradictions.stated`)."""

    data: bytes
    origin: str
    path: Path
    assumed: list[str] = field(default_factory=list)
    facts: dict[str, tuple[str, Any]] = field(default_factory=dict)


def _config_file(
    vault: Vault,
    src: Sources,
    config: str | os.PathLike | None,
    explicit: str | None,
    fallback: str,
    notes: list[str],
    rebuild_config: bool = False,
) -> _ConfigFile:
    """``config`` (default the one beside the vault) copied, its dtype set to ``explicit``
    (``--dtype``) if given and its ``quantization_config`` dropped for FP8 sources, and
    refused where it contradicts the vault
    (:func:`smoe.vault.contradictions.refuse_contradictions`);
    without one, or with ``rebuild_config``, rebuilt from the arch block and the scout for
    ``explicit`` or else ``fallback`` (noting what it assumed; refused for a family whose
    config cannot be rebuilt exactly unless ``rebuild_config``)."""
    vault_path = src.vault_path
    cfg_path = Path(config) if config is not None else companions(vault_path)[1]
    if not rebuild_config and (config is not None or os.path.lexists(cfg_path)):
        data, more = hf_config.copied(cfg_path, explicit, unquantised=bool(src.fp8_sources))
        scout_fp8 = _fp8_scout_tensor(src.scout) is not None
        hf_config.check_quantization(cfg_path, src.doc, src.manifest_path, scout_fp8)
        doc = parse_json(data, cfg_path)
        refuse_contradictions(doc, cfg_path, vault)
        notes += more
        return _ConfigFile(data, "copied", cfg_path, facts=stated(doc, cfg_path))
    cfg, assumed = hf_config.rebuild(vault, src.scout, explicit or fallback, inexact=rebuild_config)
    why = (
        "--rebuild-config"
        if rebuild_config
        else f"no {cfg_path.name} beside the vault, no --config"
    )
    notes.append(
        f"config.json rebuilt from {vault_path.name}'s arch block and the "
        f"scout's shapes ({why}); assumed: {', '.join(assumed)}"
    )
    return _ConfigFile(
        hf_config.json_bytes(cfg), "rebuilt", cfg_path, assumed, stated(cfg, cfg_path)
    )


def _write_checkpoint(
    vault: Vault,
    src: Sources,
    plan: ExportPlan,
    config_bytes: bytes,
    out_dir: Path,
    inputs: list[Path],
    threads: int | None,
    replace: bool = False,
    notes: list[str] | None = None,
) -> list[str]:
    """Decode the experts in ``threads`` threads (default: the usable cores) while the
    folder is written and put in place; the names of the files written."""
    threads = usable_cores() if threads is None else threads
    decoder = Decoder(vault, src.crcs, src.manifest_path, expert_tasks(plan), threads)

    def write(tmp: Path) -> list[str]:
        with folder.Hashes(tmp) as hashes:  # each tensor hashed while the next is written
            files = write_folder(tmp, plan, decoder, config_bytes, hashes)
            folder.write_marker(tmp, files, src.vault_path.name, hashes)
        return [*files, folder.MARKER]

    try:
        return _commit_folder(out_dir, write, inputs, replace, src.doc, notes)
    finally:
        decoder.close()


def _commit_folder(
    out_dir: Path,
    write: Callable[[Path], list[str]],
    inputs: list[Path],
    replace: bool = False,
    doc: dict[str, Any] | None = None,
    notes: list[str] | None = None,
) -> list[str]:
    """Run ``write(tmp)`` in a temporary folder beside ``out_dir``, then rename it onto
    ``out_dir`` (``replace``: an earlier export there, checked again right before, is first
    moved aside, then only the files its marker lists are removed:
    :mod:`smoe.export.hf.folder`); under ``.<name>.lock``; the temporary folder is removed
    on any failure. An aside folder that keeps a file which appeared meanwhile is named in
    ``notes``."""
    parent = fileio.ensure_dir(out_dir.parent if str(out_dir.parent) else Path("."))
    with Lock(lock_for(parent / out_dir.name), out_dir):
        folder.sweep(out_dir)
        earlier = refuse_outputs(out_dir, inputs, replace, doc)  # again, under the lock
        with AtomicFolder(out_dir, folder.remove_written) as staged:
            files = write(staged.tmp)
            old = staged.commit(
                lambda: folder.move_aside(earlier) if earlier is not None else None,
                folder.put_back,
            )
        if old is not None and earlier is not None:
            left = folder.remove_earlier(old, earlier)
            if left and notes is not None:
                notes.append(
                    f"{old}: the earlier export, moved aside, is kept: it holds {left[0]!r}, "
                    "which appeared in it while this export ran"
                )
    return files
