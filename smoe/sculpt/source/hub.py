"""A model argument of ``smoe sculpt``: a checkpoint folder or a HuggingFace model id, and the
stem the outputs are named by.

:func:`resolve` turns ``ORG/NAME`` into a local folder with ``huggingface_hub`` (the optional
``smoe[hub]`` extra, imported only for an id). A path that exists always wins over an id. An
id is taken from the HuggingFace cache without any network access when the cached snapshot
holds ``config.json`` and the safetensors weights (and always with ``HF_HUB_OFFLINE=1``);
otherwise only ``config.json``, ``model.safetensors.index.json``, the model card
``README.md`` (its license, for the manifest) and the shards are downloaded into the cache
(huggingface_hub's progress bars on stderr when it is a terminal). Nothing is written into
the cache when it already holds the files.

Outputs are named after the model (:func:`stem_of`): ``NAME`` of ``ORG/NAME``, also for a cache
snapshot folder given as a path (``.../models--ORG--NAME/snapshots/<commit>``), not after its
commit hash; any other folder by its own name.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from smoe.errors import MissingExtra, RefusedInput, SmoeError, UnreadableInput, UsageError
from smoe.families.config import read_json
from smoe.plumbing import fileio

__all__ = [
    "cache_origin",
    "check_cache",
    "check_revision",
    "check_stem",
    "is_repo_id",
    "lfs_sha256",
    "output_stem",
    "resolve",
    "stem_of",
]

_CONFIG = "config.json"
_INDEX = "model.safetensors.index.json"
_CARD = "README.md"  # the model card: its front matter names the license (source/card.py)
_WEIGHTS = "*.safetensors"
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"({_PART})/({_PART})")
_CACHE_REPO = re.compile(rf"models--(?:{_PART}--)?({_PART})")
_OFF = ("1", "ON", "YES", "TRUE")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TREE_BYTES = 64 << 20  # a cached tree listing (trees/<commit>.json) of a repository
_REVISION_CHARS = 255  # git's own limit is the file system's name length
_REF_FORBIDDEN = re.compile(r"\.\.|@\{|//|[\s~^:?*\[\\]")


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is a model id ``ORG/NAME`` by the Hub's rules (letters, digits, ``_``,
    ``-`` and ``.``, no ``--`` or ``..``, at most 96 characters).

    >>> is_repo_id("Qwen/Qwen3-30B-A3B"), is_repo_id("./ckpt"), is_repo_id("a/b/c")
    (True, False, False)
    """
    return (
        _REPO_ID.fullmatch(text) is not None
        and "--" not in text
        and ".." not in text
        and not text.endswith(".git")
        and len(text) <= 96
    )


def stem_of(model_dir: str | os.PathLike[str]) -> str:
    """The stem of the outputs for a checkpoint folder: ``NAME`` for a HuggingFace cache
    snapshot (``.../models--ORG--NAME/snapshots/<commit>``, also through a symlink), else the
    folder's own name.

    >>> stem_of("/cache/hub/models--Qwen--Qwen3-30B-A3B/snapshots/0123abcd")
    'Qwen3-30B-A3B'
    """
    try:
        path = Path(model_dir).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a symlink loop (RuntimeError before 3.13), ...
        path = Path(os.path.abspath(model_dir))  # opening it says what is wrong
    if path.parent.name == "snapshots":
        repo = _CACHE_REPO.fullmatch(path.parent.parent.name)
        if repo:
            return repo.group(1)
    return path.name


def cache_origin(model_dir: str | os.PathLike[str]) -> tuple[str, str] | None:
    """(model id, commit) of a HuggingFace cache snapshot folder
    (``.../models--ORG--NAME/snapshots/<commit>``, also through a symlink: what :func:`resolve`
    gives for a model id), or None for any other folder. The commit is the snapshot's folder
    name, which huggingface_hub names by the commit hash it resolved.

    >>> cache_origin("/cache/hub/models--Qwen--Qwen3-30B-A3B/snapshots/" + "0123abcd" * 5)
    ('Qwen/Qwen3-30B-A3B', '0123abcd0123abcd0123abcd0123abcd0123abcd')
    >>> cache_origin("fixtures/checkpoints/qwen3_moe") is None
    True
    """
    try:
        path = Path(model_dir).resolve(strict=True)
    except (OSError, RuntimeError):
        path = Path(os.path.abspath(model_dir))
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not _COMMIT.fullmatch(path.name):
        return None
    if not repo.startswith("models--") or not _CACHE_REPO.fullmatch(repo):
        return None
    model_id = repo.removeprefix("models--").replace("--", "/", 1)
    return model_id, path.name


def lfs_sha256(file: str | os.PathLike[str]) -> str | None:
    """The SHA-256 the HuggingFace Hub lists for a file of a cache snapshot, when it is a
    Git LFS file (the weights): huggingface_hub names the cached blob a snapshot's symlink
    points at by it (``../../blobs/<sha256>``). None for any other file (a small file's blob
    is named by its git hash, 40 digits). Read from the cache's layout, not recomputed.

    >>> lfs_sha256("fixtures/checkpoints/qwen3_moe/model.safetensors") is None
    True
    """
    path = Path(file)
    if not path.is_symlink():
        return None
    try:
        blob = Path(os.path.realpath(path))
    except (OSError, RuntimeError):
        return None
    if blob.parent.name != "blobs" or not _SHA256.fullmatch(blob.name):
        return None
    if not blob.parent.parent.name.startswith("models--"):  # not a cached repository's blob
        return None
    return blob.name


def check_stem(name: str) -> str:
    """``name`` if it can name outputs in OUT_DIR (``NAME.smoe``, ...); else a SmoeError.

    >>> check_stem("qwen3-q4")
    'qwen3-q4'
    """
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise SmoeError(
            f"output name {name!r}: not a file name stem (it must be non-empty, "
            "not '.' or '..', without '/')"
        )
    return name


def check_revision(revision: str) -> str:
    """``--revision``: a commit hash (40 or 64 hex digits) or a ref name by git's rules
    (``git check-ref-format --allow-onelevel``), else a :class:`UsageError` before anything is
    read: the revision is joined to the cache's ``refs/`` folder, so an absolute path or a
    ``..`` would read a file outside it.

    >>> check_revision("main"), check_revision("refs/pr/1"), check_revision("a" * 40)[:4]
    ('main', 'refs/pr/1', 'aaaa')
    >>> check_revision("../../../etc/passwd")
    Traceback (most recent call last):
    smoe.errors.UsageError: --revision '../../../etc/passwd': not a branch, tag or commit ...
    """
    why = _ref_fault(revision)
    if why is not None:
        raise UsageError(
            f"--revision {revision!r}: not a branch, tag or commit hash ({why}); a revision "
            "is a ref name (git check-ref-format) or 40 or 64 hex digits"
        )
    return revision


def _ref_fault(ref: str) -> str | None:
    """Why ``ref`` is not a ref name by git's rules (None: it is one)."""
    if _COMMIT.fullmatch(ref) or _SHA256.fullmatch(ref):
        return None
    if not ref or len(ref) > _REVISION_CHARS:
        return f"empty or longer than {_REVISION_CHARS} characters"
    if not ref.isprintable():
        return "a control character or undecodable byte"
    found = _REF_FORBIDDEN.search(ref)
    if found is not None:
        return f"holds {found.group()!r}"
    if ref.startswith("/") or ref.endswith(("/", ".")) or ref == "@":
        return "a leading or trailing '/', a trailing '.', or '@' alone"
    for part in ref.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"the part {part!r} starts with '.' or ends with '.lock'"
    return None


def output_stem(model_dir: str | os.PathLike[str], name: str | None = None) -> str:
    """The stem of a sculpt's outputs: ``name`` (checked by :func:`check_stem`) when given,
    else :func:`stem_of` the model folder.

    >>> output_stem("fixtures/checkpoints/qwen3_moe"), output_stem("x", name="y")
    ('qwen3_moe', 'y')
    """
    return check_stem(name) if name is not None else stem_of(model_dir)


def resolve(model: str | os.PathLike[str], revision: str | None = None) -> tuple[Path, str]:
    """The local checkpoint folder for ``model`` and the stem to name outputs by.

    ``model`` is a path (used as it is, whatever its form, when anything exists there) or a
    HuggingFace model id ``ORG/NAME``, looked up in the cache and downloaded if needed (see
    the module docstring); ``revision`` (a branch, tag or commit) applies to an id only.
    Anything else comes back as a path, for :meth:`Checkpoint.open` to refuse as "not a
    checkpoint directory".

    >>> resolve("fixtures/checkpoints/qwen3_moe")
    (PosixPath('fixtures/checkpoints/qwen3_moe'), 'qwen3_moe')
    """
    text = os.fspath(model)
    if revision is not None:
        check_revision(revision)
    if os.path.lexists(text):
        if revision is not None:
            raise SmoeError(
                f"{text}: --revision {revision!r} applies to a model id (ORG/NAME), "
                "not to a local folder"
            )
        return Path(text), stem_of(text)
    if not is_repo_id(text):
        return Path(text), stem_of(text)
    return _from_hub(text, revision), text.split("/")[1]


# ---- the HuggingFace cache and Hub ---------------------------------------------------------
def _hub() -> ModuleType:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.utils
    except ImportError:
        raise MissingExtra.needs("a HuggingFace model id needs huggingface_hub", "hub") from None
    return huggingface_hub


def _offline(hf: ModuleType) -> bool:
    """``HF_HUB_OFFLINE`` as huggingface_hub read it at import, or as it is set now."""
    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(hf.constants.HF_HUB_OFFLINE) or now.upper() in _OFF


def _from_hub(repo_id: str, revision: str | None) -> Path:
    hf = _hub()
    what = repo_id if revision is None else f"{repo_id} (revision {revision})"
    check_cache(Path(hf.constants.HF_HUB_CACHE), repo_id, revision, what)
    cached, missing = _cached(hf, repo_id, revision)
    if cached is not None and not missing:
        return cached
    if _offline(hf):
        where = f"the HuggingFace cache ({hf.constants.HF_HUB_CACHE})"
        state = (
            f"is not in {where}"
            if cached is None
            else f"is only partly in {where}: no {missing[0]}"
        )
        raise SmoeError(
            f"{what}: no such folder, and the model {state}, while the network "
            "is off (HF_HUB_OFFLINE)"
        )
    return _download(hf, repo_id, revision, what)


def check_cache(cache: Path, repo_id: str, revision: str | None, what: str) -> None:
    """Refuse, in one line, a cache whose files huggingface_hub would read for ``revision``
    of ``repo_id`` (``refs/<revision>``, ``trees/<commit>.json``) or smoe would read first
    (the snapshot's ``config.json`` and index) but that are not regular files of bounded
    size: huggingface_hub reads them unguarded, so a FIFO blocks forever and /dev/zero
    never ends. A ref must hold a commit hash, as huggingface_hub writes it. Absent files
    are left to the look-up (the model is then not, or only partly, cached).

    >>> import tempfile
    >>> cache = Path(tempfile.mkdtemp())
    >>> check_cache(cache, "org/name", None, "org/name")  # nothing cached: nothing to check
    >>> (cache / "models--org--name" / "refs").mkdir(parents=True)
    >>> os.mkfifo(cache / "models--org--name" / "refs" / "main")
    >>> check_cache(cache, "org/name", None, "org/name")
    Traceback (most recent call last):
    smoe.errors.UnreadableInput: org/name: /.../refs/main: not a regular file (a FIFO)
    """
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    rev = "main" if revision is None else check_revision(revision)
    commit = rev if _COMMIT.fullmatch(rev) else _ref_commit(repo / "refs" / rev, what)
    if commit is None:
        return
    tree = repo / "trees" / f"{commit}.json"
    size = _regular_size(tree, what)
    if size is not None and size > _TREE_BYTES:
        raise RefusedInput(
            f"{what}: {tree} is {size} bytes, more than the {_TREE_BYTES} bytes allowed "
            "for a cached tree listing"
        )
    for name in (_CONFIG, _INDEX):  # their size is bounded where they are read (read_json)
        _regular_size(repo / "snapshots" / commit / name, what)


def _ref_commit(ref: Path, what: str) -> str | None:
    """The commit hash ``ref`` holds (None if there is no such ref), read bounded by it."""
    if not os.path.exists(ref):  # a dangling link too: huggingface_hub sees no ref
        return None
    bound = 40

    def too_large(size: int) -> SmoeError:
        return RefusedInput(
            f"{what}: {ref} is {size} bytes, more than the {bound} bytes of the commit hash "
            "a ref holds"
        )

    try:
        text = fileio.read_whole(ref, bound, too_large).decode("ascii", "replace")
    except fileio.NotRegular as e:
        raise UnreadableInput(f"{what}: {e}") from None
    if not _COMMIT.fullmatch(text):
        raise RefusedInput(f"{what}: {ref} holds {text!r}, not a commit hash (40 hex digits)")
    return text


def _regular_size(path: Path, what: str) -> int | None:
    """The size of ``path`` if it exists (through links; None if not): a regular file."""
    if not os.path.exists(path):
        return None
    try:
        return fileio.require_regular(path).st_size
    except fileio.NotRegular as e:
        raise UnreadableInput(f"{what}: {e}") from None


def _cached(hf: ModuleType, repo_id: str, revision: str | None) -> tuple[Path | None, list[str]]:
    """The cached snapshot folder of ``revision`` (its ref's commit) or None, and what it
    lacks (:func:`missing_files`); no network access."""
    try:
        folder = Path(
            hf.snapshot_download(
                repo_id, revision=revision, local_files_only=True, allow_patterns=[_CONFIG, _INDEX]
            )
        )
    except hf.utils.LocalEntryNotFoundError as e:
        partial = getattr(e, "snapshot_path", None)  # IncompleteSnapshotError (hub >= 1.x):
        if not partial:  # its tree listing names a config or index that is not cached
            return None, [_CONFIG]
        return Path(partial), missing_files(Path(partial)) or [_INDEX]
    return folder, missing_files(folder)


def missing_files(folder: Path) -> list[str]:
    """What a snapshot folder lacks to be sculpted: ``config.json``, a shard named by the
    index, or (without an index) any ``*.safetensors`` or the file of one (a symlink whose
    blob is gone); empty if nothing."""
    if not (folder / _CONFIG).is_file():
        return [_CONFIG]
    if (folder / _INDEX).is_file():
        return [s for s in _index_shards(folder / _INDEX) if not (folder / s).is_file()]
    weights = sorted(folder.glob(_WEIGHTS))
    return [p.name for p in weights if not p.is_file()] if weights else [_WEIGHTS]


def _index_shards(index: Path) -> list[str]:
    """The shard names of a ``model.safetensors.index.json``, in order, each once (the
    checkpoint reader checks them fully; what is not a string is left out here)."""
    doc = read_json(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict):
        return []
    return list(dict.fromkeys(s for s in weight_map.values() if isinstance(s, str)))


def _download(hf: ModuleType, repo_id: str, revision: str | None, what: str) -> Path:
    """Config and index first, then exactly the shards the index names (without an index:
    the top-level ``*.safetensors``), all from the commit the first call resolved."""
    errors = hf.utils
    try:
        with _progress_bars(hf):
            folder = Path(
                hf.snapshot_download(
                    repo_id, revision=revision, allow_patterns=[_CONFIG, _INDEX, _CARD]
                )
            )
            if (folder / _INDEX).is_file():
                shards, ignore = [_literal(s) for s in _index_shards(folder / _INDEX)], None
            else:
                shards, ignore = [_WEIGHTS], ["*/*"]
            folder = Path(
                hf.snapshot_download(
                    repo_id,
                    revision=folder.name,
                    allow_patterns=[_CONFIG, _INDEX, _CARD, *shards],
                    ignore_patterns=ignore,
                )
            )
    except errors.GatedRepoError:
        raise SmoeError(
            f"{what}: a gated model; accept its terms on huggingface.co and log in (hf auth login)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise SmoeError(
            f"{what}: no such folder, and no such model on the HuggingFace Hub "
            "(or it is private: log in with hf auth login)"
        ) from None
    except errors.RevisionNotFoundError:
        raise SmoeError(
            f"{what}: the model has no revision {revision!r} on the HuggingFace Hub"
        ) from None
    except errors.LocalEntryNotFoundError as e:  # the Hub unreachable, the files not cached
        raise SmoeError(
            f"{what}: no such folder, the model is not in the HuggingFace cache "
            f"({hf.constants.HF_HUB_CACHE}), and the HuggingFace Hub cannot be "
            f"reached: {_first_line(e.__cause__ or e)}"
        ) from None
    except errors.HfHubHTTPError as e:
        raise SmoeError(
            f"{what}: cannot download from the HuggingFace Hub: {_first_line(e)}"
        ) from None
    missing = missing_files(folder)
    if _CONFIG in missing or _WEIGHTS in missing:
        raise RefusedInput(
            f"{what}: the model on the HuggingFace Hub has no top-level "
            f"{missing[0]}; not a transformers checkpoint in safetensors"
        )
    return folder


@contextlib.contextmanager
def _progress_bars(hf: ModuleType) -> Iterator[None]:
    """huggingface_hub's bars (on stderr) while stderr is a terminal; silent otherwise
    (unless ``HF_HUB_DISABLE_PROGRESS_BARS=0`` asks for them)."""
    utils = hf.utils
    forced = hf.constants.HF_HUB_DISABLE_PROGRESS_BARS is False
    if _is_terminal() or forced or utils.are_progress_bars_disabled():
        yield
        return
    utils.disable_progress_bars()
    try:
        yield
    finally:
        utils.enable_progress_bars()


def _is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _literal(name: str) -> str:
    """An fnmatch pattern matching exactly ``name``."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
