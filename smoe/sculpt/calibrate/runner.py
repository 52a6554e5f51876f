"""The calibration forward pass of ``--calibrate``, one decoder layer at a time.

The model is built by transformers from the checkpoint's config on the ``meta`` device (no
memory), so that its own modeling code runs every part of the forward pass: embeddings,
masks, rotary tables, attention, routers, shared experts, norms. Only one decoder layer's
weights are materialised at a time, read from the checkpoint under the names transformers'
own conversion mapping gives them; the hidden states of the whole calibration set are
carried from layer to layer. In each layer the routed experts' module is replaced by a
stand-in (:class:`_Experts`) that computes the same SiLU-gated experts from smoe's own
reading of them (:class:`~smoe.sculpt.source.checkpoint.ExpertRef`) and accumulates, per
expert, the second moments of its routed inputs: ``x`` (what gate and up see) and
``act(g x) * (u x)`` (what down sees), each token's weighted by its routing weight ``r``
squared. An expert's output enters the layer's output times ``r``, so its error on a token
does too: a token the router gives a small weight matters that much less (on the trained
model of :mod:`smoe.quant.hessian`: Q2 +0.0490 -> +0.0481 bits/byte, the rest the same).

Per layer, :meth:`LayerRunner.collect` runs the layer over the calibration set with the
source experts and returns their statistics; the caller quantises; then
:meth:`LayerRunner.propagate` runs it again with the quantised experts and keeps its output
as the next layer's input (sequential calibration, as GPTQ does it: each layer is
calibrated on what the quantised layers before it produce).

Supported: every family whose experts module takes ``(hidden_states, top_k_index,
top_k_weights)`` (the transformers experts interface), whose decoder layers are the
``layers`` of its decoder, and whose non-expert weights the conversion mapping only
renames. Others are refused, naming what is missing.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from smoe import quant
from smoe.errors import MissingExtra, RefusedInput, SmoeError, StoppedResumable, UsageError
from smoe.interop.safetensors_io import read_array
from smoe.sculpt.source.checkpoint import Checkpoint, ExpertRef, src_dtype

if TYPE_CHECKING:
    pass

__all__ = ["ExpertStats", "LayerRunner", "check_device_present", "import_torch", "meta_model"]

_FLOATS = ("F32", "F16", "BF16")
_WRAPPERS = ("AutoModelForImageTextToText", "AutoModelForMultimodalLM", "AutoModel")
"""Tried after ``AutoModelForCausalLM``: multimodal wrappers, whose text decoder is run."""


def import_torch() -> Any:
    """torch and transformers, or a one-line refusal naming the extra that brings them.

    >>> import_torch().__name__
    'torch'
    """
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise MissingExtra.needs(
            f"--calibrate needs torch and transformers ({e.name} is missing)", "calibrate"
        ) from None
    return torch


def check_device_present(torch: Any, device: str) -> None:
    """Refuse (a usage error) a CUDA ``--device`` torch does not have here: no CUDA at all,
    or an index past its devices (``device`` is ``cpu``, ``cuda`` or ``cuda:N``).

    >>> check_device_present(import_torch(), "cpu")
    """
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device is available to torch here")
    count = int(torch.cuda.device_count())
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise UsageError(
            f"--device {device}: torch has {count} CUDA device{'s' if count != 1 else ''} "
            f"here ({have})"
        )


@dataclass
class ExpertStats:
    """One routed expert's calibration statistics: ``h_in`` = ``sum r^2 x x^T`` over its
    routed tokens (gate's and up's input ``x``, routing weight ``r``), ``h_down`` = the same
    of down's input, ``tokens`` the count; float64. :meth:`hessians` gives the means, per
    matrix gate, up, down (None for an expert no token reached).

    >>> ExpertStats(np.zeros((2, 2)), np.zeros((3, 3)), 0).tokens
    0
    """

    h_in: np.ndarray
    h_down: np.ndarray
    tokens: int = 0

    def hessians(self) -> tuple[np.ndarray | None, ...]:
        """``(H_in, H_in, H_down)`` as means over the tokens, or three None without any.

        >>> s = ExpertStats(np.eye(2) * 4, np.eye(3) * 8, 4)
        >>> [None if h is None else float(h[0, 0]) for h in s.hessians()]
        [1.0, 1.0, 2.0]
        >>> ExpertStats(np.zeros((2, 2)), np.zeros((3, 3))).hessians()
        (None, None, None)
        """
        if self.tokens == 0:
            return (None, None, None)
        h_in = self.h_in / self.tokens
        return (h_in, h_in, self.h_down / self.tokens)


def _floats(info: Any) -> np.ndarray:
    """A checkpoint tensor as float32 (F32, F16, BF16)."""
    return np.ascontiguousarray(quant.as_float32(read_array(info), src_dtype(info)))


class _Experts:
    """Builds the stand-in module (a ``torch.nn.Module`` subclass made on first use, so that
    importing this module needs no torch)."""

    cls: Any = None

    @classmethod
    def make(cls, torch: Any, act: Any, weights: dict[int, list[np.ndarray]], device: Any) -> Any:
        if cls.cls is None:
            cls.cls = _define_stand_in(torch)
        return cls.cls(act, weights, device)


def _define_stand_in(torch: Any) -> Any:
    """The stand-in experts module: the transformers experts interface over smoe's own
    matrices, gathering statistics while ``collecting``."""

    class StandInExperts(torch.nn.Module):
        def __init__(self, act: Any, weights: dict[int, list[np.ndarray]], device: Any) -> None:
            super().__init__()
            self.act = act
            self.device = device
            self.mats: dict[int, list[Any]] = {}
            self.stats: dict[int, ExpertStats] = {}
            self.collecting = False
            self.set_weights(weights)

        def set_weights(self, weights: dict[int, list[np.ndarray]]) -> None:
            for e, mats in weights.items():
                self.mats[e] = [torch.from_numpy(m).to(self.device) for m in mats]

        def _accumulate(self, e: int, x: Any, a: Any, r: Any) -> None:
            st = self.stats.get(e)
            if st is None:
                g, _, d = self.mats[e]
                st = self.stats[e] = ExpertStats(
                    np.zeros((g.shape[1], g.shape[1])), np.zeros((d.shape[1], d.shape[1]))
                )
            x, a = x * r, a * r  # rows times the routing weights: sum r^2 x x^T
            st.h_in += (x.T @ x).double().cpu().numpy()
            st.h_down += (a.T @ a).double().cpu().numpy()
            st.tokens += int(x.shape[0])

        def forward(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
            out = torch.zeros_like(hidden_states)
            x_all = hidden_states.float()
            for e in torch.unique(top_k_index).tolist():
                if e not in self.mats:  # an index past the experts: a padding slot
                    continue
                tok, pos = torch.where(top_k_index == e)
                x = x_all[tok]
                g, u, d = self.mats[e]
                a = self.act(x @ g.T) * (x @ u.T)
                r = top_k_weights[tok, pos, None].float()
                if self.collecting:  # the layer's output is not kept: down is not needed
                    self._accumulate(e, x, a, r)
                    continue
                y = (a @ d.T) * r
                out.index_add_(0, tok, y.to(out.dtype))
            return out

    return StandInExperts


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' logging at errors only inside the block."""
    from transformers.utils import logging as log

    level = log.get_verbosity()
    log.set_verbosity_error()
    try:
        yield
    finally:
        log.set_verbosity(level)


def _maps(auto_class: Any, config: Any) -> bool:
    """Whether a transformers auto class has a model class for ``config`` (True where its
    mapping cannot be asked: building it then tells)."""
    mapping = getattr(auto_class, "_model_mapping", None)
    try:
        return mapping is None or type(config) in mapping
    except Exception:  # another transformers' mapping
        return True


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class _Stop(Exception):
    """Raised by the last catcher: the capture pass needs nothing after the layers."""


def _define_catcher(torch: Any) -> Any:
    class Catcher(torch.nn.Module):
        """Stands in for one decoder layer during the capture pass: records the hidden
        states (layer 0) and the keyword arguments its model loop gives it."""

        def __init__(self, layer: Any, index: int, last: bool, sink: dict) -> None:
            super().__init__()
            self.__dict__["wrapped"] = layer  # not a submodule: its meta weights stay out
            self.index, self.last, self.sink = index, last, sink

        def __getattr__(self, name: str) -> Any:
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.__dict__["wrapped"], name)

        def forward(self, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            if args:
                raise SmoeError("calibration: a decoder layer was called with positional arguments")
            if self.index == 0:
                self.sink["hidden"] = hidden_states
            self.sink.setdefault("kwargs", {})[self.index] = kwargs
            if self.last:
                raise _Stop
            return hidden_states

    return Catcher


def meta_model(ckpt: Checkpoint) -> Any:
    """The model of ``ckpt`` as transformers builds it from the checkpoint's config, on the
    ``meta`` device (no memory): a config transformers cannot read, or whose values make
    its modeling code raise, is refused in one line naming the config and the cause
    (:func:`smoe.sculpt.inputs.open_calibration` builds it once before anything is written).

    >>> type(meta_model(Checkpoint.open("fixtures/checkpoints/qwen3_moe"))).__name__
    'Qwen3MoeForCausalLM'
    """
    torch = import_torch()
    with _quiet():  # a refused config is one line: not transformers' warnings before it
        return _build(ckpt, torch)


def _build(ckpt: Checkpoint, torch: Any) -> Any:
    """:func:`meta_model`: the config read, the auto classes that map it tried in order."""
    from transformers import AutoConfig, AutoModelForCausalLM

    root = ckpt.root
    try:
        config = AutoConfig.from_pretrained(root)
    except Exception as e:  # transformers' own refusals: an unknown model type, ...
        raise RefusedInput(
            f"{root}: --calibrate: transformers cannot read its config: {_first_line(e)}"
        ) from None
    config.use_cache = False
    import transformers

    classes = [AutoModelForCausalLM] + [
        getattr(transformers, n) for n in _WRAPPERS if hasattr(transformers, n)
    ]
    mapped = [c for c in classes if _maps(c, config)]
    if not mapped:
        raise RefusedInput(
            f"{root}: --calibrate: transformers has no language model class for "
            f"model type {config.model_type!r}"
        )
    failure: Exception | None = None
    with torch.device("meta"):
        for cls in mapped:  # a multimodal wrapper: its language model is run alone
            try:
                model = cls.from_config(config, dtype=torch.float32)
                break
            except Exception as e:  # the config's values make its modeling code raise
                failure = failure or e
        else:
            assert failure is not None
            raise RefusedInput(
                f"{root / 'config.json'}: --calibrate: transformers cannot build the "
                f"model from it: {type(failure).__name__}: {_first_line(failure)}"
            )
    model.eval()
    return model


class LayerRunner:
    """The model of ``ckpt`` over the calibration ``ids`` (int64 ``[sequences, seq_len]``),
    one decoder layer at a time, on ``device`` (``"cpu"`` or ``"cuda"``), ``batch`` sequences
    per forward call.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> runner = LayerRunner(ck, np.arange(24).reshape(2, 12) % 128)
    >>> runner.start()
    >>> stats = runner.collect(0, source_weights([ck.experts[(0, e)] for e in range(8)]))
    >>> sum(s.tokens for s in stats.values())  # 24 tokens, top-2
    48
    >>> runner.propagate(0)
    """

    def __init__(
        self, ckpt: Checkpoint, ids: np.ndarray, device: str = "cpu", batch: int = 32
    ) -> None:
        torch = self.torch = import_torch()
        check_device_present(torch, device)
        self.ckpt, self.device = ckpt, torch.device(device)
        self.ids = np.ascontiguousarray(ids, np.int64)
        self.batch = max(1, batch)
        self.model = meta_model(ckpt)
        self.decoder, self.layers_path = self._decoder()
        self.layers = self.decoder.layers
        self.names = self._name_map()
        self.hidden: list[Any] = []
        self.kwargs: list[dict[int, dict]] = []
        self.peak_bytes = 0
        self.peak_weight_bytes = 0

    # ---- building ---------------------------------------------------------------------------
    def _decoder(self) -> tuple[Any, str]:
        model = self.model
        for name, module in model.named_modules():
            layers = getattr(module, "layers", None)
            if (
                isinstance(layers, self.torch.nn.ModuleList)
                and len(layers)
                and hasattr(module, "embed_tokens")
            ):
                return module, (f"{name}.layers" if name else "layers")
        raise RefusedInput(
            f"{self.ckpt.root}: --calibrate: no decoder with embed_tokens and layers found "
            f"in {type(model).__name__}"
        )

    def _name_map(self) -> dict[str, str]:
        """Checkpoint tensor name -> model parameter name, by transformers' own renamings;
        every non-expert tensor of the checkpoint."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key

        transforms = get_model_conversion_mapping(self.model)
        renamings: list[Any] = [t for t in transforms if not isinstance(t, WeightConverter)]
        converters: list[Any] = [t for t in transforms if isinstance(t, WeightConverter)]
        meta = dict.fromkeys(self.model.state_dict())
        prefix = getattr(self.model, "base_model_prefix", None)
        out = {}
        for info in self.ckpt.non_expert_tensors():
            target, conv = rename_source_key(info.name, renamings, converters, prefix, meta)
            if conv is None:
                out[info.name] = target
        return out

    # ---- materialising ------------------------------------------------------------------
    def _load_into(self, module: Any, module_path: str) -> Any:
        """Give ``module`` (at ``module_path`` of the model) real float32 weights from the
        checkpoint: every parameter and persistent buffer; a submodule whose non-persistent
        buffers are computed from the config (rotary tables) is built anew on the device.
        Returns the module (a new one when it was itself rebuilt so)."""
        torch = self.torch
        module.to_empty(device=self.device)
        wanted = {n for n, _ in list(module.named_parameters()) + list(module.named_buffers())}
        base = module_path + "." if module_path else ""
        sources = {t: c for c, t in self.names.items() if t.startswith(base)}
        infos = {t.name: t for t in self.ckpt.non_expert_tensors()}
        state = dict(module.named_parameters()) | dict(module.named_buffers())
        loaded = set()
        with torch.no_grad():
            for target, cname in sources.items():
                rel = target[len(base) :]
                if rel not in wanted:
                    continue
                info = infos[cname]
                if info.dtype not in _FLOATS:
                    raise RefusedInput(
                        f"{info.path}: {cname}: --calibrate reads F32, F16 and BF16 weights "
                        f"outside the experts, not {info.dtype}"
                    )
                value = torch.from_numpy(_floats(info))
                dest = state[rel]
                if tuple(dest.shape) != tuple(value.shape):
                    raise RefusedInput(
                        f"{info.path}: {cname} has shape {list(value.shape)}, the model's "
                        f"{target} {list(dest.shape)}"
                    )
                dest.copy_(value.to(dest.dtype))
                loaded.add(rel)
        return self._rebuild_buffers(module, module_path, wanted - loaded)

    def _rebuild_buffers(self, module: Any, module_path: str, missing: set[str]) -> Any:
        """Non-persistent buffers (rotary frequencies, ...): rebuilt by constructing their
        owning submodule anew from the config, on the device; a parameter or buffer still
        missing is refused."""
        torch = self.torch
        persistent = dict(module.state_dict(keep_vars=True))
        owners: dict[str, Any] = {}
        for name in sorted(missing):
            if name in persistent:
                continue  # a parameter or persistent buffer: refused below
            owner = name.rpartition(".")[0]
            owners[owner] = module.get_submodule(owner) if owner else module
        for owner, sub in owners.items():
            config = getattr(sub, "config", None) or self.model.config
            try:
                with torch.device(self.device):
                    fresh = type(sub)(config=config)
            except Exception:
                continue
            if owner:
                module.set_submodule(owner, fresh)
            else:
                module = fresh
            for bname, _ in fresh.named_buffers(recurse=False):
                missing.discard(f"{owner}.{bname}" if owner else bname)
        left = sorted(n for n in missing if n.rpartition(".")[0] not in owners or n in persistent)
        if left:
            where = module_path or type(module).__name__
            raise RefusedInput(
                f"{self.ckpt.root}: --calibrate: the checkpoint has no weight for "
                f"{where}.{left[0]}"
                + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
                + " under the names transformers maps (it converts some weights from "
                "another layout: --calibrate reads checkpoints whose weights outside the "
                "experts it only renames)"
            )
        return module

    def _experts_module(self, layer: Any) -> tuple[str, Any] | None:
        """The layer's routed-experts module (the transformers experts interface)."""
        for name, module in layer.named_modules():
            params = inspect.signature(type(module).forward).parameters
            if "top_k_index" in params and "top_k_weights" in params:
                return name, module
        return None

    # ---- the passes ---------------------------------------------------------------------
    def start(self) -> None:
        """Embed the calibration set and capture each layer's keyword arguments (masks,
        positions, rotary tables) from the model's own loop, with stand-ins for the layers.

        >>> runner = LayerRunner(Checkpoint.open("fixtures/checkpoints/qwen3_moe"), np.ones((3, 4)))
        >>> runner.start()
        >>> [tuple(h.shape) for h in runner.hidden]  # sequences, tokens, hidden size
        [(3, 4, 64)]
        """
        torch = self.torch
        catcher = _define_catcher(torch)
        self._load_into_outside_layers()
        real = list(self.layers)
        sink: dict = {}
        for i, layer in enumerate(real):
            self.layers[i] = catcher(layer, i, i == len(real) - 1, sink)
        try:
            with torch.no_grad():
                for ids in self._batches():
                    sink.clear()
                    try:
                        self.decoder(input_ids=ids, use_cache=False)
                    except _Stop:
                        pass
                    except (RuntimeError, ValueError, TypeError, IndexError) as e:
                        raise RefusedInput(
                            f"{self.ckpt.root}: --calibrate: the model's embedding pass "
                            f"failed: {_first_line(e)}"
                        ) from None
                    if "hidden" not in sink or len(sink.get("kwargs", {})) != len(real):
                        raise RefusedInput(
                            f"{self.ckpt.root}: --calibrate: the model's forward did not "
                            "call every decoder layer once"
                        )
                    self.hidden.append(sink["hidden"].float())
                    self.kwargs.append(sink["kwargs"])
        finally:
            for i, layer in enumerate(real):
                self.layers[i] = layer
        self._drop_outside_layers()

    def _batches(self) -> Iterator[Any]:
        for i in range(0, len(self.ids), self.batch):
            yield self.torch.from_numpy(self.ids[i : i + self.batch]).to(self.device)

    def _outside(self) -> list[tuple[str, Any]]:
        """The decoder's direct submodules other than its layers (embeddings, rotary, norm)."""
        prefix = self.layers_path.rpartition(".")[0]
        return [
            (f"{prefix}.{n}" if prefix else n, m)
            for n, m in self.decoder.named_children()
            if m is not self.layers
        ]  # (the norm after the layers too: small, and the capture pass stops before it)

    def _load_into_outside_layers(self) -> None:
        for path, module in self._outside():
            fresh = self._load_into(module, path)
            if fresh is not module:
                setattr(self.decoder, path.rpartition(".")[2], fresh)

    def _drop_outside_layers(self) -> None:
        for _, module in self._outside():
            module.to("meta")

    def _materialise(self, n: int, weights: dict[int, list[np.ndarray]]) -> Any:
        """Decoder layer ``n`` with real weights, its routed experts replaced by a stand-in
        computing ``weights`` (expert -> [gate, up, down] float32)."""
        torch = self.torch
        layer = self.layers[n]
        found = self._experts_module(layer)
        if weights and found is None:
            raise RefusedInput(
                f"{self.ckpt.root}: --calibrate: layer {n}'s experts module is not one smoe "
                "can stand in for (no (hidden_states, top_k_index, top_k_weights) interface)"
            )
        if found is not None and weights:  # before the weights are made: none for the experts
            act = getattr(found[1], "act_fn", None)
            if act is None:
                act = torch.nn.functional.silu
            layer.set_submodule(found[0], _Experts.make(torch, act, weights, self.device))
        fresh = self._load_into(layer, f"{self.layers_path}.{n}")
        if fresh is not layer:
            layer = self.layers[n] = fresh
        return layer

    def collect(self, n: int, weights: dict[int, list[np.ndarray]]) -> dict[int, ExpertStats]:
        """Run layer ``n`` over the calibration set with the source experts ``weights``;
        per expert its statistics (the layer's output is not kept).

        >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
        >>> runner = LayerRunner(ck, np.ones((1, 4)))
        >>> runner.start()
        >>> stats = runner.collect(0, source_weights([ck.experts[(0, e)] for e in range(8)]))
        >>> len(stats), [s.h_in.shape for s in stats.values()][0]  # one token id: 2 experts
        (2, (64, 64))
        """
        self._check_input(n)
        layer = self._materialise(n, weights)
        stand_in = self._stand_in(layer)
        if stand_in is None:
            return {}
        stand_in.collecting = True
        self._run(layer, n, keep=False)
        stand_in.collecting = False
        stats, stand_in.stats = stand_in.stats, {}  # the caller's now: none kept per layer
        for e in sorted(stats):
            self._check_stats(n, e, stats[e])
        return stats

    def _check_input(self, n: int) -> None:
        """Refuse (resumably) non-finite hidden states entering layer ``n``, naming where
        they came from: the embeddings or the layer before."""
        for hidden in self.hidden:
            bad = ~self.torch.isfinite(hidden)
            if bool(bad.any()):
                value = float(hidden[bad].reshape(-1)[0])
                where = "the embeddings" if n == 0 else f"layer {n - 1}"
                self._stop(f"{where}: non-finite activations in its output ({value})")

    def _check_stats(self, n: int, e: int, st: ExpertStats) -> None:
        """Refuse (resumably) an expert whose routed inputs are not finite."""
        for names, h in (("gate_proj and up_proj", st.h_in), ("down_proj", st.h_down)):
            finite = np.isfinite(h)
            if not finite.all():
                value = float(h[~finite][0])
                self._stop(
                    f"layer {n}, expert {e}: non-finite activations in the routed inputs of "
                    f"its {names} ({value})"
                )

    def _stop(self, what: str) -> None:
        raise StoppedResumable(
            f"{self.ckpt.root}: --calibrate: {what}; the experts done so far are kept in "
            "the partial vault: fix the cause, then run the same command with --resume"
        )

    def propagate(self, n: int, weights: dict[int, list[np.ndarray]] | None = None) -> None:
        """Run layer ``n`` with ``weights`` (the quantised experts; None: as materialised)
        and keep its output as the next layer's input; the layer's weights are freed.

        >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
        >>> runner = LayerRunner(ck, np.ones((1, 4)))
        >>> runner.start()
        >>> before = runner.hidden[0].clone()
        >>> _ = runner.collect(0, source_weights([ck.experts[(0, e)] for e in range(8)]))
        >>> runner.propagate(0)
        >>> bool((runner.hidden[0] != before).any())
        True
        """
        layer = self.layers[n]
        stand_in = self._stand_in(layer)
        if stand_in is not None and weights is not None:
            stand_in.set_weights(weights)
        self._run(layer, n, keep=True)
        self._free(n)

    def _free(self, n: int) -> None:
        """Drop layer ``n``'s weights (back to the meta device) and its experts'."""
        stand_in = self._stand_in(self.layers[n])
        if stand_in is not None:
            stand_in.mats.clear()
            stand_in.stats.clear()
        self.layers[n].to("meta")

    def _stand_in(self, layer: Any) -> Any:
        for module in layer.modules():
            if _Experts.cls is not None and isinstance(module, _Experts.cls):
                return module
        return None

    def _run(self, layer: Any, n: int, keep: bool) -> None:
        torch = self.torch
        self._note_memory()
        with torch.no_grad():
            for b, hidden in enumerate(self.hidden):
                try:
                    out = layer(hidden, **self.kwargs[b][n])
                except (RuntimeError, ValueError, TypeError, IndexError) as e:
                    raise RefusedInput(
                        f"{self.ckpt.root}: --calibrate: decoder layer {n} failed to run "
                        f"layer by layer: {_first_line(e)}"
                    ) from None
                if isinstance(out, tuple):
                    out = out[0]
                if keep:
                    self.hidden[b] = out.float()
        self._note_memory()

    def held_weight_bytes(self) -> int:
        """Bytes of model weights materialised now: every parameter and buffer off the meta
        device, and the stand-in experts' matrices (one layer's while a layer runs).

        >>> runner = LayerRunner(Checkpoint.open("fixtures/checkpoints/qwen3_moe"), np.ones((1, 4)))
        >>> runner.held_weight_bytes()  # nothing real before the first pass
        0
        """
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        held = sum(t.numel() * t.element_size() for t in tensors if not t.is_meta)
        for module in self.model.modules():
            if _Experts.cls is not None and isinstance(module, _Experts.cls):
                held += sum(m.numel() * m.element_size() for ms in module.mats.values() for m in ms)
        return int(held)

    def _note_memory(self) -> None:
        self.peak_weight_bytes = max(self.peak_weight_bytes, self.held_weight_bytes())
        if self.device.type == "cuda":
            self.peak_bytes = max(self.peak_bytes, int(self.torch.cuda.max_memory_allocated()))


def source_weights(refs: Sequence[ExpertRef]) -> dict[int, list[np.ndarray]]:
    """Per expert of one layer, its gate, up and down as float32, as smoe reads them.

    >>> ck = Checkpoint.open("fixtures/checkpoints/qwen3_moe")
    >>> w = source_weights([ck.experts[(0, e)] for e in ck.layer_experts(0)])
    >>> len(w), [m.shape for m in w[0]]
    (8, [(48, 64), (48, 64), (64, 48)])
    """
    return {
        ref.expert: [np.ascontiguousarray(quant.as_float32(a, src)) for a, src in ref.load()]
        for ref in refs
    }


def threads() -> int:
    """torch's CPU threads: the usable cores.

    >>> threads() >= 1
    True
    """
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
