"""Tiny configs for mlx-lm's model families: the model zoo the tests build.

Every config is small (hidden 64, 4 heads, a few layers, vocab ~400) so a model
builds and runs in well under a second. Sliding windows are 8 tokens, so a
test context of a few dozen tokens runs past every window. Each family's
config holds only what its mlx-lm `ModelArgs` requires or what makes the
model exercise its distinctive parts (sliding layers, expert layers beside
dense ones, linear-attention layers, embedding and logit scales).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

WINDOW = 8  # sliding-window size of every windowed family
DROP = object()  # a config value that removes the base field


@dataclass(frozen=True)
class Shape:
    n_layers: int = 6
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 384
    tie: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def base(s: Shape) -> dict[str, Any]:
    """The llama-style fields most families read."""
    return {
        "hidden_size": s.hidden,
        "num_hidden_layers": s.n_layers,
        "intermediate_size": s.intermediate,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "rms_norm_eps": 1e-6,
        "layer_norm_eps": 1e-5,
        "norm_eps": 1e-5,
        "vocab_size": s.vocab,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": s.tie,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }


def alternating(s: Shape, every: int, kind: str, other: str) -> list[str]:
    """Layer types: every `every`-th layer is `kind`, the others `other`."""
    return [kind if (i + 1) % every == 0 else other for i in range(s.n_layers)]


def _moe(s: Shape, **extra) -> dict[str, Any]:
    return {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, **extra}


YARN = {"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.0}


def _deepseek(s: Shape) -> dict[str, Any]:
    # MLA attention; the first layer dense, the others mixture-of-experts.
    return {
        "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "routed_scaling_factor": 1.0, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 16, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "n_group": 1, "topk_group": 1, "moe_layer_freq": 1, "first_k_dense_replace": 1,
        "num_key_value_heads": s.heads,
    }


def _mamba_like(s: Shape) -> dict[str, Any]:
    return {"state_size": 8, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "time_step_rank": 4,
            "intermediate_size": 2 * s.hidden}


# family -> config (beyond base) for a shape; "model_type" is the family unless the config says otherwise.
FAMILIES: dict[str, Callable[[Shape], dict[str, Any]]] = {
    # --- plain pre-norm decoders ---------------------------------------------------------
    "llama": lambda s: {},
    "mistral": lambda s: {},  # mlx-lm maps it to llama
    "qwen2": lambda s: {"head_dim": DROP},
    "qwen3": lambda s: {},
    "phi3": lambda s: {},
    "starcoder2": lambda s: {"norm_epsilon": 1e-5, "use_bias": True},
    "smollm3": lambda s: {"no_rope_layer_interval": 3},
    "stablelm": lambda s: {"use_qkv_bias": True, "partial_rotary_factor": 0.5, "qk_layernorm": True},
    "internlm3": lambda s: {"bias": False, "qkv_bias": False},
    "ernie4_5": lambda s: {"use_bias": False},
    "hunyuan_v1_dense": lambda s: {"use_qk_norm": True},
    "helium": lambda s: {},
    "seed_oss": lambda s: {"attention_out_bias": False},
    "nemotron": lambda s: {"hidden_act": "relu2", "partial_rotary_factor": 0.5, "norm_eps": 1e-5},
    "olmo2": lambda s: {},
    "apertus": lambda s: {"post_norm": False, "qk_norm": True, "hidden_act": "xielu"},
    "glm": lambda s: {},
    "glm4": lambda s: {"partial_rotary_factor": 0.5},
    "mimo": lambda s: {},
    "telechat3": lambda s: {},
    "nanbeige": lambda s: {},
    "nanochat": lambda s: {"n_embd": s.hidden, "n_head": s.heads, "n_kv_head": s.kv_heads, "n_layer": s.n_layers},
    "internlm2": lambda s: {"bias": False},
    "deepseek": lambda s: {},
    # families whose config names the layer count its own way carry only that name, as their checkpoints do
    "exaone": lambda s: {"num_layers": s.n_layers, "layer_norm_epsilon": 1e-5, "num_hidden_layers": DROP},
    "phi": lambda s: {"partial_rotary_factor": 0.5, "num_key_value_heads": s.heads},
    "gpt2": lambda s: {"n_ctx": 256, "n_embd": s.hidden, "n_head": s.heads, "n_layer": s.n_layers,
                       "n_positions": 256, "layer_norm_epsilon": 1e-5, "num_hidden_layers": DROP},
    "gpt_neox": lambda s: {"rotary_emb_base": 10000, "rotary_pct": 0.5, "num_key_value_heads": s.heads},
    "gpt_bigcode": lambda s: {"n_embd": s.hidden, "n_layer": s.n_layers, "n_inner": s.intermediate,
                              "n_head": s.heads, "n_positions": 256, "layer_norm_epsilon": 1e-5,
                              "num_hidden_layers": DROP},
    "openelm": lambda s: {"num_transformer_layers": s.n_layers, "model_dim": s.hidden, "ffn_dim_divisor": 16,
                          "num_query_heads": [s.heads] * s.n_layers, "num_kv_heads": [s.kv_heads] * s.n_layers,
                          "ffn_multipliers": [2.0] * s.n_layers, "num_hidden_layers": DROP},
    # --- extra scalars and norms outside the blocks ----------------------------------------
    "gemma": lambda s: {"hidden_act": "gelu_pytorch_tanh", "num_key_value_heads": 1},
    "gemma2": lambda s: {"query_pre_attn_scalar": s.head_dim, "attn_logit_softcapping": 50.0,
                         "final_logit_softcapping": 30.0, "sliding_window": WINDOW},
    "granite": lambda s: {"logits_scaling": 2.0, "attention_multiplier": 0.2, "embedding_multiplier": 3.0,
                          "residual_multiplier": 0.5},
    "minicpm": lambda s: {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 12.0,
                          "tie_word_embeddings": False},  # mlx-lm cannot load it tied
    "cohere": lambda s: {"logit_scale": 0.125, "use_qk_norm": True, "layer_norm_eps": 1e-5},
    # --- sliding windows ---------------------------------------------------------------
    "ministral": lambda s: {"model_type": "llama", "sliding_window": WINDOW,
                            "layer_types": alternating(s, 3, "full_attention", "sliding_attention")},
    "gemma3_text": lambda s: {"sliding_window": WINDOW, "sliding_window_pattern": 3,
                              "query_pre_attn_scalar": s.head_dim, "num_key_value_heads": 1},
    "cohere2": lambda s: {"sliding_window": WINDOW, "sliding_window_pattern": 3, "logit_scale": 0.125,
                          "layer_norm_eps": 1e-5},
    "exaone4": lambda s: {"rope_scaling": None, "sliding_window": WINDOW, "sliding_window_pattern": "LLG"},
    "olmo3": lambda s: {"sliding_window": WINDOW,
                        "layer_types": alternating(s, 3, "full_attention", "sliding_attention")},
    "gpt_oss": lambda s: {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW,
                          "layer_types": alternating(s, 2, "full_attention", "sliding_attention")},
    "baichuan_m1": lambda s: {"sliding_window": WINDOW, "sliding_window_layers": [1, 3, 5][: s.n_layers // 2],
                              "conv_window": 2, "tie_word_embeddings": False},  # mlx-lm cannot run it tied
    "plamo3": lambda s: {"sliding_window": WINDOW, "sliding_window_pattern": 3},
    # --- mixture of experts ------------------------------------------------------------
    "mixtral": lambda s: {"num_local_experts": 4, "num_experts_per_tok": 2},
    "phimoe": lambda s: {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": lambda s: _moe(s, shared_expert_intermediate_size=64, head_dim=DROP),
    "qwen3_moe": lambda s: _moe(s, decoder_sparse_step=2, mlp_only_layers=[0], norm_topk_prob=True),
    "olmoe": lambda s: _moe(s),
    "granitemoe": lambda s: {"logits_scaling": 2.0, "attention_multiplier": 0.2, "embedding_multiplier": 3.0,
                             "residual_multiplier": 0.5, "num_local_experts": 4, "num_experts_per_tok": 2},
    "ernie4_5_moe": lambda s: {"use_bias": False, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32,
                               "moe_layer_start_index": 1, "moe_num_shared_experts": 1},
    "glm4_moe": lambda s: {"moe_intermediate_size": 32, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                           "n_shared_experts": 1, "n_routed_experts": 4, "routed_scaling_factor": 1.0,
                           "num_experts_per_tok": 2, "first_k_dense_replace": 1, "rope_scaling": None,
                           "use_qk_norm": True, "partial_rotary_factor": 0.5},
    "dots1": lambda s: {"first_k_dense_replace": 1, "moe_intermediate_size": 32, "n_routed_experts": 4,
                        "n_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 2,
                        "routed_scaling_factor": 1.0},
    "bailing_moe": lambda s: {"moe_intermediate_size": 32, "num_experts": 4, "num_shared_experts": 1,
                              "norm_topk_prob": True, "num_experts_per_tok": 2, "first_k_dense_replace": 1},
    "minimax": lambda s: {"num_experts_per_tok": 2, "num_local_experts": 4, "shared_intermediate_size": 0,
                          "rotary_dim": s.head_dim},
    "Klear": lambda s: _moe(s, mlp_only_layers=[0], decoder_sparse_step=1, n_shared_experts=1,
                            norm_topk_prob=True),
    "exaone_moe": lambda s: _moe(s, num_shared_experts=1, sliding_window=WINDOW,
                                 layer_types=alternating(s, 3, "full_attention", "sliding_attention"),
                                 is_moe_layer=[i > 0 for i in range(s.n_layers)]),
    "solar_open": lambda s: {"moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 4,
                             "routed_scaling_factor": 1.0, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
                             "norm_topk_prob": True, "partial_rotary_factor": 1.0},
    "deepseek_v2": lambda s: {**_deepseek(s), "topk_method": "greedy", "n_group": 1, "rope_scaling": YARN},
    "deepseek_v3": _deepseek,
    "kimi_k2": lambda s: {**_deepseek(s), "model_type": "kimi_k2"},  # mlx-lm maps it to deepseek_v3
    "youtu_llm": _deepseek,
    "minicpm3": lambda s: {"dim_model_base": 32, "q_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                           "kv_lora_rank": 16, "scale_depth": 1.4, "scale_emb": 12.0,
                           "rope_scaling": {"original_max_position_embeddings": 4096}},
    "llama4_text": lambda s: {"intermediate_size_mlp": s.intermediate, "no_rope_layers": [1, 1, 1, 0, 1, 1][: s.n_layers],
                              "use_qk_norm": True, "num_local_experts": 4, "num_experts_per_tok": 1,
                              "interleave_moe_layer_step": 2, "attention_chunk_size": WINDOW},
    # --- linear attention and state-space layers ---------------------------------------
    "qwen3_next": lambda s: _moe(s, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                linear_value_head_dim=16, linear_conv_kernel_dim=4, decoder_sparse_step=1,
                                shared_expert_intermediate_size=64, mlp_only_layers=[], partial_rotary_factor=0.5,
                                full_attention_interval=3),
    "qwen3_5": lambda s: {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 16,
                          "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 3,
                          "partial_rotary_factor": 0.5},
    "lfm2": lambda s: {"conv_bias": False, "conv_L_cache": 3, "block_dim": s.hidden, "block_multiple_of": 16,
                       "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False,
                       "layer_types": alternating(s, 3, "full_attention", "conv")},
    "mamba": _mamba_like,
    "mamba2": lambda s: {"num_heads": 8, "head_dim": 16, "state_size": 8, "layer_norm_epsilon": 1e-5,
                         "conv_kernel": 4, "n_groups": 1, "use_bias": False, "use_conv_bias": True,
                         "time_step_limit": [0.0, 1e9], "time_step_rank": 4, "intermediate_size": 2 * s.hidden},
    "falcon_h1": lambda s: {"mamba_d_ssm": 2 * s.hidden, "mamba_n_heads": 8, "mamba_d_head": 16,
                            "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_d_conv": 4},
    "jamba": lambda s: {"attn_layer_offset": 1, "attn_layer_period": 3, "expert_layer_offset": 1,
                        "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 8, "mamba_expand": 2,
                        "num_experts": 4, "num_experts_per_tok": 2},
    "granitemoehybrid": lambda s: {"embedding_multiplier": 3.0, "attention_multiplier": 0.2,
                                   "logits_scaling": 2.0, "residual_multiplier": 0.5,
                                   "layer_types": alternating(s, 3, "attention", "mamba"),
                                   "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_proj_bias": False,
                                   "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_n_groups": 1,
                                   "mamba_conv_bias": True, "shared_intermediate_size": s.intermediate},
    "nemotron_h": lambda s: {"mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": False,
                             "ssm_state_size": 8, "conv_kernel": 4, "n_groups": 1, "layer_norm_epsilon": 1e-5,
                             "use_bias": False, "use_conv_bias": True,
                             "hybrid_override_pattern": list("M*-M*-")[: s.n_layers]},
    "plamo2": lambda s: {"mamba_d_state": 8, "mamba_d_conv": 4, "mamba_num_heads": 8, "hidden_size_per_head": 16,
                         "mamba_step": 3, "mamba_enabled": True, "full_attention_idx": []},
    "recurrent_gemma": lambda s: {"conv1d_width": 4, "logits_soft_cap": 30.0, "attention_window_size": WINDOW,
                                  "block_types": ["recurrent", "recurrent", "attention"],
                                  "lru_width": s.hidden, "num_key_value_heads": 1},
    "rwkv7": lambda s: {"head_dim": 16, "a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8,
                        "decay_low_rank_dim": 8},
    "kimi_linear": lambda s: {"linear_attn_config": {"kda_layers": [1, 2, 4, 5][: s.n_layers], "num_heads": 4,
                                                     "head_dim": 16, "short_conv_kernel_size": 4},
                              "model_max_length": 4096, "num_experts": 4, "moe_intermediate_size": 32,
                              "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16,
                              "num_experts_per_token": 2},
    "olmo_hybrid": lambda s: {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
                              "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
                              "linear_allow_neg_eigval": False,
                              "layer_types": alternating(s, 3, "full_attention", "linear_attention")},
    # --- more recent families -----------------------------------------------------------
    "ministral3": lambda s: {"rope_parameters": {"rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
                                                 "original_max_position_embeddings": 16, "rope_type": "default"},
                             "sliding_window": WINDOW,
                             "layer_types": alternating(s, 3, "full_attention", "sliding_attention")},
    "mistral4": lambda s: {**_deepseek(s), "rope_parameters": {"rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
                                                               "original_max_position_embeddings": 16,
                                                               "rope_type": "default"}},
    "glm4_moe_lite": lambda s: {**_deepseek(s), "num_nextn_predict_layers": 0},
    "afmoe": lambda s: _moe(s, num_shared_experts=1, num_dense_layers=1, sliding_window=WINDOW,
                            layer_types=alternating(s, 3, "full_attention", "sliding_attention")),
    "step3p5": lambda s: {"num_attention_groups": s.kv_heads, "sliding_window": WINDOW,
                          "layer_types": alternating(s, 3, "full_attention", "sliding_attention"),
                          "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 32, "share_expert_dim": 32,
                          "moe_layers_enum": ",".join(str(i) for i in range(1, s.n_layers))},
    "qwen2_vl": lambda s: {"head_dim": DROP},  # the text part of a vision-language wrapper
    "gemma3": lambda s: {"vocab_size": s.vocab,  # the vision-language wrapper mlx-community's Gemma 3 use
                         "text_config": {**base(s), "model_type": "gemma3_text", "sliding_window": WINDOW,
                                         "sliding_window_pattern": 3, "query_pre_attn_scalar": s.head_dim,
                                         "num_key_value_heads": 1}},
    "qwen3_vl": lambda s: {"text_config": {**base(s), "model_type": "qwen3_vl",
                                           "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]}}},
    # --- layers that share state with other layers (refused) ----------------------------
    "hunyuan": lambda s: {"moe_topk": 2, "num_experts": 4, "num_shared_expert": 1, "use_mixed_mlp_moe": True,
                          "use_qk_norm": True, "use_cla": True, "cla_share_factor": 2, "moe_intermediate_size": 32,
                          "rope_scaling": {"type": "dynamic", "factor": 1.0, "alpha": 1.0}},
    "afm7": lambda s: {"hidden_dim": s.hidden, "num_layers": s.n_layers, "num_kv_reuse_layers": 2,
                       "num_heads": s.heads, "num_kv_heads": s.kv_heads},
    "iquestloopcoder": lambda s: {"loop_num": 2, "loop_window_size": WINDOW},
    "talkie": lambda s: {},
    "gemma3n": lambda s: {"text_config": {**base(s), "model_type": "gemma3n_text", "sliding_window": WINDOW,
                                          "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": s.vocab,
                                          "num_kv_shared_layers": 2, "altup_num_inputs": 2,
                                          "rope_local_base_freq": 10000.0, "final_logit_softcapping": 30.0,
                                          "altup_coef_clip": 120.0, "altup_correct_scale": True,
                                          "altup_active_idx": 0,
                                          "laurel_rank": 8, "intermediate_size": [s.intermediate] * s.n_layers,
                                          "activation_sparsity_pattern": [0.0] * s.n_layers,
                                          "layer_types": alternating(s, 3, "full_attention", "sliding_attention")}},
    "gemma4_text": lambda s: {"sliding_window": WINDOW, "sliding_window_pattern": 3, "global_head_dim": 32,
                              "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
                              "vocab_size_per_layer_input": s.vocab, "num_key_value_heads": 1,
                              "use_double_wide_mlp": False},
}
