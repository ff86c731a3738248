//! llama.cpp tensor names mapped onto Hugging Face names, so model code can use one set of
//! names for safetensors and GGUF checkpoints alike.
//!
//! The mapping depends on the architecture only where llama.cpp reuses a name: `ffn_norm` is
//! the norm before the MLP, which HF calls `post_attention_layernorm` in llama-style blocks but
//! `pre_feedforward_layernorm` in Gemma 2/3 blocks, which also have a real post-attention norm.

/// Global (non-layer) tensors.
const GLOBAL: &[(&str, &str)] = &[
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    // Gemma 4's per-layer inputs.
    ("per_layer_token_embd", "model.embed_tokens_per_layer"),
    ("per_layer_model_proj", "model.per_layer_model_projection"),
    ("per_layer_proj_norm", "model.per_layer_projection_norm"),
];

/// LFM2's layer tensors (`blk.N.<gguf>` → `model.layers.N.<hf>`), named apart from every
/// other family in both.
const LFM2_LAYER: &[(&str, &str)] = &[
    ("attn_norm", "operator_norm"),
    ("ffn_norm", "ffn_norm"),
    ("ffn_gate", "feed_forward.w1"),
    ("ffn_up", "feed_forward.w3"),
    ("ffn_down", "feed_forward.w2"),
    ("attn_q_norm", "self_attn.q_layernorm"),
    ("attn_k_norm", "self_attn.k_layernorm"),
    ("attn_output", "self_attn.out_proj"),
    ("shortconv.conv", "conv.conv"),
    ("shortconv.in_proj", "conv.in_proj"),
    ("shortconv.out_proj", "conv.out_proj"),
];

/// A Mamba-2 mixer's tensors, with HF's leaf under the mixer's module (`ssm_a` and `ssm_d`
/// have no suffix in the file).
const MAMBA2_MIXER: &[(&str, &str)] = &[
    ("ssm_in.weight", "in_proj.weight"),
    ("ssm_in.bias", "in_proj.bias"),
    ("ssm_conv1d.weight", "conv1d.weight"),
    ("ssm_conv1d.bias", "conv1d.bias"),
    ("ssm_dt.bias", "dt_bias"),
    ("ssm_a", "A_log"),
    ("ssm_d", "D"),
    ("ssm_norm.weight", "norm.weight"),
    ("ssm_out.weight", "out_proj.weight"),
    ("ssm_out.bias", "out_proj.bias"),
];

/// Nemotron-H's other layer tensors, with HF's full leaf under `backbone.layers.N.` (every
/// block's module is its `mixer`: attention, MLP, or experts behind latent projections).
const NEMOTRON_H_LAYER: &[(&str, &str)] = &[
    ("attn_norm.weight", "norm.weight"),
    ("attn_q.weight", "mixer.q_proj.weight"),
    ("attn_k.weight", "mixer.k_proj.weight"),
    ("attn_v.weight", "mixer.v_proj.weight"),
    ("attn_output.weight", "mixer.o_proj.weight"),
    ("ffn_up.weight", "mixer.up_proj.weight"),
    ("ffn_down.weight", "mixer.down_proj.weight"),
    ("ffn_gate_inp.weight", "mixer.gate.weight"),
    ("exp_probs_b.bias", "mixer.gate.e_score_correction_bias"),
    ("ffn_up_exps.weight", "mixer.experts.up_proj.weight"),
    ("ffn_down_exps.weight", "mixer.experts.down_proj.weight"),
    ("ffn_latent_down.weight", "mixer.fc1_latent_proj.weight"),
    ("ffn_latent_up.weight", "mixer.fc2_latent_proj.weight"),
    ("ffn_up_shexp.weight", "mixer.shared_experts.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mixer.shared_experts.down_proj.weight",
    ),
];

/// Granite 4 hybrid's expert and shared-MLP tensors, with HF's full leaf under
/// `model.layers.N.`: the converter splits the fused `input_linear`s into gate and up stacks,
/// read back under the names the family's loader takes for a split layout.
const GRANITE_HYBRID_LAYER: &[(&str, &str)] = &[
    (
        "ffn_gate_inp.weight",
        "block_sparse_moe.router.layer.weight",
    ),
    (
        "ffn_gate_exps.weight",
        "block_sparse_moe.experts.gate_proj.weight",
    ),
    (
        "ffn_up_exps.weight",
        "block_sparse_moe.experts.up_proj.weight",
    ),
    (
        "ffn_down_exps.weight",
        "block_sparse_moe.output_linear.weight",
    ),
    ("ffn_gate_shexp.weight", "shared_mlp.gate_proj.weight"),
    ("ffn_up_shexp.weight", "shared_mlp.up_proj.weight"),
    ("ffn_down_shexp.weight", "shared_mlp.output_linear.weight"),
];

/// DeepSeek-V3's (llama.cpp's deepseek2) layer tensors, with HF's full leaf under
/// `model.layers.N.`: latent attention, with `kv_b_proj` read as the converter splits it
/// (`k_b_proj`, `v_b_proj`), the router's score correction and the shared experts.
const DEEPSEEK2_LAYER: &[(&str, &str)] = &[
    ("attn_q_a.weight", "self_attn.q_a_proj.weight"),
    ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
    ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
    (
        "attn_kv_a_mqa.weight",
        "self_attn.kv_a_proj_with_mqa.weight",
    ),
    ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
    ("attn_k_b.weight", "self_attn.k_b_proj.weight"),
    ("attn_v_b.weight", "self_attn.v_b_proj.weight"),
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_experts.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_experts.down_proj.weight",
    ),
];

/// Qwen3.5's and Qwen3-Next's layer tensors, with HF's full leaf under `model.layers.N.`
/// (`ssm_a` has no suffix in the file): the gated delta nets under `linear_attn`, the shared
/// expert. Qwen3-Next's `in_proj_qkvz` is written split like Qwen3.5's projections, its
/// `in_proj_ba` as it is (`ssm_ba`).
const QWEN35_LAYER: &[(&str, &str)] = &[
    ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
    ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
    ("ssm_ba.weight", "linear_attn.in_proj_ba.weight"),
    ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
    ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
];

/// Gemma 4's layer tensors that llama.cpp names apart from every other family, with HF's full
/// leaf name: several HF parameters have no `.weight` (`layer_scalar`, the fused expert
/// stacks, the router's scales), and the router and expert scales hide under other tensors'
/// stems (`ffn_gate_inp.scale`, `ffn_down_exps.scale`).
const GEMMA4_LAYER: &[(&str, &str)] = &[
    ("layer_output_scale.weight", "layer_scalar"),
    ("inp_gate.weight", "per_layer_input_gate.weight"),
    ("proj.weight", "per_layer_projection.weight"),
    ("post_norm.weight", "post_per_layer_input_norm.weight"),
    (
        "pre_ffw_norm_2.weight",
        "pre_feedforward_layernorm_2.weight",
    ),
    (
        "post_ffw_norm_1.weight",
        "post_feedforward_layernorm_1.weight",
    ),
    (
        "post_ffw_norm_2.weight",
        "post_feedforward_layernorm_2.weight",
    ),
    ("ffn_gate_inp.weight", "router.proj.weight"),
    ("ffn_gate_inp.scale", "router.scale"),
    ("ffn_down_exps.scale", "router.per_expert_scale"),
    ("ffn_gate_up_exps.weight", "experts.gate_up_proj"),
    ("ffn_down_exps.weight", "experts.down_proj"),
];

/// Per-layer tensors shared by every architecture (`blk.N.<gguf>` → `model.layers.N.<hf>`).
const LAYER: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
    // Stacked experts `[experts, out, in]`, under the name `mlxkit create` writes them, which
    // the families' expert loaders read without restacking.
    ("ffn_gate_exps", "mlp.experts.gate_proj"),
    ("ffn_up_exps", "mlp.experts.up_proj"),
    ("ffn_down_exps", "mlp.experts.down_proj"),
];

/// Whether `architecture` has Gemma 2–4-style sandwich norms around attention and MLP.
fn has_sandwich_norms(architecture: &str) -> bool {
    matches!(architecture, "gemma2" | "gemma3" | "gemma4")
}

/// The HF name of llama.cpp tensor `name` for `architecture`, or `None` when the name is not
/// one this table knows (callers keep such names as they are).
pub fn hf_tensor_name(architecture: &str, name: &str) -> Option<String> {
    if architecture.starts_with("nemotron_h") {
        return nemotron_h_name(name);
    }
    if architecture == "granitehybrid"
        && let Some(hf) = granite_hybrid_name(name)
    {
        return Some(hf);
    }
    if matches!(architecture, "qwen35" | "qwen35moe" | "qwen3next")
        && let Some((layer, leaf)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.'))
        && let Some(&(_, hf)) = QWEN35_LAYER.iter().find(|(g, _)| *g == leaf)
    {
        return Some(format!("model.layers.{layer}.{hf}"));
    }
    let (stem, suffix) = name.rsplit_once('.')?;
    if let Some(&(_, hf)) = GLOBAL.iter().find(|(g, _)| *g == stem) {
        return Some(format!("{hf}.{suffix}"));
    }
    if architecture == "lfm2" && stem == "token_embd_norm" {
        return Some(format!("model.embedding_norm.{suffix}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    if architecture == "lfm2"
        && let Some(&(_, hf)) = LFM2_LAYER.iter().find(|(g, _)| *g == part)
    {
        return Some(format!("model.layers.{layer}.{hf}.{suffix}"));
    }
    if architecture == "deepseek2" {
        let leaf = format!("{part}.{suffix}");
        if let Some(&(_, hf)) = DEEPSEEK2_LAYER.iter().find(|(g, _)| *g == leaf) {
            return Some(format!("model.layers.{layer}.{hf}"));
        }
    }
    if architecture == "gemma4" {
        let leaf = format!("{part}.{suffix}");
        if let Some(&(_, hf)) = GEMMA4_LAYER.iter().find(|(g, _)| *g == leaf) {
            return Some(format!("model.layers.{layer}.{hf}"));
        }
    }
    let hf = match part {
        "ffn_norm" if has_sandwich_norms(architecture) => "pre_feedforward_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        // Llama 4's feed-forward blocks, dense or not, are its `feed_forward`.
        "ffn_gate" | "ffn_up" | "ffn_down" if architecture == "llama4" => {
            let which = &part["ffn_".len()..];
            return Some(format!(
                "model.layers.{layer}.feed_forward.{which}_proj.{suffix}"
            ));
        }
        "ffn_gate_inp" if architecture == "llama4" => "feed_forward.router",
        "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps" if architecture == "llama4" => {
            let which = part["ffn_".len()..].trim_end_matches("_exps");
            return Some(format!(
                "model.layers.{layer}.feed_forward.experts.{which}_proj.{suffix}"
            ));
        }
        "ffn_gate_shexp" | "ffn_up_shexp" | "ffn_down_shexp" if architecture == "llama4" => {
            let which = part["ffn_".len()..].trim_end_matches("_shexp");
            return Some(format!(
                "model.layers.{layer}.feed_forward.shared_expert.{which}_proj.{suffix}"
            ));
        }
        "attn_sinks" if architecture == "gpt-oss" => {
            return Some(format!("model.layers.{layer}.self_attn.sinks"));
        }
        "ffn_gate_inp" if architecture == "gpt-oss" => "mlp.router",
        // Phi-3 keeps its fused projections fused.
        "attn_qkv" if architecture == "phi3" => "self_attn.qkv_proj",
        "ffn_up" if architecture == "phi3" => "mlp.gate_up_proj",
        "ffn_gate_inp" if architecture == "mixtral" => "block_sparse_moe.gate",
        "ffn_gate_exps" if architecture == "mixtral" => "block_sparse_moe.experts.w1",
        "ffn_up_exps" if architecture == "mixtral" => "block_sparse_moe.experts.w3",
        "ffn_down_exps" if architecture == "mixtral" => "block_sparse_moe.experts.w2",
        other => LAYER.iter().find(|(g, _)| *g == other)?.1,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Nemotron-H's names: its weights live under `backbone.`.
fn nemotron_h_name(name: &str) -> Option<String> {
    let global = match name {
        "token_embd.weight" => Some("backbone.embeddings.weight"),
        "output_norm.weight" => Some("backbone.norm_f.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(hf) = global {
        return Some(hf.to_string());
    }
    let (layer, leaf) = name.strip_prefix("blk.")?.split_once('.')?;
    let layer: u32 = layer.parse().ok()?;
    if let Some(hf) = mamba2_leaf(leaf) {
        return Some(format!("backbone.layers.{layer}.mixer.{hf}"));
    }
    let &(_, hf) = NEMOTRON_H_LAYER.iter().find(|(g, _)| *g == leaf)?;
    Some(format!("backbone.layers.{layer}.{hf}"))
}

/// The HF leaf of a Mamba-2 mixer tensor (`blk.N.<leaf>`), under the mixer's module.
fn mamba2_leaf(leaf: &str) -> Option<&'static str> {
    MAMBA2_MIXER
        .iter()
        .find(|(g, _)| *g == leaf)
        .map(|&(_, hf)| hf)
}

/// Granite 4 hybrid's names: Mamba-2 mixers under `mamba`, experts and the shared MLP under
/// their own names, the rest as every family's.
fn granite_hybrid_name(name: &str) -> Option<String> {
    if let Some((layer, leaf)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        let layer: u32 = layer.parse().ok()?;
        if let Some(hf) = mamba2_leaf(leaf) {
            return Some(format!("model.layers.{layer}.mamba.{hf}"));
        }
        if let Some(&(_, hf)) = GRANITE_HYBRID_LAYER.iter().find(|(g, _)| *g == leaf) {
            return Some(format!("model.layers.{layer}.{hf}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_llama_names() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.7.attn_q.weight",
                "model.layers.7.self_attn.q_proj.weight",
            ),
            (
                "blk.0.attn_output.weight",
                "model.layers.0.self_attn.o_proj.weight",
            ),
            (
                "blk.29.ffn_norm.weight",
                "model.layers.29.post_attention_layernorm.weight",
            ),
            (
                "blk.3.ffn_gate.weight",
                "model.layers.3.mlp.gate_proj.weight",
            ),
            ("blk.3.attn_q.bias", "model.layers.3.self_attn.q_proj.bias"),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_tensor_name("llama", gguf).as_deref(), Some(hf), "{gguf}");
        }
    }

    #[test]
    fn maps_gemma3_sandwich_norms() {
        let cases = [
            (
                "blk.1.attn_norm.weight",
                "model.layers.1.input_layernorm.weight",
            ),
            (
                "blk.1.post_attention_norm.weight",
                "model.layers.1.post_attention_layernorm.weight",
            ),
            (
                "blk.1.ffn_norm.weight",
                "model.layers.1.pre_feedforward_layernorm.weight",
            ),
            (
                "blk.1.post_ffw_norm.weight",
                "model.layers.1.post_feedforward_layernorm.weight",
            ),
            (
                "blk.1.attn_k_norm.weight",
                "model.layers.1.self_attn.k_norm.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(
                hf_tensor_name("gemma3", gguf).as_deref(),
                Some(hf),
                "{gguf}"
            );
        }
    }

    #[test]
    fn leaves_unknown_names_alone() {
        assert_eq!(hf_tensor_name("llama", "rope_freqs.weight"), None);
        assert_eq!(hf_tensor_name("llama", "blk.x.attn_q.weight"), None);
        assert_eq!(hf_tensor_name("llama", "blk.1.mystery.weight"), None);
    }
}
