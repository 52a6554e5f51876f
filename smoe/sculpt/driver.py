"""The run of one sculpt, step by step (the protocol is in :mod:`smoe.sculpt`): open and
check the inputs, plan, then under the lock resume, quantise every expert, stage the
companions and commit."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from smoe.errors import RefusedInput, StoppedResumable
from smoe.families.config import config_object, parse_json, read_small
from smoe.format.plan import Plan, Shape, make_plan
from smoe.format.records import ArchInfo, ModelInfo, metadata_bytes
from smoe.interop.safetensors_io import write_streaming
from smoe.plumbing import fileio
from smoe.plumbing.atomic import AtomicFile, sweep_stale
from smoe.plumbing.lock import Lock
from smoe.sculpt.calibrate.run import (
    RUN_FIGURES,
    CalibrationInputs,
    calibrate_layers,
)
from smoe.sculpt.inputs import (
    check_calibrate_options,
    open_calibration,
    open_imatrix,
    resolve_jobs,
    select,
)
from smoe.sculpt.journal import Entry, Journal, fingerprint
from smoe.sculpt.options import SculptOptions, SculptResult
from smoe.sculpt.outcome import ExpertOutcome, TensorOutcome
from smoe.sculpt.paths import Paths, checkpoint_inputs
from smoe.sculpt.provenance import metadata_of, provenance, tensor_entries
from smoe.sculpt.resume import Resumed, keep_verified
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef
from smoe.sculpt.workers import Job, Target, run_jobs
from smoe.vault.writer import State, VaultWriter
from smoe_gen import layout

if TYPE_CHECKING:
    from smoe.sculpt.calibrate.data import CalibrationData
    from smoe.sculpt.source.imatrix import ImportanceMatrix

__all__ = ["Run", "dry_run_plan", "sculpt", "stage_config"]

Progress = Callable[[int, int, int], None]
"""``progress(done, total, bytes_in)``, called after every expert this run writes: ``done``
of ``total`` experts are in the vault, their source matrices ``bytes_in`` bytes (the
experts a resume kept included: it read and verified them)."""


def sculpt(
    model_dir: str | Path,
    out_dir: str | Path,
    opts: SculptOptions,
    progress: Progress | None = None,
) -> SculptResult | dict:
    """Convert; returns a SculptResult, or the planned layout (a dict) with ``dry_run``.

    ``progress(done, total, bytes_in)`` is called after every expert.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> res = sculpt("fixtures/checkpoints/qwen3_moe", out, SculptOptions(bits=2, jobs=1))
    >>> sorted(p.name for p in Path(out).iterdir())  # doctest: +NORMALIZE_WHITESPACE
    ['qwen3_moe.config.json', 'qwen3_moe.scout.safetensors', 'qwen3_moe.smoe',
     'qwen3_moe.smoe.manifest.json']
    >>> plan = sculpt("fixtures/checkpoints/qwen3_moe", out, SculptOptions(dry_run=True))
    >>> plan["experts"], plan["vault_bytes"]
    (16, 278528)
    """
    t0 = time.perf_counter()
    jobs = resolve_jobs(opts.jobs)
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    run = Run.open(model_dir, opts, jobs, progress, t0)
    try:
        return _sculpt_checked(run, model_dir, out_dir)
    finally:
        run.close()


@dataclass
class Run:
    """One sculpt's inputs, opened and checked before anything is written: the checkpoint,
    the experts chosen, the model's header facts, the importance matrix (if any); and how
    the run goes (options, worker count, progress callback, start time).

    >>> run = Run.open(Path("fixtures/checkpoints/qwen3_moe"), SculptOptions(max_layers=1), 1)
    >>> len(run.refs), run.model.d_model, run.weighted
    (8, 64, False)
    >>> run.close()
    """

    ckpt: Checkpoint
    refs: list[ExpertRef]
    model: ModelInfo
    opts: SculptOptions
    jobs: int
    progress: Progress | None = None
    t0: float = field(default_factory=time.perf_counter)
    imatrix: ImportanceMatrix | None = None
    imatrix_warning: str | None = None
    calibration: CalibrationData | None = None
    source: dict[str, Any] | None = None
    """The manifest's ``source`` record (the calibration's counts join it at the end)."""

    @classmethod
    def open(
        cls,
        model_dir: Path,
        opts: SculptOptions,
        jobs: int,
        progress: Progress | None = None,
        t0: float | None = None,
    ) -> Run:
        """Open the checkpoint, choose the experts and open the importance matrix: a wrong
        file is refused here, before anything is written (``t0``: when the run started;
        default now).

        >>> Run.open(Path("fixtures/checkpoints/olmoe"), SculptOptions(), 1).imatrix is None
        True
        """
        check_calibrate_options(opts)
        ckpt = Checkpoint.open(model_dir)
        refs = select(ckpt, opts)
        model = ckpt.model_info()
        run = cls(
            ckpt, refs, model, opts, jobs, progress, time.perf_counter() if t0 is None else t0
        )
        if opts.imatrix is not None:
            run.imatrix, run.imatrix_warning = open_imatrix(
                opts.imatrix, refs, model.max_experts_per_layer
            )
        if opts.calibrate is not None:
            run.calibration = open_calibration(ckpt, opts, model.vocab_size)
        return run

    @property
    def weighted(self) -> bool:
        """Whether the experts are quantised with an importance matrix.

        >>> Run.open(Path("fixtures/checkpoints/olmoe"), SculptOptions(), 1).weighted
        False
        """
        return self.imatrix is not None

    @property
    def calibration_record(self) -> dict[str, Any] | None:
        """The calibration data's record and how it runs, or None.

        >>> Run.open(Path("fixtures/checkpoints/olmoe"), SculptOptions(), 1).calibration_record
        """
        if self.calibration is None:
            return None
        return self.calibration.record() | {"device": self.opts.device}

    @property
    def record(self) -> dict[str, Any] | None:
        """The importance matrix's record for the summary and the manifest, or None.

        >>> opts = SculptOptions(imatrix="fixtures/imatrix_tiny.dat")
        >>> Run.open(Path("fixtures/checkpoints/olmoe"), opts, 1).record["format"]
        'dat'
        """
        return self.imatrix.info.as_json() if self.imatrix is not None else None

    def inputs(self) -> list[Path]:
        """Every file the run reads: the checkpoint's and the importance matrix.

        >>> run = Run.open(Path("fixtures/checkpoints/qwen3_moe"), SculptOptions(), 1)
        >>> [p.name for p in run.inputs()]
        ['config.json', 'model.safetensors']
        """
        extra = [self.imatrix.path] if self.imatrix is not None else []
        if self.calibration is not None:
            extra.append(self.calibration.path)
        return checkpoint_inputs(self.ckpt) + extra

    def warnings(self) -> list[str]:
        """The checkpoint's warnings so far, then the importance matrix's.

        >>> Run.open(Path("fixtures/checkpoints/qwen3_moe"), SculptOptions(), 1).warnings()
        []
        """
        return self.ckpt.warnings + ([self.imatrix_warning] if self.imatrix_warning else [])

    def close(self) -> None:
        """Close the importance matrix (the checkpoint holds no open files).

        >>> Run.open(Path("fixtures/checkpoints/olmoe"), SculptOptions(), 1).close()
        """
        if self.imatrix is not None:
            self.imatrix.close()


def _sculpt_checked(run: Run, model_dir: Path, out_dir: Path) -> SculptResult | dict:
    """:func:`sculpt` once the inputs are open and checked: plan, then the run proper under
    the lock."""
    opts = run.opts
    arch = run.ckpt.arch_info() if opts.version >= layout.VERSION_WITH_ARCH else None
    paths = Paths.of(model_dir, out_dir, opts.name)
    paths.refuse_inputs(run.inputs())
    paths.check_slots(replace=opts.replace)  # what would fail only at the commit, refused now
    record = run.record
    writer = _new_writer(run, arch, paths, record)
    shapes = {(r.layer, r.expert): cast("tuple[Shape, Shape, Shape]", r.shapes) for r in run.refs}
    plan0 = make_plan(shapes, opts.bits, opts.version)  # (an ExpertRef has three matrices)
    warnings = run.warnings()
    if opts.dry_run:
        return _dry_run(run, plan0, arch, record, warnings)
    fileio.ensure_dir(out_dir)
    with Lock(paths.lock, paths.vault):
        if not opts.replace:  # again, under the lock: another run may have finished meanwhile
            fileio.refuse_existing(paths.vault)
        for staged in (paths.scout, paths.config, paths.manifest, paths.vault):
            sweep_stale(staged)  # temporary files of a killed run (the partial is kept)
        fp = fingerprint(
            run.ckpt,
            run.refs,
            metadata_bytes(plan0, run.model, arch),
            opts,
            run.imatrix.info.sha256 if run.imatrix is not None else None,
            run.calibration_record,
        )
        result = _sculpt_locked(run, writer, paths, fp)
    result.warnings = warnings + result.warnings  # then the resume's own
    result.imatrix = record
    return result


def _new_writer(
    run: Run, arch: ArchInfo | None, paths: Paths, record: dict[str, Any] | None
) -> VaultWriter:
    """The vault's writer, every chosen expert declared, its manifest's provenance set."""
    opts = run.opts
    tool, source = provenance(run.ckpt, opts, record, run.calibration_record)
    run.source = source
    writer = VaultWriter(
        paths.vault,
        run.model,
        bits=opts.bits,
        version=opts.version,
        arch=arch,
        scale=opts.scale,
        partial=paths.partial,
        tool=tool,
        source=source,
        metadata=metadata_of(opts),
        replace=opts.replace,
    )
    for ref in run.refs:
        writer.add_expert(ref.layer, ref.expert, ref.shapes)
    return writer


def _dry_run(
    run: Run,
    plan: Plan,
    arch: ArchInfo | None,
    record: dict[str, Any] | None,
    warnings: list[str],
) -> dict:
    """``--dry-run``'s answer: the planned layout, the header facts and the warnings."""
    scout_bytes = sum(t.nbytes for t in run.ckpt.non_expert_tensors())
    info = dry_run_plan(run.ckpt, plan, scout_bytes, run.refs)
    info["arch"] = asdict(arch) if arch else None
    info["model"] = asdict(run.model)
    if record is not None:
        info["imatrix"] = record
    if run.calibration is not None:
        info["calibration"] = run.calibration_record
    info["warnings"] = warnings
    return info


def dry_run_plan(ckpt: Checkpoint, plan: Plan, scout_bytes: int, refs: list[ExpertRef]) -> dict:
    """The layout a run would write: experts, blob sizes, offsets and file sizes.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> refs = select(ck, SculptOptions())
    >>> plan = make_plan({(r.layer, r.expert): r.shapes for r in refs}, 4, 2)
    >>> info = dry_run_plan(ck, plan, 0, refs)
    >>> info["experts_per_layer"], info["vault_bytes"]
    ({0: 8, 1: 8}, 278528)
    """
    per_layer: dict[int, int] = {}
    for ref in refs:
        per_layer[ref.layer] = per_layer.get(ref.layer, 0) + 1
    sizes = sorted({e.padded_size for e in plan.experts})
    return {
        "experts": len(plan.experts),
        "experts_per_layer": per_layer,
        "blob_padded_sizes": sizes,
        "blob_raw_sizes": sorted({e.raw_size for e in plan.experts}),
        "data_offset": plan.data_offset,
        "reserved_ext": plan.reserved_ext,
        "vault_bytes": plan.file_size,
        "scout_bytes": scout_bytes,
        "scout_tensors": len(ckpt.non_expert_tensors()),
    }


# ---- under the lock ------------------------------------------------------------------------
@dataclass
class _Tally:
    """The experts of the vault so far, those kept by ``--resume`` first (with the values
    recomputed from their blobs, :func:`keep_verified`), then those this run writes, as
    written (their SNR and weighted SNR per tensor); the bytes of their
    source matrices (``bytes_in``: what the summary's compression ratio and throughput
    count; a resume reads every kept expert's sources too, to verify it); experts done."""

    done: int = 0
    experts: list[ExpertOutcome] = field(default_factory=list)
    bytes_in: int = 0

    def add(self, outcome: ExpertOutcome) -> None:
        self.experts.append(outcome)
        self.bytes_in += outcome.source_bytes
        self.done += 1

    @classmethod
    def of(cls, resumed: Resumed) -> _Tally:
        """The tally of the experts a resume kept, in (layer, expert) order."""
        tally = cls()
        for key, entry in sorted(resumed.kept.items()):
            tally.add(entry.outcome(key, resumed.source_bytes[key]))
        return tally


@dataclass
class _Locked:
    """The run under the lock: its writer and paths, and what it has open or staged (kept
    or removed when it stops early)."""

    run: Run
    writer: VaultWriter
    paths: Paths
    journal: Journal | None = None
    scout: AtomicFile | None = None
    config: AtomicFile | None = None
    warnings: list[str] = field(default_factory=list)
    """The run's own warnings (the resume's), after the inputs'."""

    def resume(self, fp: str) -> tuple[Plan, Resumed]:
        """Open the journal, begin the vault (keeping the partial when there is something to
        resume) and adopt every journaled expert the partial and the sources bear out; the
        journal restarts with those kept, as recomputed. Journal lines that their blobs
        contradict get one warning."""
        run, writer = self.run, self.writer
        journal = self.journal = Journal(self.paths.journal)
        resuming = run.opts.resume and os.path.lexists(self.paths.partial)
        done = journal.read(fp, len(run.refs)) if resuming else {}
        plan = writer.begin(keep=bool(done))
        resumed = (
            keep_verified(writer, run.refs, done, run.jobs, run.imatrix) if done else Resumed()
        )
        journal.start(fp, resumed.kept)
        if resumed.warning is not None:
            self.warnings.append(resumed.warning)
        return plan, resumed

    def quantise(self, todo: list[Job], resumed: Resumed, marks: dict[str, float]) -> _Tally:
        """Quantise and write ``todo``; each finished expert is adopted by the writer and
        journaled at once (``resumed``: the experts already done; ``marks``: see
        :func:`run_jobs`)."""
        run, writer, journal = self.run, self.writer, self.journal
        assert journal is not None  # opened by resume()
        target = Target(str(writer.partial_path), str(self.paths.vault), writer.partial_identity)
        by_key = {(r.layer, r.expert): r for r in run.refs}
        tally = _Tally.of(resumed)
        results = run_jobs(todo, run.jobs, target, marks)
        try:
            for outcome in results:
                entries = tensor_entries(by_key[outcome.key], outcome.tensors, run.weighted)
                writer.adopt(*outcome.key, outcome.blob_crc, entries)
                journal.append(Entry.of(outcome, run.weighted).line(outcome.key))
                tally.add(outcome)
                if run.progress:
                    run.progress(tally.done, len(run.refs), tally.bytes_in)
        finally:
            results.close()  # stops the worker pool at once on an error
        return tally

    def quantise_calibrated(
        self, todo: list[Job], resumed: Resumed, marks: dict[str, float], plan: Plan
    ) -> tuple[_Tally, dict[str, Any]]:
        """``--calibrate``: layer by layer, the runner's statistics of every expert, then
        its blob by the Hessian-aware encoder (workers as for any run), then the layer run
        again on the blobs as written, for the next layer's inputs. A resume's kept experts
        are read back from the partial and their estimates recomputed. Returns the tally and
        the calibration's record."""
        run, writer = self.run, self.writer
        assert self.journal is not None and run.calibration is not None
        target = Target(str(writer.partial_path), str(self.paths.vault), writer.partial_identity)
        by_key = {(r.layer, r.expert): r for r in run.refs}
        sink = _CalibratedSink(self, _Tally.of(resumed), target, resumed, by_key)
        inputs = CalibrationInputs(
            ckpt=run.ckpt,
            refs=run.refs,
            ids=run.calibration.ids,
            bits=run.opts.bits,
            device=run.opts.device,
            todo=todo,
            kept=set(resumed.kept),
            slots={e.key: e for e in plan.experts},
            partial=writer.partial_path,
        )
        marks["experts"] = time.perf_counter()  # the calibration's passes are the work
        record = calibrate_layers(inputs, sink)
        record = (run.calibration_record or {}) | record
        if run.source is not None:  # the manifest: the same for two runs of one command
            run.source["calibration"] = {k: v for k, v in record.items() if k not in RUN_FIGURES}
        return sink.tally, record

    def commit(self) -> int:
        """Stage the scout and the config copy and commit them with the vault; the scout's
        size."""
        scout_bytes, self.scout = write_streaming(
            self.paths.scout,
            self.run.ckpt.non_expert_tensors(),
            metadata={"format": "pt"},
            stage=True,
        )
        self.config = stage_config(self.run.ckpt, self.paths.config)
        self.writer.commit([self.scout, self.config])
        return scout_bytes

    def _abort_staged(self) -> None:
        for staged in (self.scout, self.config):
            if staged is not None:
                staged.abort()

    def interrupted(self) -> None:
        """Ctrl-C, or a refusal found mid-run that ``--resume`` can continue from
        (:class:`~smoe.errors.StoppedResumable`): the partial and the journal stay."""
        self.writer.suspend()
        self._abort_staged()
        if self.journal is not None:
            self.journal.close(remove=False)

    def failed(self) -> None:
        """Any other error: nothing of the run is left."""
        self._abort_staged()
        if self.writer.state is not State.COMMITTED:
            self.writer.abort()
        if self.journal is not None:
            self.journal.close(remove=True)

    def finished(self) -> None:
        """The vault is committed: the journal goes."""
        if self.journal is not None:
            self.journal.close(remove=True)


@dataclass
class _CalibratedSink:
    """A calibrated run's experts into the writer and the journal (the
    :class:`~smoe.sculpt.calibrate.run.CalibrationSink` of :func:`calibrate_layers`): what
    the workers wrote waits in ``pending`` until the run has its estimates."""

    locked: _Locked
    tally: _Tally
    target: Target
    resumed: Resumed
    by_key: dict[tuple[int, int], ExpertRef]
    pending: dict[tuple[int, int], ExpertOutcome] = field(default_factory=dict)

    def write(self, jobs: list[Job]) -> dict[tuple[int, int], list[Any]]:
        reports: dict[tuple[int, int], list[Any]] = {}
        results = run_jobs(jobs, self.locked.run.jobs, self.target)
        try:
            for outcome in results:
                reports[outcome.key] = outcome.reports or [None, None, None]
                self.pending[outcome.key] = outcome
        finally:
            results.close()
        return reports

    def _entries(
        self, key: tuple[int, int], tensors: Sequence[TensorOutcome], estimates: list[Any]
    ) -> list[dict[str, Any]]:
        out = tensor_entries(self.by_key[key], tensors)
        for entry, est in zip(out, estimates):
            if est is not None:
                entry.update(est.entry())
        return out

    def adopt(self, key: tuple[int, int], estimates: list[Any]) -> None:
        run, writer, journal = self.locked.run, self.locked.writer, self.locked.journal
        assert journal is not None
        outcome = self.pending.pop(key).unweighted()  # a calibrated run weighs by no imatrix
        writer.adopt(*key, outcome.blob_crc, self._entries(key, outcome.tensors, estimates))
        journal.append(Entry.of(outcome, weighted=False).line(key))
        self.tally.add(outcome)
        if run.progress:
            run.progress(self.tally.done, len(run.refs), self.tally.bytes_in)

    def annotate(self, key: tuple[int, int], estimates: list[Any]) -> None:
        kept = self.resumed.kept[key]  # adopted by the resume: its entries gain the estimates
        self.locked.writer.annotate(*key, self._entries(key, kept.tensors, estimates))


def _sculpt_locked(run: Run, writer: VaultWriter, paths: Paths, fp: str) -> SculptResult:
    """The run proper, under the lock: see :mod:`smoe.sculpt` for the protocol."""
    locked = _Locked(run, writer, paths)
    try:
        plan, resumed = locked.resume(fp)
        kept = resumed.kept
        slots = {e.key: e for e in plan.experts}
        todo = [
            Job(ref, slots[(ref.layer, ref.expert)], run.opts.bits, run.opts.scale, run.imatrix)
            for ref in run.refs
            if (ref.layer, ref.expert) not in kept
        ]
        marks: dict[str, float] = {}
        if run.calibration is not None:
            tally, calibrated = locked.quantise_calibrated(todo, resumed, marks, plan)
        else:
            tally, calibrated = locked.quantise(todo, resumed, marks), None
        marks["commit"] = time.perf_counter()
        scout_bytes = locked.commit()
    except (KeyboardInterrupt, StoppedResumable):
        locked.interrupted()
        raise
    except BaseException:
        locked.failed()
        raise
    locked.finished()
    end = time.perf_counter()
    start = marks.get("experts", marks["commit"])
    return SculptResult(
        paths.vault,
        paths.scout,
        len(todo),
        len(kept),
        tally.bytes_in,
        plan.file_size,
        scout_bytes,
        end - run.t0,
        tuple(tally.experts),
        locked.warnings,
        bits=run.opts.bits,
        weighted=run.weighted,
        config=paths.config,
        placement=run.ckpt.placement(),
        calibration=calibrated,
        phases={
            "setup": start - run.t0,
            "experts": marks["commit"] - start,
            "commit": end - marks["commit"],
        },
    )


def stage_config(ckpt: Checkpoint, path: Path) -> AtomicFile:
    """The checkpoint's config.json, byte for byte, staged as ``path`` (committed with the
    vault; ``smoe export --hf`` copies it). A config.json that no longer says what it said
    when the checkpoint was opened is refused.

    >>> import tempfile
    >>> ckpt = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> staged = stage_config(ckpt, Path(tempfile.mkdtemp()) / "qwen3_moe.config.json")
    >>> _ = staged.commit()
    >>> staged.path.read_bytes() == (ckpt.root / "config.json").read_bytes()
    True
    """
    src = ckpt.root / "config.json"
    raw = read_small(src)
    if config_object(parse_json(raw, src), src) != ckpt.config:
        raise RefusedInput(f"{src}: changed while sculpting; refused")
    staged = AtomicFile(path)
    try:
        staged.pwrite(raw, 0)
    except BaseException:
        staged.abort()
        raise
    return staged
