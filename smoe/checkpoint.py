"""HuggingFace MoE checkpoints: config, tensor index and expert naming (ruling D8).

Opening a checkpoint reads ``config.json`` and the safetensors headers only. The
routed experts are located under one of the naming schemes ``transformers`` writes:

* per expert: ``model.layers.{L}.mlp.experts.{E}.{gate,up,down}_proj.weight``
  (qwen2_moe, qwen3_moe, olmoe, deepseek_v2/v3, ...);
* Mixtral: ``model.layers.{L}.block_sparse_moe.experts.{E}.{w1,w3,w2}.weight``
  (w1 = gate, w3 = up, w2 = down);
* fused 3-D: ``model.layers.{L}.mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (gate rows,
  then up rows) and ``model.layers.{L}.mlp.experts.down_proj`` ``[E, H, I]``.

Shapes are the authority for structural facts (q/k norm, dense layer 0, shared expert);
disagreements with config.json are reported as warnings naming both values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smoe.config import Structure, arch_from_config, first, load_config
from smoe.errors import SmoeError
from smoe.records import ArchInfo, ModelInfo
from smoe.safetensors_io import FLOAT_DTYPES, TensorInfo, read_array, read_header

PER_EXPERT = re.compile(
    r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
MIXTRAL = re.compile(
    r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w1|w3|w2)\.weight$")
FUSED = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\."
                   r"(gate_up_proj|down_proj)$")
FUSED_BIAS = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\."
                        r"(gate_up_proj_bias|down_proj_bias)$")
EXPERT_BIAS = re.compile(r"^model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                         r"\w+\.bias$")
MIXTRAL_ROLES = {"w1": 0, "w3": 1, "w2": 2}
ROLES = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}

SILU_ACTS = {"silu", "swish", "swiglu"}
REFUSED_FAMILIES = {
    "gpt_oss": "gpt-oss experts interleave gate/up, carry biases and clamp the activation; "
               "only bias-free SiLU-gated (SwiGLU) experts can be represented",
}


@dataclass(frozen=True)
class ExpertRef:
    """Where one expert's three matrices come from: a 2-D tensor, or a slice of a 3-D one."""

    layer: int
    expert: int
    sources: tuple[tuple[TensorInfo, int | None, slice | None], ...]  # (tensor, index, rows)

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        out = []
        for info, idx, rows in self.sources:
            shape = info.shape if idx is None else info.shape[1:]
            r = shape[0] if rows is None else rows.stop - rows.start
            out.append((r, shape[1]))
        return tuple(out)

    @property
    def nbytes(self) -> int:
        total = 0
        for (r, c), (info, _, _) in zip(self.shapes, self.sources):
            total += r * c * np.dtype(FLOAT_DTYPES[info.dtype]).itemsize
        return total

    def load(self) -> list[tuple[np.ndarray, str | None]]:
        """The three matrices as (array, src_dtype) with positioned reads of just their bytes."""
        out = []
        for info, idx, rows in self.sources:
            arr = read_array(info) if idx is None else _read_slice(info, idx)
            if rows is not None:
                arr = arr[rows]
            out.append((np.ascontiguousarray(arr), "bf16" if info.dtype == "BF16" else None))
        return out


def _read_slice(info: TensorInfo, idx: int) -> np.ndarray:
    """One expert's [rows, cols] slab of a fused [E, rows, cols] tensor."""
    per = info.nbytes // info.shape[0]
    part = TensorInfo(info.name, info.path, info.dtype, tuple(info.shape[1:]),
                      info.offset + idx * per, per)
    return read_array(part)


@dataclass
class Checkpoint:
    """An opened HF checkpoint directory: config, tensor index, routed experts."""

    root: Path
    config: dict
    tensors: dict[str, TensorInfo]
    experts: dict[tuple[int, int], ExpertRef]
    expert_tensor_names: set[str]
    warnings: list[str] = field(default_factory=list)

    # ---- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | Path) -> Checkpoint:
        root = Path(root)
        if not root.is_dir():
            raise SmoeError(f"{root}: not a checkpoint directory")
        cfg_path = root / "config.json"
        if not cfg_path.is_file():
            raise SmoeError(f"{root}: no config.json (a HuggingFace checkpoint directory needs "
                            "config.json and *.safetensors)")
        config = load_config(cfg_path)
        tensors = cls._index(root)
        model_type = str(config.get("model_type", ""))
        if model_type in REFUSED_FAMILIES:
            raise SmoeError(f"{root}: model_type {model_type!r} refused: "
                            f"{REFUSED_FAMILIES[model_type]}")
        act = str(first(config, "hidden_act", "hidden_activation", default="silu")).lower()
        if act not in SILU_ACTS:
            raise SmoeError(f"{root}: hidden_act {act!r} refused: only SiLU-gated (SwiGLU) "
                            "experts can be represented")
        experts, names = cls._experts(root, tensors)
        return cls(root, config, tensors, experts, names)

    @staticmethod
    def _index(root: Path) -> dict[str, TensorInfo]:
        index_path = root / "model.safetensors.index.json"
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
                raise SmoeError(f"{index_path}: malformed ({e})") from None
            shards = sorted({root / s for s in weight_map.values()})
        else:
            weight_map = None
            shards = sorted(p for p in root.glob("*.safetensors")
                            if not p.name.endswith(".scout.safetensors"))
        if not shards:
            raise SmoeError(f"{root}: no *.safetensors files")
        tensors: dict[str, TensorInfo] = {}
        for shard in shards:
            if not shard.is_file():
                raise SmoeError(f"{index_path}: names shard {shard.name}, which does not exist")
            for name, info in read_header(shard).items():
                if name in tensors:
                    raise SmoeError(f"{root}: tensor {name!r} is in both "
                                    f"{tensors[name].path.name} and {shard.name}")
                tensors[name] = info
        if weight_map is not None:
            for name, shard_name in weight_map.items():
                if name not in tensors or tensors[name].path.name != Path(shard_name).name:
                    raise SmoeError(f"{index_path}: tensor {name!r} is not in {shard_name}")
        return tensors

    @staticmethod
    def _experts(root: Path, tensors: dict[str, TensorInfo]
                 ) -> tuple[dict[tuple[int, int], ExpertRef], set[str]]:
        parts: dict[tuple[int, int], dict[int, TensorInfo]] = {}
        fused: dict[int, dict[str, TensorInfo]] = {}
        names: set[str] = set()
        for name, info in tensors.items():
            if EXPERT_BIAS.match(name) or FUSED_BIAS.match(name):
                raise SmoeError(f"{root}: expert bias {name!r} refused: only bias-free "
                                "SiLU-gated (SwiGLU) experts can be represented")
            m = PER_EXPERT.match(name) or MIXTRAL.match(name)
            if m:
                role = ROLES.get(m.group(3), MIXTRAL_ROLES.get(m.group(3)))
                parts.setdefault((int(m.group(1)), int(m.group(2))), {})[role] = info
                names.add(name)
                continue
            m = FUSED.match(name)
            if m:
                fused.setdefault(int(m.group(1)), {})[m.group(2)] = info
                names.add(name)
        experts: dict[tuple[int, int], ExpertRef] = {}
        for key, roles in parts.items():
            missing = [n for n, r in ROLES.items() if r not in roles]
            if missing:
                raise SmoeError(f"{root}: layer {key[0]} expert {key[1]} has no "
                                f"{' or '.join(missing)} tensor")
            for info in roles.values():
                if len(info.shape) != 2:
                    raise SmoeError(f"{root}: {info.name} has shape {list(info.shape)}, "
                                    "expected 2-D")
            experts[key] = ExpertRef(key[0], key[1],
                                     tuple((roles[r], None, None) for r in range(3)))
        for layer, pair in fused.items():
            if set(pair) != {"gate_up_proj", "down_proj"}:
                missing = {"gate_up_proj", "down_proj"} - set(pair)
                raise SmoeError(f"{root}: layer {layer} has no fused experts "
                                f"{' or '.join(sorted(missing))} tensor")
            gu, down = pair["gate_up_proj"], pair["down_proj"]
            if len(gu.shape) != 3 or len(down.shape) != 3 or gu.shape[0] != down.shape[0] \
                    or gu.shape[1] % 2 or gu.shape[1] // 2 != down.shape[2] \
                    or gu.shape[2] != down.shape[1]:
                raise SmoeError(f"{root}: layer {layer} fused experts have inconsistent shapes "
                                f"gate_up_proj {list(gu.shape)}, down_proj {list(down.shape)} "
                                "(expected [E, 2I, H] and [E, H, I])")
            inter = gu.shape[1] // 2
            for e in range(gu.shape[0]):
                if (layer, e) in experts:
                    raise SmoeError(f"{root}: layer {layer} expert {e} is stored both fused "
                                    "and per expert")
                experts[(layer, e)] = ExpertRef(layer, e, (
                    (gu, e, slice(0, inter)), (gu, e, slice(inter, 2 * inter)),
                    (down, e, None)))
        if not experts:
            raise SmoeError(f"{root}: no routed expert tensors found (looked for "
                            "mlp.experts.{E}.*_proj.weight, block_sparse_moe.experts.{E}.w1/w2/w3"
                            ".weight and fused mlp.experts.gate_up_proj/down_proj)")
        for key, ref in experts.items():
            gate, up, down = ref.shapes
            if up != gate or down != (gate[1], gate[0]):
                raise SmoeError(f"{root}: layer {key[0]} expert {key[1]} has inconsistent "
                                f"shapes gate {list(gate)}, up {list(up)}, down {list(down)}")
            for info, _, _ in ref.sources:
                if info.dtype not in FLOAT_DTYPES:
                    raise SmoeError(f"{root}: {info.name} is {info.dtype}; expert weights must be "
                                    "BF16, F16 or F32")
        return dict(sorted(experts.items())), names

    # ---- facts -----------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", "unknown"))

    @property
    def moe_layers(self) -> list[int]:
        return sorted({lay for lay, _ in self.experts})

    def layer_experts(self, layer: int) -> list[int]:
        return [e for lay, e in self.experts if lay == layer]

    def iter_experts(self) -> Iterator[ExpertRef]:
        yield from self.experts.values()

    def _shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info else None

    def _warn_if(self, what: str, config_value: object, shape_value: object) -> None:
        if config_value is not None and config_value != shape_value:
            self.warnings.append(f"{what}: config.json says {config_value!r}, the tensors say "
                                 f"{shape_value!r}; using the tensors")

    def model_info(self) -> ModelInfo:
        """Header facts (D5) for the whole model, whatever subset is written."""
        cfg = self.config
        emb = self._shape("model.embed_tokens.weight")
        if emb is None or len(emb) != 2:
            raise SmoeError(f"{self.root}: no 2-D model.embed_tokens.weight; d_model and "
                            "vocab_size come from it")
        vocab, d_model = emb
        widths = {lay: len(self.layer_experts(lay)) for lay in self.moe_layers}
        n_experts = first(cfg, "num_experts", "num_local_experts", "n_routed_experts")
        width = max(widths.values())
        if n_experts is not None and int(n_experts) != width:
            self._warn_if("num_experts", int(n_experts), width)
        return ModelInfo(num_moe_layers=len(widths), max_experts_per_layer=width,
                         d_model=int(d_model), vocab_size=int(vocab), ffn_dim=self.ffn_dim())

    def dense_ffn_dim(self) -> int:
        shape = self._shape("model.layers.0.mlp.gate_proj.weight")
        return int(shape[0]) if shape else 0

    def shared_expert_ffn_dim(self) -> int:
        for lay in self.moe_layers:
            for name in (f"model.layers.{lay}.mlp.shared_expert.gate_proj.weight",
                         f"model.layers.{lay}.mlp.shared_experts.gate_proj.weight"):
                shape = self._shape(name)
                if shape:
                    return int(shape[0])
        return 0

    def ffn_dim(self) -> int:
        """D5: dense layer-0 rows, else shared expert rows, else config intermediate_size."""
        return (self.dense_ffn_dim() or self.shared_expert_ffn_dim()
                or int(first(self.config, "intermediate_size", default=0)))

    def has_qk_norm(self) -> bool:
        return any(n.endswith(".self_attn.q_norm.weight") for n in self.tensors)

    def structure(self) -> Structure:
        """Structural facts from the tensors present (shapes win over config.json)."""
        return Structure(self.has_qk_norm(), self.dense_ffn_dim(), self.shared_expert_ffn_dim())

    def arch_info(self) -> ArchInfo:
        """The arch block (D6) from config.json, with shapes as the structural authority."""
        gate_rows = next(iter(self.experts.values())).shapes[0][0]
        arch, warnings = arch_from_config(self.config, f"{self.root}/config.json", gate_rows,
                                          self.structure())
        self.warnings.extend(w for w in warnings if w not in self.warnings)
        return arch

    def non_expert_tensors(self) -> list[TensorInfo]:
        """Every tensor that is not a routed-expert weight: the scout's contents (D8)."""
        return [t for n, t in sorted(self.tensors.items()) if n not in self.expert_tensor_names]
