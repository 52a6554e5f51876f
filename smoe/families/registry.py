"""The family registry: per model type, what its checkpoints hold and what they mean.

One entry per ``config.json`` ``model_type`` (multimodal wrappers are keyed by their outer
type, their text model's type is an alias). An entry is data only: where the routed experts
are and in which layout, which config keys spell the counts, how the arch block's fields are
derived (heads from a gated q projection, whether the router divides its top-k weights by
their sum), and what an engine must read from the config copy because the arch block cannot
carry it. A family whose experts do not compute exactly ``down(silu(gate x) * up x)`` is
refused with its reason, whatever its ``hidden_act`` says.

A model type not in the registry whose tensors follow one of the known layouts is sculpted
with a warning naming every assumption (:func:`assumptions`); never silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "CLAMP",
    "CLAMP_SHARED",
    "CONTAINERS",
    "EMBEDDINGS",
    "FAMILIES",
    "FUSED_NAMES",
    "GROUP_ROUTING_KEYS",
    "MLA_KEYS",
    "PER_EXPERT_ROLES",
    "PREFIXES",
    "QK_NORMS",
    "STACKED_ROLES",
    "Family",
    "Flag",
    "Layout",
    "Refusal",
    "Renorm",
    "assumptions",
    "family_of",
    "generic",
    "split_layer",
]


class Layout(Enum):
    """How a checkpoint stores a layer's routed experts.

    >>> [x.value for x in FAMILIES["qwen3_vl_moe"].layouts]
    ['fused [E, 2I, H]', 'fused [E, H, 2I]', 'per expert']
    """

    PER_EXPERT = "per expert"  # one 2-D tensor per expert and role
    FUSED = "fused [E, 2I, H]"  # gate_up [E, 2I, H] (gate rows first), down [E, H, I]
    FUSED_T = "fused [E, H, 2I]"  # gate_up [E, H, 2I] (gate columns first), down [E, I, H]
    STACKED = "stacked [E, I, H] per role"  # gate_proj, up_proj [E, I, H], down_proj [E, H, I]


PER_EXPERT_ROLES = {"gate_proj": 0, "up_proj": 1, "down_proj": 2, "w1": 0, "w3": 1, "w2": 2}
"""Per-expert tensor role names -> gate (0), up (1), down (2)."""

CONTAINERS = ("mlp", "block_sparse_moe", "feed_forward", "mixer", "moe", "ffn")
"""The module names a layer's MoE block has in transformers' checkpoints (or none)."""

FUSED_NAMES = (
    ("experts.gate_up_proj", "experts.down_proj"),
    ("input_linear.weight", "output_linear.weight"),
    ("experts.fc1.weight", "experts.fc2.weight"),
    ("experts.w13_weight", "experts.w2_weight"),
)
"""(gate_up, down) names of fused 3-D expert tensors, after the layer's container."""

STACKED_ROLES = {"gate_proj.weight": 0, "up_proj.weight": 1, "down_proj.weight": 2}
"""Names of one 3-D tensor per role holding every expert (step3p7's ``moe.gate_proj.weight``
[E, I, H]), after the layer's container; a 2-D tensor of these names is a dense MLP's."""

PREFIXES = (
    "model.",
    "model.language_model.",
    "language_model.model.",
    "model.language_model.model.",
    "backbone.",
    "model.llm.",
    "thinker.model.",
    "transformer.",
    "",
)
"""Where a language model's ``layers.{L}`` live: plain, inside multimodal wrappers."""

EMBEDDINGS = (
    "embed_tokens.weight",
    "word_embeddings.weight",
    "embeddings.weight",
    "tok_embeddings.weight",
    "wte.weight",
)
"""The token embedding's names after the language model's prefix (d_model, vocab)."""


QK_NORMS = (
    "q_norm.weight",
    "query_layernorm.weight",
    "q_layernorm.weight",
)
"""A per-head q norm's names after the attention module (``self_attn.``, ``attention.``,
``attn.``): its presence says the attention normalises q and k (hunyuan_v1_moe, lfm2_moe,
GLM-4-MoE's Bailing-style descendants param2moe and sarvam_moe)."""


MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention's widths (DeepSeek and its descendants): beyond the block."""
GROUP_ROUTING_KEYS = ("routed_scaling_factor", "n_group", "topk_group")
"""Group-limited routing and the routed experts' scale (DeepSeek-V3 style routers)."""

SIGMOID_BIAS = (
    "router scores are sigmoid(logits), not softmax; the top-k is chosen on scores + the "
    "router's e_score_correction_bias (in the scout, under the checkpoint's name for it), the "
    "weights are the scores alone"
)
"""The DeepSeek-V3 style router, fixed in the modeling code (no config key says it)."""
SIGMOID = "router scores are sigmoid(logits), not softmax"
KOLIBRI_ROUTER = (
    "the top-k is chosen on logits + e_score_correction_bias (a router tensor in the scout); "
    "the weights are sigmoid of the chosen logits"
)
ROUTED_SCALING = "the routed experts' weighted sum is multiplied by routed_scaling_factor"
CLAMP = (
    "the routed experts' SwiGLU is clamped (silu(gate).clamp(max=L) * up.clamp(-L, L)) in "
    "every layer whose limit is not 0; only unclamped SwiGLU experts can be represented"
)
CLAMP_SHARED = (
    "the shared expert's SwiGLU is clamped (silu(gate).clamp(max=L) * up.clamp(-L, L)) in "
    "every layer whose limit is not 0; only unclamped SwiGLU can be represented"
)


@dataclass(frozen=True)
class Renorm:
    """Whether the router divides the chosen top-k weights by their sum: read ``key`` from
    the config, ``default`` when absent (transformers' own default for the family).

    >>> FAMILIES["deepseek_v3"].renorm
    Renorm(key='norm_topk_prob', default=True, only_when=())
    """

    key: str = "norm_topk_prob"
    default: bool = False
    only_when: tuple[str, str, str] | tuple[()] = ()
    """(config key, value, its default): the key above applies only while this one has that
    value; otherwise the router always renormalises (cohere2_moe: ``norm_topk_prob`` divides
    sigmoid scores; with ``expert_selection_fn`` softmax, over the top-k logits, it does
    nothing, the softmax sums to one)."""


@dataclass(frozen=True)
class Flag:
    """A fact a config key decides: ``key``'s JSON boolean, ``default`` when absent.

    >>> FAMILIES["llama4"].qk_norm
    Flag(key='use_qk_norm', default=True)
    """

    key: str
    default: bool


@dataclass(frozen=True)
class Refusal:
    """A configuration under which a converted family is refused, naming ``key``.

    ``kind`` "set": the key holds anything but null, 0, false or an empty list or object, or
    a list with such an entry (a clamp, limit, softcap or scale on the expert path: a family
    whose clamp is configurable but not configured computes plain SwiGLU and converts);
    "differs": it holds another value than the key ``other`` (one attention shape per model);
    "overrides": an object of per-layer objects, one of whose values differs from the
    top-level key of the same name (a per-layer width the arch block cannot hold).

    >>> FAMILIES["bailing_hybrid"].refuse_if[0].key
    'expert_swiglu_limit_list'
    """

    key: str
    reason: str
    kind: str = "set"
    other: str = ""


@dataclass(frozen=True)
class Family:
    """One model type's facts (see the module docstring).

    >>> f = FAMILIES["qwen3_5_moe_text"]  # an alias finds its family
    >>> f.model_type, f.gated_q, f.renorm
    ('qwen3_5_moe', True, True)
    """

    model_type: str
    refused: str = ""
    """Why the format cannot hold this family ("" when it is converted)."""
    aliases: tuple[str, ...] = ()
    """Other ``model_type`` spellings meaning this family (a wrapper's text model type)."""
    layouts: tuple[Layout, ...] = (Layout.PER_EXPERT, Layout.FUSED)
    """The expert layouts its checkpoints are found in (the first is what transformers
    saves); an orientation of a fused tensor is never guessed from its shape."""
    renorm: bool | Renorm = Renorm()
    """The router's top-k renormalisation: fixed by the modeling code, or a config key."""
    gated_q: bool = False
    """q_proj has 2 × heads × head_dim rows (an output gate rides along the queries)."""
    nope: bool = False
    """No rotary position embedding: the arch block's rope_theta is 0 (ruling)."""
    rope_switch: tuple[str, str] | tuple[()] = ()
    """(config key, value): the model has a rotary embedding only while the key has this
    value (granitemoehybrid's ``position_embedding_type``, default null: no RoPE)."""
    qk_norm: bool | Flag | None = None
    """Whether the attention normalises q and k per head before the attention product
    (weightless norms too: see ``semantics``): by construction, by a config key, or None:
    from ``use_qk_norm`` or the tensors (a q norm weight present)."""
    top_k: tuple[str, ...] = ("num_experts_per_tok",)
    experts: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts")
    moe_ffn: tuple[str, ...] = ("moe_intermediate_size",)
    beyond: tuple[str, ...] = ()
    """Config keys an engine must read from the config copy: what the arch block cannot
    carry for this family (routing, layer pattern, attention variants)."""
    semantics: tuple[str, ...] = ()
    """What an engine must compute beyond the block that no config key announces: fixed in
    the modeling code (a sigmoid router with a selection-only correction bias, a routed
    scaling, an output gate), whatever carries it (the code, a scout tensor)."""
    refuse_if: tuple[Refusal, ...] = ()
    """Configurations of this family the format cannot hold (see :class:`Refusal`)."""
    silu_fixed: bool = False
    """The modeling code computes SiLU whatever ``hidden_act`` says (step3p7's config class
    replaces the Hub's ``swigluoai``): the key is not read."""
    architecture: str = ""
    """transformers' class for ``export --hf`` to write into a rebuilt config."""
    rebuild: bool = False
    """Whether ``export --hf`` can rebuild the config exactly from the vault alone."""
    generate: bool = False
    """Whether ``smoe-stream generate`` runs it (its rules: harness/engine/family.cpp, which
    reads only this entry's ``beyond`` keys; tests/stream/test_generate_families.py keeps the
    two equal and the conformance tests prove each against transformers)."""
    note: str = ""

    @property
    def converted(self) -> bool:
        """Whether the sculptor converts this family.

        >>> FAMILIES["qwen3_moe"].converted, FAMILIES["gpt_oss"].converted
        (True, False)
        """
        return not self.refused


_FAMILY_LIST: list[Family] = [
    Family(
        "qwen3_moe",
        generate=True,
        qk_norm=True,
        architecture="Qwen3MoeForCausalLM",
        rebuild=True,
    ),
    Family(
        "qwen2_moe",
        generate=True,
        beyond=("shared_expert_intermediate_size",),
        architecture="Qwen2MoeForCausalLM",
        rebuild=True,
        note="a sigmoid gate (shared_expert_gate) scales the shared expert",
    ),
    Family(
        "olmoe",
        generate=True,
        qk_norm=True,
        moe_ffn=("intermediate_size",),
        architecture="OlmoeForCausalLM",
        rebuild=True,
    ),
    Family(
        "mixtral",
        generate=True,
        renorm=True,
        moe_ffn=("intermediate_size",),
        architecture="MixtralForCausalLM",
        rebuild=True,
    ),
    Family(
        "deepseek_v2",
        renorm=False,
        beyond=(
            "topk_method",
            "first_k_dense_replace",
            "rope_scaling",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        architecture="DeepseekV2ForCausalLM",
        note="transformers' router never renormalises (it ignores norm_topk_prob)",
        semantics=(ROUTED_SCALING,),
    ),
    Family(
        "deepseek_v3",
        renorm=Renorm(default=True),
        beyond=(
            "first_k_dense_replace",
            "rope_scaling",
            "rope_interleave",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        architecture="DeepseekV3ForCausalLM",
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    # from the modeling code of transformers 5.24, family by family
    Family(
        "afmoe",
        renorm=True,
        beyond=(
            "num_dense_layers",
            "route_scale",
            "num_shared_experts",
            "layer_types",
            "global_attn_every_n_layers",
            "sliding_window",
            "mup_enabled",
            "head_dim",
        ),
        semantics=(
            "router scores are sigmoid(logits), not softmax; the top-k is chosen on scores + "
            "expert_bias (a buffer in the scout), the weights are the scores alone",
            "the routed weights are multiplied by route_scale",
        ),
    ),
    Family(
        "aria",
        aliases=("aria_text",),
        layouts=(Layout.FUSED_T,),
        renorm=True,
        top_k=("moe_topk",),
        moe_ffn=("intermediate_size",),
        beyond=("moe_num_shared_experts", "mlp_bias"),
    ),
    Family(
        "axk1",
        renorm=Renorm(default=True),
        beyond=(
            "mlp_layer_types",
            "first_k_dense_replace",
            "rope_interleave",
            "n_shared_experts",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "axk2",
        renorm=Renorm(default=True),
        gated_q=True,
        beyond=(
            "mlp_layer_types",
            "index_topk",
            "index_head_dim",
            "index_n_heads",
            "gated_norm_rank",
            "layer_types",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "bailing_hybrid",
        renorm=Renorm("moe_renormalize", default=True),
        top_k=("num_experts_per_token",),
        refuse_if=(
            Refusal("expert_swiglu_limit_list", CLAMP),
            Refusal("swiglu_limits", CLAMP),
            Refusal("share_expert_swiglu_limit_list", CLAMP_SHARED),
            Refusal("swiglu_limits_shared", CLAMP_SHARED),
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
        beyond=(
            "layer_types",
            "layer_group_size",
            "mlp_layer_types",
            "first_k_dense_replace",
            "num_shared_experts",
            "num_expert_group",
            "topk_group",
            "routed_scaling_factor",
            "moe_renormalize",
            "linear_num_heads",
            "linear_head_dim",
            "short_conv_kernel_size",
            "kda_safe_gate",
            "kda_lower_bound",
            "model_max_length",
            *MLA_KEYS,
        ),
    ),
    Family(
        "beam",
        renorm=Renorm(default=True),
        beyond=(
            "mlp_layer_types",
            "layer_types",
            "sliding_window",
            "rope_parameters",
            "final_logit_softcapping",
            "head_dim",
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, "the routed output is multiplied by routed_scaling_factor"),
    ),
    Family(
        "cohere2_moe",
        renorm=Renorm(default=True, only_when=("expert_selection_fn", "sigmoid", "softmax")),
        moe_ffn=("intermediate_size",),
        beyond=(
            "expert_selection_fn",
            "shared_expert_combination_strategy",
            "num_shared_experts",
            "mlp_layer_types",
            "prefix_dense_intermediate_size",
            "prefix_dense_sliding_window_pattern",
            "layer_types",
            "sliding_window",
            "sliding_window_pattern",
            "layer_norm_eps",
            "logit_scale",
            "tie_word_embeddings",
        ),
    ),
    Family(
        "dbrx",
        refused=(
            "experts are stacked per layer as [E*I, H] w1/v1/w2 tensors (down stored transposed);"
            " not a layout smoe reads yet"
        ),
    ),
    Family(
        "deepseek_ocr2",
        aliases=("deepseek_ocr2_text",),
        renorm=False,
        beyond=("mlp_layer_types", "topk_method", "routed_scaling_factor", "n_shared_experts"),
        semantics=(ROUTED_SCALING,),
    ),
    Family(
        "deepseek_v32",
        renorm=Renorm(default=True),
        beyond=(
            "mlp_layer_types",
            "n_shared_experts",
            "index_topk",
            "index_head_dim",
            "index_n_heads",
            "layer_types",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "deepseek_v4",
        refused=(
            "SwiGLU with clamps: gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, "
            "swiglu_limit) (default 10.0), also in the shared expert"
        ),
    ),
    Family(
        "diffusion_gemma",
        aliases=("diffusion_gemma_text",),
        refused=(
            "a block-diffusion encoder/decoder, not a decoder language model; its experts are "
            "GeGLU with a per-expert scale"
        ),
    ),
    Family(
        "doge",
        refused=(
            "its product-key experts are single neurons stored as embedding rows, not "
            "gate/up/down matrices"
        ),
    ),
    Family(
        "dots1",
        renorm=Renorm(default=False),
        beyond=(
            "first_k_dense_replace",
            "n_shared_experts",
            "layer_types",
            "max_window_layers",
            "sliding_window",
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "dots3_note",
        aliases=("dots3_note_text",),
        renorm=Renorm(default=True),
        refuse_if=(
            Refusal(
                "per_layer_config",
                "some layers' attention or MLP widths differ from the model's; one attention "
                "and MLP shape per model can be represented",
                kind="overrides",
            ),
        ),
        beyond=(
            "per_layer_config",
            "layer_types",
            "mlp_layer_types",
            "shared_experts_intermediate_size",
            "sliding_window",
            *MLA_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "ernie4_5_moe",
        renorm=True,
        top_k=("moe_k",),
        beyond=(
            "moe_layer_start_index",
            "moe_layer_end_index",
            "moe_layer_interval",
            "moe_num_shared_experts",
            "moe_norm_min",
            "use_bias",
            "tie_word_embeddings",
        ),
    ),
    Family(
        "ernie4_5_vl_moe",
        aliases=("ernie4_5_vl_moe_text",),
        refused=(
            "modality-isolated experts: each layer holds text experts and vision experts of "
            "another width (moe_intermediate_size is a list), routed by modality"
        ),
    ),
    Family(
        "ergo",
        refused=(
            "its experts are not gated: down(relu2(up x)) (ReLU squared, no gate matrix), and "
            "each expert's output goes through its own RMSNorm (post_expert_norm) before "
            "weighting; only SiLU-gated (SwiGLU) experts can be represented"
        ),
    ),
    Family(
        "exaone_moe",
        renorm=Renorm(default=True),
        beyond=(
            "layer_types",
            "sliding_window",
            "sliding_window_pattern",
            "mlp_layer_types",
            "first_k_dense_replace",
            "num_shared_experts",
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "flex_olmo",
        renorm=Renorm(default=False),
        moe_ffn=("intermediate_size",),
        beyond=("norm", "num_key_value_heads"),
    ),
    Family(
        "flint",
        renorm=Renorm(default=True),
        beyond=(
            "layer_types",
            "sliding_window",
            "mlp_only_layers",
            "decoder_sparse_step",
            "shared_expert_intermediate_size",
            "attention",
        ),
        semantics=("router scores are sigmoid(logits), not softmax; the top-k is chosen on them",),
    ),
    Family(
        "gemma4",
        aliases=("gemma4_text",),
        refused=(
            "GeGLU - act is config.hidden_activation = gelu_pytorch_tanh, not silu; router also "
            "applies per_expert_scale"
        ),
    ),
    Family(
        "glm4_moe",
        generate=True,
        renorm=Renorm(default=True),
        beyond=(
            "partial_rotary_factor",
            "attention_bias",
            "use_qk_norm",
            "first_k_dense_replace",
            "n_shared_experts",
            *GROUP_ROUTING_KEYS,  # its router limits the top-k to topk_group of n_group groups
            "num_nextn_predict_layers",
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "glm4_moe_lite",
        renorm=Renorm(default=True),
        beyond=(
            "rope_interleave",
            "mlp_layer_types",
            "n_shared_experts",
            "routed_scaling_factor",
            *MLA_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "glm4v_moe",
        aliases=("glm4v_moe_text",),
        renorm=Renorm(default=True),
        beyond=(
            "rope_parameters.mrope_section",
            "partial_rotary_factor",
            "attention_bias",
            "first_k_dense_replace",
            "n_shared_experts",
            "routed_scaling_factor",
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "glm5_next",
        aliases=("glm5_next_text",),
        refused=(
            "clamped SwiGLU - gate.clamp(max=swiglu_limit), up.clamp(+-swiglu_limit) (default "
            "10.0) before silu(gate)*up (also in dense/shared MLPs)"
        ),
    ),
    Family(
        "glm_moe_dsa",
        renorm=Renorm(default=True),
        beyond=(
            "index_topk",
            "index_head_dim",
            "index_n_heads",
            "indexer_types",
            "mlp_layer_types",
            "first_k_dense_replace",
            *MLA_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "gpt_oss",
        refused=(
            "gpt-oss experts interleave gate/up, carry biases and clamp the activation; only "
            "bias-free SiLU-gated (SwiGLU) experts can be represented"
        ),
    ),
    Family(
        "granitemoe",
        generate=True,
        layouts=(Layout.FUSED,),
        renorm=True,
        moe_ffn=("intermediate_size",),
        beyond=(
            "embedding_multiplier",
            "attention_multiplier",
            "residual_multiplier",
            "logits_scaling",
        ),
    ),
    Family(
        "granitemoe_swa",
        layouts=(Layout.FUSED,),
        renorm=True,
        moe_ffn=("intermediate_size",),
        beyond=(
            "embedding_multiplier",
            "attention_multiplier",
            "residual_multiplier",
            "logits_scaling",
            "layer_types",
            "sliding_window",
            "layer_rope_theta",
            "shared_intermediate_size",
        ),
    ),
    Family(
        "granitemoehybrid",
        layouts=(Layout.FUSED,),
        renorm=True,
        rope_switch=("position_embedding_type", "rope"),
        moe_ffn=("intermediate_size",),
        beyond=(
            "embedding_multiplier",
            "attention_multiplier",
            "residual_multiplier",
            "logits_scaling",
            "position_embedding_type",
            "shared_intermediate_size",
        ),
    ),
    Family(
        "granitemoeshared",
        layouts=(Layout.FUSED,),
        renorm=True,
        moe_ffn=("intermediate_size",),
        beyond=(
            "embedding_multiplier",
            "attention_multiplier",
            "residual_multiplier",
            "logits_scaling",
            "shared_intermediate_size",
        ),
    ),
    Family(
        "hunyuan_v1_moe",
        renorm=True,
        qk_norm=True,
        semantics=("q and k are normalised after the rotary embedding, not before",),
        top_k=("moe_topk",),
        moe_ffn=("intermediate_size",),
        beyond=("head_dim", "rope_parameters.alpha", "moe_topk", "num_experts"),
    ),
    Family(
        "hy_v3",
        renorm=True,
        beyond=(
            "router_scaling_factor",
            "mlp_layer_types",
            "num_shared_experts",
            "enable_moe_fp32_combine",
        ),
        semantics=(SIGMOID_BIAS, "the routed weights are multiplied by router_scaling_factor"),
    ),
    Family(
        "hy_v4",
        refused=(
            "clamped SwiGLU - gate.clamp(max=swiglu_limit), up.clamp(+-swiglu_limit) (default "
            "10.0) before silu(gate)*up"
        ),
    ),
    Family(
        "hy_v4_vl",
        aliases=("hy_v4_vl_text",),
        refused="clamped SwiGLU (swiglu_limit, default 10.0), same as hy_v4",
    ),
    Family(
        "inkling2",
        aliases=("inkling2_text",),
        refused=(
            "softcapped SwiGLU: out = "
            "softcap(gate,mlp_gate_softcap=4)*sigmoid(gate)*softcap(up,mlp_up_softcap=25) (tanh "
            "softcaps), fp32; w13 on disk interleaved (even rows gate, odd rows up - verified)"
        ),
    ),
    Family(
        "inkling2_loop",
        aliases=("inkling2_loop_text",),
        refused=(
            "softcapped SwiGLU: down( softcap(gate,4.0)*sigmoid(gate) * softcap(up,25.0) ), "
            "softcap=tanh(x/c)*c (mlp_gate_softcap, mlp_up_softcap)"
        ),
    ),
    Family(
        "inkling_mm_model",
        aliases=("inkling_text",),
        refused=(
            "the experts' gate and up rows are interleaved on disk (w13_weight) and the router "
            "normalises routed and shared experts together with a learned global scale"
        ),
    ),
    Family(
        "jamba",
        renorm=False,
        moe_ffn=("intermediate_size",),
        beyond=(
            "expert_layer_period",
            "expert_layer_offset",
            "attn_layer_period",
            "attn_layer_offset",
            "mamba_d_state",
            "mamba_d_conv",
            "mamba_expand",
            "mamba_dt_rank",
            "mamba_conv_bias",
            "mamba_proj_bias",
        ),
        nope=True,
    ),
    Family(
        "jetmoe",
        refused=(
            "the MoE block adds a learned output bias and the attention is itself a mixture of "
            "experts (MoA); only bias-free SiLU-gated (SwiGLU) experts can be represented"
        ),
    ),
    Family(
        "kimi_k25",
        renorm=Renorm(default=True),
        beyond=(
            "rope_interleave",
            "rope_parameters",
            "n_shared_experts",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "kimi_linear",
        renorm=Renorm("moe_renormalize", default=True),
        top_k=("num_experts_per_token",),
        beyond=(
            "layer_types",
            "mlp_layer_types",
            "num_shared_experts",
            "moe_renormalize",
            "num_expert_group",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
            "linear_num_heads",
            "linear_head_dim",
            "linear_conv_kernel_dim",
        ),
        nope=True,
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "kolibri1",
        renorm=Renorm(default=False),
        beyond=("layer_types", "sliding_window", "shared_expert_intermediate_size"),
        semantics=(KOLIBRI_ROUTER,),
    ),
    Family(
        "kolibri1_1",
        renorm=Renorm(default=False),
        beyond=(
            "layer_types",
            "sliding_window",
            "shared_expert_intermediate_size",
            "mlp_only_layers",
            "mlp_only_intermediate_size",
            "kv_source_layers",
            "index_layers",
            "index_topk",
            "index_pool_size",
            "index_compression",
            "index_num_heads",
            "index_num_local_tokens",
            "index_num_sink_tokens",
        ),
        semantics=(
            KOLIBRI_ROUTER,
            "indexed-attention layers attend to keys chosen by a weightless indexer, and their "
            "keys and values are rounded to NVFP4 (E2M1, an E4M3 scale per 16 values) first; "
            "layers listed in kv_source_layers reuse another layer's keys and values (no k_proj)",
        ),
    ),
    Family(
        "laguna",
        renorm=True,
        beyond=(
            "mlp_layer_types",
            "layer_types",
            "num_attention_heads_per_layer",
            "gating",
            "moe_routed_scaling_factor",
            "moe_router_logit_softcapping",
            "rope_parameters",
            "sliding_window",
        ),
        semantics=(
            SIGMOID_BIAS,
            "router logits are soft-capped first (tanh(x / c) * c, c = "
            "moe_router_logit_softcapping, when above 0)",
            "the routed output is multiplied by moe_routed_scaling_factor",
        ),
    ),
    Family(
        "lara_mini",
        layouts=(Layout.FUSED,),
        renorm=Renorm(default=True),
        beyond=(
            "layer_types",
            "sliding_window",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "shared_expert_intermediate_size",
        ),
    ),
    Family(
        "lfm2_moe",
        renorm=Renorm(default=True),
        qk_norm=True,
        semantics=(
            "router scores are sigmoid(logits), not softmax; with use_expert_bias the top-k "
            "is chosen on scores + expert_bias (a buffer in the scout), the weights are the "
            "scores alone",
            ROUTED_SCALING,
        ),
        beyond=(
            "layer_types",
            "num_dense_layers",
            "use_expert_bias",
            "routed_scaling_factor",
            "norm_eps",
            "conv_bias",
        ),
    ),
    Family(
        "llama4",
        aliases=("llama4_text",),
        layouts=(Layout.FUSED_T,),
        renorm=False,
        qk_norm=Flag("use_qk_norm", default=True),
        semantics=(
            "the q/k norm is a weightless RMS norm, applied only in the layers with RoPE "
            "(no_rope_layers says which)",
            "the routed weights are sigmoid of the chosen top-k logits (no softmax)",
        ),
        moe_ffn=("intermediate_size",),
        beyond=(
            "moe_layers",
            "interleave_moe_layer_step",
            "intermediate_size_mlp",
            "no_rope_layers",
            "use_qk_norm",
            "attention_chunk_size",
            "attn_temperature_tuning",
            "floor_scale",
            "attn_scale",
        ),
    ),
    Family(
        "longcat_flash",
        refused=(
            "zero-computation (identity) experts share the router's slots with the routed ones, "
            "and each layer has two attention/MLP sublayers with a shortcut MoE"
        ),
    ),
    Family(
        "mellum",
        renorm=Renorm(default=True),
        beyond=("mlp_layer_types", "layer_types", "sliding_window", "rope_parameters"),
    ),
    Family(
        "mimo_v2_flash",
        refused=(
            "its full and sliding-window attention layers have different key/value head counts; "
            "one attention shape per model can be represented"
        ),
    ),
    Family(
        "minicpm5_moe",
        renorm=Renorm(default=True),
        gated_q=True,
        beyond=(
            "mlp_layer_types",
            "n_shared_experts",
            "head_dim",
            *GROUP_ROUTING_KEYS,
        ),
        semantics=(
            SIGMOID_BIAS,
            ROUTED_SCALING,
            "q_proj (q_gate_proj in the modeling code) holds per head head_dim query rows then "
            "head_dim output-gate rows; the attention output is multiplied by sigmoid(gate)",
        ),
    ),
    Family(
        "minimax",
        renorm=True,
        moe_ffn=("intermediate_size",),
        beyond=(
            "layer_types",
            "block_size",
            "full_attn_alpha_factor",
            "full_attn_beta_factor",
            "linear_attn_alpha_factor",
            "linear_attn_beta_factor",
            "mlp_alpha_factor",
            "mlp_beta_factor",
        ),
    ),
    Family(
        "minimax_m2",
        generate=True,
        renorm=True,
        moe_ffn=("intermediate_size",),
        # released configs give the rotary share as rotary_dim (transformers converts it)
        beyond=("rope_parameters.partial_rotary_factor", "rotary_dim"),
        semantics=(SIGMOID_BIAS,),
    ),
    Family(
        "minimax_m3_vl",
        aliases=("minimax_m3_vl_text",),
        refused=(
            "GPT-OSS-style clamped gate: gate=clamp(gate,max=swiglu_limit 7.0), "
            "up=clamp(up,+-7.0), out=down((up+1) * gate*sigmoid(swiglu_alpha 1.702*gate)); same "
            "for shared expert"
        ),
    ),
    Family(
        "mistral4",
        layouts=(Layout.FUSED,),
        renorm=Renorm(default=True),
        beyond=(
            "rope_interleave",
            "rope_parameters",
            "n_shared_experts",
            "n_group",
            "topk_group",
            *MLA_KEYS,
        ),
        semantics=(ROUTED_SCALING,),
    ),
    Family(
        "mistral_large4",
        aliases=("mistral_large4_text",),
        renorm=True,
        beyond=(
            "mlp_layer_types",
            "first_k_dense_replace",
            "no_rope_layers",
            "kv_source_layers",
            "indexer_types",
            "layer_types",
            "final_logit_softcapping",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "v_head_dim",
        ),
        semantics=(ROUTED_SCALING,),
    ),
    Family(
        "muse_spark",
        aliases=("muse_spark_text",),
        refused=(
            "each expert output goes through post_expert_norm (input-scaled RMSNorm: "
            "rmsnorm(y*(1+w)), eps post_norm_eps) before weighting; experts live in a projected "
            "space: x -> pre_expert_proj -> (1+w) RMSNorm -> experts -> post_expert_proj"
        ),
    ),
    Family(
        "nemotron_h",
        refused=(
            "non-gated expert down(relu2(up x)) (mlp_hidden_act='relu2' = ReLU squared), no gate "
            "matrix; optional moe_latent_size wraps experts in fc1_latent_proj/fc2_latent_proj"
        ),
    ),
    Family(
        "nllb-moe",
        refused=(
            "an encoder-decoder translation model; its experts are ReLU MLPs with biases, not "
            "SwiGLU"
        ),
    ),
    Family("openai_privacy_filter", refused="not a decoder language model"),
    Family(
        "param2moe",
        renorm=Renorm(default=True),
        beyond=(
            "use_qk_norm",
            "attention_bias",
            "first_k_dense_replace",
            "n_shared_experts",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "head_dim",
        ),
        architecture="Glm4MoeForCausalLM",
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
        note="transformers runs it with the GLM-4-MoE classes (rotary over the whole head)",
    ),
    Family(
        "phimoe",
        renorm=False,
        moe_ffn=("intermediate_size",),
        beyond=(
            "router_jitter_noise",
            "attention_bias",
            "lm_head_bias",
            "rope_parameters",
            "sliding_window",
        ),
    ),
    Family(
        "qwen3_5_moe",
        aliases=("qwen3_5_moe_text",),
        renorm=True,
        gated_q=True,
        beyond=("layer_types", "shared_expert_gate", "head_dim"),
    ),
    Family(
        "qwen3_next",
        renorm=Renorm(default=True),
        gated_q=True,
        beyond=(
            "layer_types",
            "rope_parameters.partial_rotary_factor",
            "shared_expert_gate",
            "head_dim",
        ),
    ),
    Family(
        "qwen3_omni_moe",
        aliases=("qwen3_omni_moe_text", "qwen3_omni_moe_thinker", "qwen3_omni_moe_talker_text"),
        renorm=Renorm("thinker_config.norm_topk_prob", default=True),
        top_k=("thinker_config.num_experts_per_tok",),
        moe_ffn=("thinker_config.moe_intermediate_size",),
        beyond=("nested", "mrope_section"),
    ),
    Family(
        "qwen3_vl_moe",
        aliases=("qwen3_vl_moe_text",),
        layouts=(Layout.FUSED, Layout.FUSED_T, Layout.PER_EXPERT),
        renorm=True,
        beyond=(
            "mrope_section",
            "mlp_only_layers",
            "decoder_sparse_step",
            "head_dim",
            "tie_word_embeddings",
        ),
    ),
    Family(
        "qwen4_exp",
        aliases=("qwen4_exp_text",),
        renorm=Renorm(default=True),
        gated_q=True,
        beyond=("layer_types", "output_gate_type"),
    ),
    Family(
        "sarvam_mla",
        renorm=Renorm(default=True),
        beyond=(
            "first_k_dense_replace",
            "rope_interleave",
            "n_shared_experts",
            *MLA_KEYS,
            *GROUP_ROUTING_KEYS,
        ),
        architecture="DeepseekV3ForCausalLM",
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
        note="transformers runs it with the DeepSeek-V3 classes",
    ),
    Family(
        "sarvam_moe",
        renorm=Renorm(default=True),
        beyond=(
            "use_qk_norm",
            "attention_bias",
            "partial_rotary_factor",
            "first_k_dense_replace",
            "n_shared_experts",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "head_dim",
        ),
        architecture="Glm4MoeForCausalLM",
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
        note="transformers runs it with the GLM-4-MoE classes",
    ),
    Family(
        "solar_open",
        renorm=Renorm(default=True),
        beyond=(
            "e_score_correction_bias",
            "routed_scaling_factor",
            "n_shared_experts",
            "head_dim",
            "attention_bias",
        ),
        semantics=(SIGMOID_BIAS, ROUTED_SCALING),
    ),
    Family(
        "step3p7",
        aliases=("step3p5",),
        layouts=(Layout.STACKED,),
        renorm=True,
        silu_fixed=True,
        moe_ffn=("moe_intermediate_size",),
        refuse_if=(
            Refusal("swiglu_limits", CLAMP),
            Refusal("swiglu_limits_shared", CLAMP_SHARED),
            Refusal(
                "num_sliding_attention_heads",
                "the sliding-window layers have another number of attention heads than the "
                "full-attention layers; one attention shape per model can be represented",
                kind="differs",
                other="num_attention_heads",
            ),
        ),
        beyond=(
            "layer_types",
            "mlp_layer_types",
            "sliding_window",
            "share_expert_dim",
            "moe_router_scaling_factor",
            "query_pre_attn_scalar",
            "rope_parameters",
            "head_dim",
        ),
        semantics=(
            SIGMOID_BIAS,
            "the routed output is multiplied by moe_router_scaling_factor",
            "attention output gated per head by sigmoid(g_proj x) (g_proj in the scout)",
        ),
        note=(
            "Hub checkpoints (Step-3.5/3.7-Flash) clamp layers 43-44 through swiglu_limits "
            "and are refused naming it; their hidden_act 'swigluoai' is replaced by silu in "
            "transformers' config class, as the modeling code computes"
        ),
    ),
    Family(
        "switch_transformers",
        refused="an encoder-decoder T5 model; its experts are ReLU MLPs, not SwiGLU",
    ),
    Family(
        "unlimited_ocr",
        aliases=("unlimited_ocr_text",),
        renorm=False,
        beyond=(
            "routed_scaling_factor",
            "topk_method",
            "n_shared_experts",
            "mlp_layer_types",
            "sliding_window",
            "mlp_bias",
            "attention_bias",
        ),
        semantics=(ROUTED_SCALING,),
    ),
    Family(
        "zaya",
        layouts=(Layout.FUSED,),
        renorm=False,
        qk_norm=True,
        semantics=(
            "q and k are L2-normalised per head to sqrt(head_dim) (a weightless RMS norm), "
            "and k is then multiplied per key/value head by self_attn.qk_norm.temp (scout)",
        ),
        beyond=(
            "router_hidden_size",
            "layer_types",
            "residual",
            "lm_head_bias",
            "tie_word_embeddings",
        ),
    ),
]

FAMILIES: dict[str, Family] = {f.model_type: f for f in _FAMILY_LIST}
"""model_type -> its family; aliases (a wrapper's text model type) included."""
for _f in _FAMILY_LIST:
    for _alias in _f.aliases:
        FAMILIES.setdefault(_alias, _f)

_GENERIC = Family("", layouts=tuple(Layout))  # stacked too: its names are its own
_GENERIC_KEYS = {
    "top_k": (
        "num_experts_per_tok",
        "moe_top_k",
        "top_k",
        "moe_k",
        "moe_topk",
        "num_experts_per_token",
    ),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),
    "moe_ffn": ("moe_intermediate_size", "expert_intermediate_size"),
}


def family_of(model_type: str) -> Family | None:
    """The registry's entry for ``model_type`` (an alias finds its family), or None.

    >>> family_of("qwen3_moe").architecture
    'Qwen3MoeForCausalLM'
    >>> family_of("no_such_model") is None
    True
    """
    return FAMILIES.get(model_type)


def generic(model_type: str) -> Family:
    """The assumptions made for a model type the registry does not know: any known
    layout, every known key spelling, ``norm_topk_prob`` read with default false.

    >>> generic("new_moe").top_k[:2]
    ('num_experts_per_tok', 'moe_top_k')
    """
    return Family(
        model_type,
        layouts=_GENERIC.layouts,
        top_k=_GENERIC_KEYS["top_k"],
        experts=_GENERIC_KEYS["experts"],
        moe_ffn=_GENERIC_KEYS["moe_ffn"],
    )


def assumptions(model_type: str) -> str:
    """The warning for a model type the registry does not know: what was assumed.

    >>> print(assumptions("new_moe"))  # doctest: +NORMALIZE_WHITESPACE
    model_type 'new_moe' is not in smoe's family registry (smoe families lists it); \
assumed: the routed experts compute down(silu(gate x) * up x) with no bias or clamp, the \
router renormalises its top-k weights only if norm_topk_prob is true, q_proj has \
num_attention_heads x head_dim rows; check the modeling code before using the vault
    """
    return (
        f"model_type {model_type!r} is not in smoe's family registry (smoe families lists "
        "it); assumed: the routed experts compute down(silu(gate x) * up x) with no bias or "
        "clamp, the router renormalises its top-k weights only if norm_topk_prob is true, "
        "q_proj has num_attention_heads x head_dim rows; check the modeling code before "
        "using the vault"
    )


_LAYER_NAME = re.compile(r"^(?P<prefix>(?:[A-Za-z_]\w*\.)*?)(?:layers|blocks)\.(?P<layer>\d+)\.")


def split_layer(name: str) -> tuple[str, int, str] | None:
    """(prefix, layer, rest) of a tensor under ``layers.{L}.`` / ``blocks.{L}.``.

    >>> split_layer("model.language_model.layers.3.mlp.experts.0.up_proj.weight")
    ('model.language_model.', 3, 'mlp.experts.0.up_proj.weight')
    >>> split_layer("lm_head.weight") is None
    True
    """
    m = _LAYER_NAME.match(name)
    if m is None:
        return None
    return m.group("prefix"), int(m.group("layer")), name[m.end() :]
