"""The Sculptor: a HuggingFace MoE checkpoint -> ``<stem>.smoe`` + scout + manifest + config.

Pipeline: open the checkpoint (config + safetensors headers only) -> choose the experts
-> plan every offset -> workers quantise experts and write each blob at its planned
offset in a fixed-name partial file, the parent journals every finished expert -> stage
the scout (streamed tensor by tensor) and a byte-for-byte copy of config.json -> write
header, table, descriptors and arch block, stage the manifest -> fsync all four -> rename
scout, config, manifest, then the vault.

Nothing lost, nothing silently wrong:

* **One writer per target**: an exclusive lock on ``.<stem>.smoe.lock`` is held for the
  whole run (taken before the partial or journal is touched; the worker processes inherit
  it and die with the parent); a second run stops at once naming the holder's pid.
* **No link followed**: the partial (``.<stem>.smoe.partial``), the journal and the lock
  are opened with :func:`smoe.plumbing.fileio.open_owned` (a symlink or foreign file there is
  refused, not followed, not deleted); the outputs are renamed onto their final names,
  never opened through them. No output may be one of the checkpoint's files.
* **Checked writes**: every write loops on short writes and every error (ENOSPC, EIO, ...)
  ends the run with one SmoeError line naming the file; the partial and the journal are
  removed (kept for ``--resume`` on KeyboardInterrupt only) and no output appears.
* **Commit order**: the vault's partial, the staged scout, config copy and manifest are
  fsynced; the scout is renamed, then the config copy, then the manifest, then the vault
  LAST: the vault's appearance is the commit point. If a rename fails, the companions
  already renamed are removed again. A kill between two renames leaves some companions
  without a vault, plus the partial and the journal, so ``--resume`` completes the run.
  A config.json that changed since the checkpoint was opened is refused at the commit.
  The journal is removed after the vault's rename.

``--resume`` decides by content. The journal ``.<stem>.smoe.journal`` is text::

    smoe-journal/2 <fingerprint>
    <layer> <expert> <blob crc32c> <gate, up, down source crc32c> <gate, up, down SNR dB>

one line per finished expert (SNR ``-`` when it has no finite value; with ``--imatrix``
three more fields, the importance-weighted SNR of gate, up, down). The fingerprint
(SHA-256) covers the planned metadata, the options that shape the bytes (and the
importance matrix's SHA-256), the tool version and every source tensor's name, dtype,
shape, place and shard name (no mtimes).
The journal is a hint, never a source of truth: an expert is kept only if its blob's
CRC-32C matches the partial file, no tensor of the blob is all zero bytes (what a blob
never written holds; the encoder never writes that), the CRC-32C of its source bytes,
re-read now, matches the journal, AND every SNR recomputed from the blob against those
sources equals the journal's; anything else is redone (an edited line is counted in one
warning). The manifest and summary take the recomputed values, and the summary's bytes in
and compression count every expert in the vault. A resumed run is byte-identical to a
clean one (vault, scout, config copy and manifest).

``--imatrix FILE`` (a llama.cpp importance matrix, :mod:`smoe.sculpt.source.imatrix`): opened and
mapped onto the chosen experts before any work (a file of another model is refused; the expert
tensors it has no data for are quantised unweighted, named in one warning); each worker
reads its expert's per-column importance and the encoder minimises the error weighted by
it (:func:`smoe.quant.encode`). The summary and the manifest record the file (hashes,
datasets, chunk count) and per tensor the importance-weighted SNR beside the plain one.

The modules, one role each: :mod:`~smoe.sculpt.options` (what is asked, what was done),
:mod:`~smoe.sculpt.inputs` (experts chosen, worker count, importance matrix opened),
:mod:`~smoe.sculpt.paths` (the files in OUT_DIR), :mod:`~smoe.sculpt.provenance` (the
manifest's provenance), :mod:`~smoe.sculpt.workers` (quantising and writing the experts,
in worker processes), :mod:`~smoe.sculpt.journal` (``--resume``'s journal file),
:mod:`~smoe.sculpt.resume` (what of it the partial file and the sources bear out),
:mod:`~smoe.sculpt.driver` (the run, step by step); the readers of what a sculpt reads
are :mod:`~smoe.sculpt.source`, :mod:`~smoe.sculpt.expert_reader` and
:mod:`~smoe.sculpt.blob_writer`.
"""

from __future__ import annotations

from smoe.sculpt.driver import sculpt
from smoe.sculpt.inputs import select
from smoe.sculpt.options import SculptOptions, SculptResult
from smoe.sculpt.paths import Paths, outputs
from smoe.sculpt.workers import Job, file_order, quantise_expert
from smoe.vault.companions import companions

__all__ = [
    "Job",
    "Paths",
    "SculptOptions",
    "SculptResult",
    "companions",
    "file_order",
    "outputs",
    "quantise_expert",
    "sculpt",
    "select",
]
