//! GGUF metadata translated into a Hugging Face-style `config.json`, so one config reader
//! serves safetensors and GGUF checkpoints alike.
//!
//! Only facts the file states are written, with exceptions where llama.cpp itself hard-codes
//! what HF configs spell out: in Gemma 3 every sixth layer is global (the rest use the sliding
//! window) and local layers use a rope base of 10 000; in Gemma 2 every other layer is global
//! and the rope base is 10 000; Gemma's query scale follows the head width; Qwen3-MoE
//! renormalizes its top-k expert weights. A key the file lacks is left out rather than
//! defaulted, so a reader that requires it fails naming it.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::{GgufTensorInfo, MetaValue};

/// llama.cpp's fixed sliding-window pattern for Gemma 3 (five local layers, then one global).
/// More layers than any published model has (the largest have about 128); a `block_count`
/// above it builds no per-layer lists.
const MAX_LISTED_LAYERS: u64 = 1 << 16;
const GEMMA3_SLIDING_WINDOW_PATTERN: u64 = 6;
/// llama.cpp's rope base for Gemma 3's sliding-window layers when a file does not give one.
const GEMMA3_LOCAL_ROPE_BASE: f64 = 10_000.0;

/// The HF `model_type` and `architectures` entry for a GGUF architecture.
fn hf_model_type(architecture: &str) -> (&str, Option<&'static str>) {
    match architecture {
        "llama" => ("llama", Some("LlamaForCausalLM")),
        "mistral" => ("mistral", Some("MistralForCausalLM")),
        "qwen2" => ("qwen2", Some("Qwen2ForCausalLM")),
        "qwen3" => ("qwen3", Some("Qwen3ForCausalLM")),
        "qwen3moe" => ("qwen3_moe", Some("Qwen3MoeForCausalLM")),
        "gemma" => ("gemma", Some("GemmaForCausalLM")),
        "gemma2" => ("gemma2", Some("Gemma2ForCausalLM")),
        "gemma3" => ("gemma3_text", Some("Gemma3ForCausalLM")),
        "gemma4" => ("gemma4_text", Some("Gemma4ForCausalLM")),
        "phi3" => ("phi3", Some("Phi3ForCausalLM")),
        "mixtral" => ("mixtral", Some("MixtralForCausalLM")),
        "olmo2" => ("olmo2", Some("Olmo2ForCausalLM")),
        "mistral3" => ("mistral", Some("MistralForCausalLM")),
        "lfm2" => ("lfm2", Some("Lfm2ForCausalLM")),
        "nemotron_h" | "nemotron_h_moe" => ("nemotron_h", Some("NemotronHForCausalLM")),
        "granitehybrid" => ("granitemoehybrid", Some("GraniteMoeHybridForCausalLM")),
        "deepseek2" => ("deepseek_v3", Some("DeepseekV3ForCausalLM")),
        "qwen35" => ("qwen3_5_text", Some("Qwen3_5ForCausalLM")),
        "gpt-oss" => ("gpt_oss", Some("GptOssForCausalLM")),
        "llama4" => ("llama4_text", Some("Llama4ForCausalLM")),
        "qwen35moe" => ("qwen3_5_moe_text", Some("Qwen3_5MoeForCausalLM")),
        "qwen3next" => ("qwen3_next", Some("Qwen3NextForCausalLM")),
        other => (other, None),
    }
}

/// A metadata value as JSON: numbers, strings, booleans and arrays of them.
pub fn metadata_json(value: &MetaValue) -> Value {
    match value {
        MetaValue::U8(v) => json!(v),
        MetaValue::I8(v) => json!(v),
        MetaValue::U16(v) => json!(v),
        MetaValue::I16(v) => json!(v),
        MetaValue::U32(v) => json!(v),
        MetaValue::I32(v) => json!(v),
        MetaValue::U64(v) => json!(v),
        MetaValue::I64(v) => json!(v),
        // f32 metadata (epsilons, rope bases) printed at f32 precision: 1e-5, not 9.99999974e-6.
        MetaValue::F32(v) => v
            .to_string()
            .parse::<f64>()
            .map(|f| json!(f))
            .unwrap_or(Value::Null),
        MetaValue::F64(v) => json!(v),
        MetaValue::Bool(v) => json!(v),
        MetaValue::String(v) => json!(v),
        MetaValue::Array(items) => Value::Array(items.iter().map(metadata_json).collect()),
    }
}

/// The family a GGUF file holds: its `general.architecture`, except that llama.cpp files
/// Mixtral as `llama` with stacked experts.
pub fn gguf_family<'a>(architecture: &'a str, tensors: &[GgufTensorInfo]) -> &'a str {
    let has_experts = || tensors.iter().any(|t| t.name.contains(".ffn_gate_exps."));
    if architecture == "llama" && has_experts() {
        "mixtral"
    } else {
        architecture
    }
}

/// Builds the HF-style config of a GGUF file from its metadata and tensor list.
pub fn hf_config(metadata: &BTreeMap<String, MetaValue>, tensors: &[GgufTensorInfo]) -> Value {
    let mut config = Map::new();
    let arch = metadata
        .get("general.architecture")
        .and_then(MetaValue::as_str)
        .unwrap_or_default();
    let stated = |suffix: &str| metadata.get(&format!("{arch}.{suffix}"));
    // Per-layer lists below are as long as `block_count`: one that claims more layers than
    // any model has gets none, so nothing here is sized by it. It is still copied as
    // `num_hidden_layers`, which the model's reader refuses by name.
    let key = |suffix: &str| {
        stated(suffix).filter(|v| {
            suffix != "block_count" || v.as_u64().is_some_and(|n| n <= MAX_LISTED_LAYERS)
        })
    };
    let family = gguf_family(arch, tensors);
    let copy = |config: &mut Map<String, Value>, hf: &str, value: Option<&MetaValue>| {
        if let Some(v) = value {
            config.insert(hf.to_string(), metadata_json(v));
        }
    };

    let (model_type, class) = hf_model_type(family);
    config.insert("model_type".into(), json!(model_type));
    if let Some(class) = class {
        config.insert("architectures".into(), json!([class]));
    }
    copy(&mut config, "hidden_size", key("embedding_length"));
    copy(&mut config, "num_hidden_layers", stated("block_count"));
    copy(&mut config, "intermediate_size", key("feed_forward_length"));
    copy(
        &mut config,
        "num_attention_heads",
        key("attention.head_count"),
    );
    copy(
        &mut config,
        "num_key_value_heads",
        key("attention.head_count_kv").or(key("attention.head_count")),
    );
    copy(&mut config, "head_dim", key("attention.key_length"));
    copy(
        &mut config,
        "rms_norm_eps",
        key("attention.layer_norm_rms_epsilon"),
    );
    copy(&mut config, "rope_theta", key("rope.freq_base"));
    copy(
        &mut config,
        "max_position_embeddings",
        key("context_length"),
    );
    copy(
        &mut config,
        "sliding_window",
        key("attention.sliding_window"),
    );
    copy(&mut config, "num_experts", key("expert_count"));
    if family == "mixtral" {
        copy(&mut config, "num_local_experts", key("expert_count"));
    }
    copy(&mut config, "num_experts_per_tok", key("expert_used_count"));
    copy(
        &mut config,
        "moe_intermediate_size",
        key("expert_feed_forward_length"),
    );
    copy(
        &mut config,
        "attn_logit_softcapping",
        key("attn_logit_softcapping"),
    );
    copy(
        &mut config,
        "final_logit_softcapping",
        key("final_logit_softcapping"),
    );
    copy(
        &mut config,
        "bos_token_id",
        metadata.get("tokenizer.ggml.bos_token_id"),
    );
    copy(
        &mut config,
        "eos_token_id",
        metadata.get("tokenizer.ggml.eos_token_id"),
    );
    copy(
        &mut config,
        "pad_token_id",
        metadata.get("tokenizer.ggml.padding_token_id"),
    );

    if let Some(vocab) = vocab_size(metadata, arch, tensors) {
        config.insert("vocab_size".into(), json!(vocab));
    }
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    config.insert("tie_word_embeddings".into(), json!(!has_output));

    if let Some(scaling) = rope_scaling(metadata, arch) {
        config.insert("rope_scaling".into(), scaling);
    }
    if arch.starts_with("gemma") {
        config.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
        if let Some(scalar) = gemma_query_pre_attn_scalar(arch, &key) {
            config.insert("query_pre_attn_scalar".into(), json!(scalar));
        }
    }
    if arch == "qwen3moe" {
        // llama.cpp renormalizes Qwen3-MoE's top-k weights unconditionally; the file says it
        // only where a converter wrote `expert_weights_norm`.
        let normalize = key("expert_weights_norm")
            .and_then(MetaValue::as_bool)
            .unwrap_or(true);
        config.insert("norm_topk_prob".into(), json!(normalize));
    }
    if arch.starts_with("nemotron_h") {
        nemotron_h_blocks(&mut config, &key, tensors);
    }
    if arch == "llama4" {
        llama4_layers(&mut config, &key);
    }
    if arch == "gpt-oss" {
        gpt_oss_layers(&mut config, &key, tensors);
    }
    if arch == "qwen35" || arch == "qwen35moe" {
        qwen35_layers(&mut config, &key, key("full_attention_interval"));
    }
    if arch == "qwen3next" {
        qwen3next_layers(&mut config, &key);
    }
    if arch == "deepseek2" {
        deepseek2_attention(&mut config, &key);
    }
    if arch == "granitehybrid" {
        granite_hybrid_layers(&mut config, &key, tensors);
    }
    if arch == "lfm2" {
        lfm2_layers(&mut config, &key, tensors);
    }
    if arch == "gemma4" {
        gemma4_layers(&mut config, &key, tensors);
    }
    if arch == "gemma3" {
        gemma3_layer_types(
            &mut config,
            key("attention.sliding_window_pattern"),
            key("block_count"),
        );
        // The converter writes the sliding layers' base; older files leave llama.cpp's.
        let local = key("rope.freq_base_swa")
            .and_then(MetaValue::as_f64)
            .unwrap_or(GEMMA3_LOCAL_ROPE_BASE);
        config.insert("rope_local_base_freq".into(), json!(local));
    }
    if arch == "gemma2" {
        gemma2_layers(&mut config, &key);
    }
    Value::Object(config)
}

/// Gemma scales queries by `query_pre_attn_scalar^-½`, which no GGUF file states: llama.cpp
/// uses the head width (`attention.key_length`), except for the two 27B models, told apart by
/// their layer count (46 in Gemma 2, 62 in Gemma 3), whose scalar is `hidden / heads`.
fn gemma_query_pre_attn_scalar<'a>(
    arch: &str,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) -> Option<u64> {
    let size = |k: &str| key(k).and_then(MetaValue::as_u64);
    let is_27b = matches!(
        (arch, size("block_count")),
        ("gemma2", Some(46)) | ("gemma3", Some(62))
    );
    if is_27b
        && let (Some(hidden), Some(heads)) =
            (size("embedding_length"), size("attention.head_count"))
        && heads > 0
    {
        return Some(hidden / heads);
    }
    size("attention.key_length")
}

/// llama.cpp's sliding window for Gemma 2 when a file gives none.
const GEMMA2_SLIDING_WINDOW: u64 = 4096;
/// llama.cpp's soft caps on Gemma 2's attention logits and output logits when a file gives
/// none.
const GEMMA2_SOFTCAPS: [(&str, f64); 2] = [
    ("attn_logit_softcapping", 50.0),
    ("final_logit_softcapping", 30.0),
];
/// llama.cpp's rope base for a file without `rope.freq_base` (Gemma 2's converter never
/// writes one).
const DEFAULT_ROPE_BASE: f64 = 10_000.0;

/// Gemma 2 as llama.cpp reads it. Its converter writes neither a rope base nor the layer
/// kinds, so llama.cpp's fixed choices stand in: a base of 10 000, and sliding layers
/// alternating with global ones from the first (layers 0, 2, 4, … slide). The window and the
/// two soft caps come from the file, or llama.cpp's defaults when it lacks them.
fn gemma2_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) {
    config
        .entry("rope_theta")
        .or_insert_with(|| json!(DEFAULT_ROPE_BASE));
    config
        .entry("sliding_window")
        .or_insert_with(|| json!(GEMMA2_SLIDING_WINDOW));
    for (hf, default) in GEMMA2_SOFTCAPS {
        config.entry(hf).or_insert_with(|| json!(default));
    }
    alternate_sliding_first(config, key);
}

fn vocab_size(
    metadata: &BTreeMap<String, MetaValue>,
    arch: &str,
    tensors: &[GgufTensorInfo],
) -> Option<u64> {
    if let Some(n) = metadata
        .get(&format!("{arch}.vocab_size"))
        .and_then(MetaValue::as_u64)
    {
        return Some(n);
    }
    if let Some(tokens) = metadata
        .get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
    {
        return Some(tokens.len() as u64);
    }
    let embedding = tensors.iter().find(|t| t.name == "token_embd.weight")?;
    embedding.shape.first().map(|&rows| rows as u64)
}

fn rope_scaling(metadata: &BTreeMap<String, MetaValue>, arch: &str) -> Option<Value> {
    let get = |suffix: &str| metadata.get(&format!("{arch}.rope.scaling.{suffix}"));
    let kind = get("type").and_then(MetaValue::as_str)?;
    if kind == "none" {
        return None;
    }
    let mut scaling = Map::new();
    scaling.insert("rope_type".into(), json!(kind));
    if let Some(factor) = get("factor") {
        scaling.insert("factor".into(), metadata_json(factor));
    }
    if let Some(original) = get("original_context_length") {
        scaling.insert(
            "original_max_position_embeddings".into(),
            metadata_json(original),
        );
    }
    Some(Value::Object(scaling))
}

/// `sliding_window_pattern` and `layer_types`: from the file's per-layer flags or pattern when
/// it has them, else llama.cpp's fixed pattern.
fn gemma3_layer_types(
    config: &mut Map<String, Value>,
    pattern: Option<&MetaValue>,
    block_count: Option<&MetaValue>,
) {
    let Some(layers) = block_count.and_then(MetaValue::as_u64) else {
        return;
    };
    let kind = |sliding: bool| {
        if sliding {
            "sliding_attention"
        } else {
            "full_attention"
        }
    };
    if let Some(flags) = pattern.and_then(MetaValue::as_array) {
        let types: Vec<&str> = flags
            .iter()
            .map(|f| kind(f.as_bool().unwrap_or(false)))
            .collect();
        config.insert("layer_types".into(), json!(types));
        return;
    }
    let every = pattern
        .and_then(MetaValue::as_u64)
        .filter(|&p| p > 0)
        .unwrap_or(GEMMA3_SLIDING_WINDOW_PATTERN);
    config.insert("sliding_window_pattern".into(), json!(every));
    let types: Vec<&str> = (0..layers).map(|i| kind((i + 1) % every != 0)).collect();
    config.insert("layer_types".into(), json!(types));
}

/// A per-layer key's values: its array, or its one value for every layer.
fn per_layer(value: Option<&MetaValue>, layers: usize) -> Option<Vec<u64>> {
    match value? {
        MetaValue::Array(items) => items.iter().map(MetaValue::as_u64).collect(),
        one => Some(vec![one.as_u64()?; layers]),
    }
}

/// Gemma 4's layers as its config spells them: the kinds from the per-layer sliding flags;
/// `key_length` is the full layers' head width and `key_length_swa` the sliding ones', written
/// back as `head_dim` and a `per_layer_config` with the full layers' key/value heads (a
/// per-layer array when they differ); MLP widths per layer (doubled on the layers that share
/// keys and values); keys reused as values where a full layer computing its own keys has no
/// `attn_v` (llama.cpp infers it the same way: there is no key for it); the experts block
/// where experts are counted; and the two rope bases (llama.cpp's 10 000 for sliding layers
/// when the file gives none).
fn gemma4_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    tensors: &[GgufTensorInfo],
) {
    let Some(flags) = key("attention.sliding_window_pattern").and_then(MetaValue::as_array) else {
        return;
    };
    let sliding: Vec<bool> = flags.iter().map(|f| f.as_bool().unwrap_or(false)).collect();
    let layers = sliding.len();
    let kind = |slides: bool| {
        if slides {
            "sliding_attention"
        } else {
            "full_attention"
        }
    };
    config.insert(
        "layer_types".into(),
        json!(sliding.iter().map(|&s| kind(s)).collect::<Vec<_>>()),
    );
    let shared = key("attention.shared_kv_layers")
        .and_then(MetaValue::as_u64)
        .unwrap_or(0);
    config.insert("num_kv_shared_layers".into(), json!(shared));
    let own_kv = layers.saturating_sub(shared as usize);
    if let Some(width) = key("attention.key_length_swa").and_then(MetaValue::as_u64) {
        config.insert("head_dim".into(), json!(width));
    }
    let full_width = key("attention.key_length").and_then(MetaValue::as_u64);
    if let Some(kv) = per_layer(key("attention.head_count_kv"), layers) {
        let sliding_kv = sliding
            .iter()
            .position(|&s| s)
            .and_then(|i| kv.get(i))
            .or(kv.first());
        if let Some(&n) = sliding_kv {
            config.insert("num_key_value_heads".into(), json!(n));
        }
        let mut overrides = Map::new();
        for (i, &slides) in sliding.iter().enumerate() {
            if !slides {
                let mut layer = Map::new();
                if let Some(width) = full_width {
                    layer.insert("head_dim".into(), json!(width));
                }
                if let Some(&n) = kv.get(i) {
                    layer.insert("num_key_value_heads".into(), json!(n));
                }
                overrides.insert(i.to_string(), Value::Object(layer));
            }
        }
        config.insert("per_layer_config".into(), Value::Object(overrides));
    }
    if let Some(widths) = per_layer(key("feed_forward_length"), layers)
        && let (Some(&narrow), Some(&wide)) = (widths.iter().min(), widths.iter().max())
    {
        config.insert("intermediate_size".into(), json!(narrow));
        config.insert("use_double_wide_mlp".into(), json!(wide > narrow));
    }
    let has = |name: String| tensors.iter().any(|t| t.name == name);
    let keys_as_values = (0..own_kv).any(|i| {
        !sliding[i]
            && has(format!("blk.{i}.attn_k.weight"))
            && !has(format!("blk.{i}.attn_v.weight"))
    });
    config.insert("attention_k_eq_v".into(), json!(keys_as_values));
    if let Some(width) = key("embedding_length_per_layer_input").and_then(MetaValue::as_u64) {
        config.insert("hidden_size_per_layer_input".into(), json!(width));
    }
    if let Some(table) = tensors
        .iter()
        .find(|t| t.name == "per_layer_token_embd.weight")
    {
        config.insert(
            "vocab_size_per_layer_input".into(),
            json!(table.shape.first()),
        );
    }
    if let Some(experts) = key("expert_count").and_then(MetaValue::as_u64) {
        config.insert("enable_moe_block".into(), json!(experts > 0));
        if let Some(k) = key("expert_used_count") {
            config.insert("top_k_experts".into(), metadata_json(k));
        }
    }
    let base = |k: &str| key(k).and_then(MetaValue::as_f64);
    let mut rope = Map::new();
    rope.insert(
        "sliding_attention".into(),
        json!({"rope_type": "default", "rope_theta": base("rope.freq_base_swa").unwrap_or(10_000.0)}),
    );
    if let Some(theta) = base("rope.freq_base") {
        rope.insert(
            "full_attention".into(),
            json!({"rope_type": "default", "rope_theta": theta}),
        );
    }
    config.insert("rope_parameters".into(), Value::Object(rope));
}

/// LFM2's layers as its config spells them: a layer with no key/value heads is a short
/// convolution; the MLP width is written already adjusted; biases where the file has them.
fn lfm2_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    tensors: &[GgufTensorInfo],
) {
    let layers = key("block_count").and_then(MetaValue::as_u64).unwrap_or(0) as usize;
    if let Some(kv) = per_layer(key("attention.head_count_kv"), layers) {
        let kinds: Vec<&str> = kv
            .iter()
            .map(|&n| if n == 0 { "conv" } else { "full_attention" })
            .collect();
        config.insert("layer_types".into(), json!(kinds));
        if let Some(&n) = kv.iter().find(|&&n| n > 0) {
            config.insert("num_key_value_heads".into(), json!(n));
        }
    }
    if let Some(kernel) = key("shortconv.l_cache") {
        config.insert("conv_L_cache".into(), metadata_json(kernel));
    }
    if let Some(eps) = key("attention.layer_norm_rms_epsilon") {
        config.insert("norm_eps".into(), metadata_json(eps));
    }
    config.insert("block_auto_adjust_ff_dim".into(), json!(false));
    let biased = tensors
        .iter()
        .any(|t| t.name.ends_with(".shortconv.in_proj.bias"));
    config.insert("conv_bias".into(), json!(biased));
}

/// Nemotron-H's blocks as its config spells them: a block with key/value heads is attention,
/// one with an MLP width an MLP (experts where it has a router), the rest Mamba-2 mixers,
/// whose sizes come from the `ssm.*` keys (`time_step_rank` heads sharing `inner_size`
/// features); the experts' routing from the `expert_*` keys.
fn nemotron_h_blocks<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    tensors: &[GgufTensorInfo],
) {
    let layers = key("block_count").and_then(MetaValue::as_u64).unwrap_or(0) as usize;
    let (Some(kv), Some(ff)) = (
        per_layer(key("attention.head_count_kv"), layers),
        per_layer(key("feed_forward_length"), layers),
    ) else {
        return;
    };
    let routed = |layer: usize| {
        let router = format!("blk.{layer}.ffn_gate_inp.weight");
        tensors.iter().any(|t| t.name == router)
    };
    let blocks: Vec<&str> = kv
        .iter()
        .zip(&ff)
        .enumerate()
        .map(|(i, (&kv, &ff))| match (kv, ff) {
            (0, 0) => "linear_attention",
            (0, _) if routed(i) => "moe",
            (0, _) => "mlp",
            _ => "full_attention",
        })
        .collect();
    config.insert("layers_block_type".into(), json!(blocks));
    if let Some(&n) = kv.iter().find(|&&n| n > 0) {
        config.insert("num_key_value_heads".into(), json!(n));
    }
    // The dense MLP's width; a model of experts only has none, and the reader's required key
    // then takes the experts' (unused).
    let dense = blocks.iter().zip(&ff).find(|(b, _)| **b == "mlp");
    if let Some(&n) = dense.map(|(_, n)| n).or(ff.iter().find(|&&n| n > 0)) {
        config.insert("intermediate_size".into(), json!(n));
    }
    if let Some(eps) = key("attention.layer_norm_rms_epsilon") {
        config.insert("layer_norm_epsilon".into(), metadata_json(eps));
    }
    for (gguf, hf) in [
        ("expert_count", "n_routed_experts"),
        (
            "expert_shared_feed_forward_length",
            "moe_shared_expert_intermediate_size",
        ),
        ("expert_shared_count", "n_shared_experts"),
        ("expert_weights_scale", "routed_scaling_factor"),
        ("expert_weights_norm", "norm_topk_prob"),
        ("expert_group_count", "n_group"),
        ("expert_group_used_count", "topk_group"),
        ("moe_latent_size", "moe_latent_size"),
    ] {
        if let Some(v) = key(gguf) {
            config.insert(hf.into(), metadata_json(v));
        }
    }
    let size = |k: &str| key(k).and_then(MetaValue::as_u64);
    if let Some(heads) = size("ssm.time_step_rank") {
        config.insert("mamba_num_heads".into(), json!(heads));
        if let Some(inner) = size("ssm.inner_size").filter(|_| heads > 0) {
            config.insert("mamba_head_dim".into(), json!(inner / heads));
        }
    }
    for (gguf, hf) in [
        ("ssm.state_size", "ssm_state_size"),
        ("ssm.group_count", "n_groups"),
        ("ssm.conv_kernel", "conv_kernel"),
    ] {
        if let Some(v) = size(gguf) {
            config.insert(hf.into(), json!(v));
        }
    }
}

/// Granite 4 hybrid's layers as its config spells them: Mamba-2 layers are those with no
/// key/value heads, sized by the `ssm.*` keys; the μP multipliers from Granite's scale keys;
/// rope only where `rope.scaling.finetuned` says the model uses it.
fn granite_hybrid_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    tensors: &[GgufTensorInfo],
) {
    let layers = key("block_count").and_then(MetaValue::as_u64).unwrap_or(0) as usize;
    if let Some(kv) = per_layer(key("attention.head_count_kv"), layers) {
        let kinds: Vec<&str> = kv
            .iter()
            .map(|&n| if n == 0 { "mamba" } else { "attention" })
            .collect();
        config.insert("layer_types".into(), json!(kinds));
        if let Some(&n) = kv.iter().find(|&&n| n > 0) {
            config.insert("num_key_value_heads".into(), json!(n));
        }
    }
    for (gguf, hf) in [
        ("attention.scale", "attention_multiplier"),
        ("embedding_scale", "embedding_multiplier"),
        ("residual_scale", "residual_multiplier"),
        ("logit_scale", "logits_scaling"),
        ("expert_count", "num_local_experts"),
        (
            "expert_shared_feed_forward_length",
            "shared_intermediate_size",
        ),
        ("ssm.state_size", "mamba_d_state"),
        ("ssm.group_count", "mamba_n_groups"),
        ("ssm.conv_kernel", "mamba_d_conv"),
        ("ssm.time_step_rank", "mamba_n_heads"),
    ] {
        if let Some(v) = key(gguf) {
            config.insert(hf.into(), metadata_json(v));
        }
    }
    let size = |k: &str| key(k).and_then(MetaValue::as_u64);
    if let (Some(inner), Some(heads)) = (size("ssm.inner_size"), size("ssm.time_step_rank"))
        && heads > 0
    {
        config.insert("mamba_d_head".into(), json!(inner / heads));
        if let Some(hidden) = size("embedding_length").filter(|&h| h > 0) {
            config.insert("mamba_expand".into(), json!(inner / hidden));
        }
    }
    let rope = key("rope.scaling.finetuned")
        .and_then(MetaValue::as_bool)
        .unwrap_or(true);
    config.insert(
        "position_embedding_type".into(),
        json!(if rope { "rope" } else { "nope" }),
    );
    let conv_bias = tensors.iter().any(|t| t.name.ends_with(".ssm_conv1d.bias"));
    config.insert("mamba_conv_bias".into(), json!(conv_bias));
}

/// The vocabulary of GLM-4.7-Flash, which llama.cpp (with 47 or 48 layers) takes as the sign
/// of a deepseek2 file that scores experts by sigmoid without saying so.
const GLM4_7_LITE_VOCAB: u64 = 154_880;

/// DeepSeek-V3 (and GLM-4-MoE-Lite, filed as the same architecture) as its config spells it.
/// llama.cpp writes latent attention as one key/value head (`key_length` = latent + rope,
/// `value_length` = latent); the per-head widths are in `key_length_mla` / `value_length_mla`;
/// queries are projected directly where the file has no `attention.q_lora_rank` (llama.cpp
/// tells those models apart by their layer count); the rope turns adjacent pairs; routing with
/// the file's groups, scale and (when `expert_weights_norm`) renormalization, every layer
/// sparse unless `leading_dense_block_count` says otherwise, experts scored as
/// `expert_gating_func` says or, without it, as llama.cpp guesses: sigmoid for GLM-4.7-Flash's
/// shape, softmax (DeepSeek-V2's routing) for any other.
fn deepseek2_attention<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) {
    let size = |k: &str| key(k).and_then(MetaValue::as_u64);
    let rope = size("rope.dimension_count");
    if let Some(rope) = rope {
        config.insert("qk_rope_head_dim".into(), json!(rope));
        config.insert("head_dim".into(), json!(rope));
        if let Some(key_width) = size("attention.key_length_mla") {
            config.insert(
                "qk_nope_head_dim".into(),
                json!(key_width.saturating_sub(rope)),
            );
        }
    }
    if let Some(heads) = key("attention.head_count") {
        config.insert("num_key_value_heads".into(), metadata_json(heads));
    }
    for (gguf, hf) in [
        ("attention.value_length_mla", "v_head_dim"),
        ("attention.q_lora_rank", "q_lora_rank"),
        ("attention.kv_lora_rank", "kv_lora_rank"),
        ("leading_dense_block_count", "first_k_dense_replace"),
        ("expert_count", "n_routed_experts"),
        ("expert_shared_count", "n_shared_experts"),
        ("expert_group_count", "n_group"),
        ("expert_group_used_count", "topk_group"),
        ("expert_weights_scale", "routed_scaling_factor"),
    ] {
        if let Some(v) = key(gguf) {
            config.insert(hf.into(), metadata_json(v));
        }
    }
    config
        .entry("first_k_dense_replace")
        .or_insert_with(|| json!(0));
    let normalize = key("expert_weights_norm")
        .and_then(MetaValue::as_bool)
        .unwrap_or(false);
    config.insert("norm_topk_prob".into(), json!(normalize));
    config.insert("rope_interleave".into(), json!(true));
    // llama.cpp's gating enum: 1 softmax, 2 sigmoid, 3 softmax over the chosen weights; 0 (or
    // no key) means the file does not say.
    let scoring = match key("expert_gating_func").and_then(MetaValue::as_u64) {
        Some(1) => "softmax".to_string(),
        Some(2) => "sigmoid".to_string(),
        Some(3) => "softmax_weight".to_string(),
        Some(other) if other != 0 => format!("gguf gating function {other}"),
        _ => {
            let layers = size("block_count");
            let vocab = config.get("vocab_size").and_then(Value::as_u64);
            let glm4_7_lite = matches!(layers, Some(47 | 48)) && vocab == Some(GLM4_7_LITE_VOCAB);
            if glm4_7_lite {
                "sigmoid".to_string()
            } else {
                // Named so that a reader refusing it says where it came from.
                "softmax (llama.cpp's default for a deepseek2 file without expert_gating_func)"
                    .to_string()
            }
        }
    };
    config.insert("scoring_func".into(), json!(scoring));
}

/// Qwen3.5's layers as its config spells them: every `full_attention_interval`-th layer
/// attends, the others are gated delta nets sized by the `ssm.*` keys; rope turns
/// `rope.dimension_count` of each head's features; the shared expert's width.
fn qwen35_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    full_attention_interval: Option<&MetaValue>,
) {
    let size = |k: &str| key(k).and_then(MetaValue::as_u64);
    let interval = full_attention_interval.and_then(MetaValue::as_u64);
    if let (Some(layers), Some(interval)) = (size("block_count"), interval)
        && interval > 0
    {
        let kinds: Vec<&str> = (0..layers)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        config.insert("layer_types".into(), json!(kinds));
    }
    for (gguf, hf) in [
        ("ssm.conv_kernel", "linear_conv_kernel_dim"),
        ("ssm.state_size", "linear_key_head_dim"),
        ("ssm.group_count", "linear_num_key_heads"),
        ("ssm.time_step_rank", "linear_num_value_heads"),
        (
            "expert_shared_feed_forward_length",
            "shared_expert_intermediate_size",
        ),
    ] {
        if let Some(v) = size(gguf) {
            config.insert(hf.into(), json!(v));
        }
    }
    if let (Some(inner), Some(heads)) = (size("ssm.inner_size"), size("ssm.time_step_rank"))
        && heads > 0
    {
        config.insert("linear_value_head_dim".into(), json!(inner / heads));
    }
    if let (Some(rotated), Some(head_dim)) =
        (size("rope.dimension_count"), size("attention.key_length"))
        && head_dim > 0
    {
        config.insert(
            "partial_rotary_factor".into(),
            json!(rotated as f64 / head_dim as f64),
        );
    }
}

/// llama.cpp's full-attention interval for Qwen3-Next when a file gives none.
const QWEN3NEXT_FULL_ATTENTION_INTERVAL: MetaValue = MetaValue::U32(4);

/// Qwen3-Next as its config spells it: Qwen3.5's layers (every fourth attending unless
/// `full_attention_interval` says otherwise, as llama.cpp assumes), and llama.cpp's fixed
/// feed-forward: every layer sparse (it has no tensors for a dense one) and the top-k weights
/// always renormalized (no key says otherwise).
fn qwen3next_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) {
    let interval = key("full_attention_interval").unwrap_or(&QWEN3NEXT_FULL_ATTENTION_INTERVAL);
    qwen35_layers(config, key, Some(interval));
    config.insert("decoder_sparse_step".into(), json!(1));
    config.insert("mlp_only_layers".into(), json!([]));
    config.insert("norm_topk_prob".into(), json!(true));
}

/// `layer_types` alternating sliding and full layers, sliding first: the pattern llama.cpp
/// hard-codes for Gemma 2 and gpt-oss, whose files do not state it.
fn alternate_sliding_first<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) {
    if let Some(layers) = key("block_count").and_then(MetaValue::as_u64) {
        let kinds: Vec<&str> = (0..layers)
            .map(|i| {
                if i % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        config.insert("layer_types".into(), json!(kinds));
    }
}

/// gpt-oss as its config spells it: llama.cpp alternates sliding and full layers itself
/// (sliding first); the experts' width is `expert_feed_forward_length`; projections carry
/// biases where the file has them.
fn gpt_oss_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
    tensors: &[GgufTensorInfo],
) {
    alternate_sliding_first(config, key);
    if let Some(experts) = key("expert_count") {
        config.insert("num_local_experts".into(), metadata_json(experts));
    }
    if let Some(width) = key("expert_feed_forward_length") {
        config.insert("intermediate_size".into(), metadata_json(width));
    }
    let biased = tensors.iter().any(|t| t.name.ends_with(".attn_q.bias"));
    config.insert("attention_bias".into(), json!(biased));
}

/// llama.cpp's chunk length for Llama 4's chunked-attention layers: fixed, not in the file.
const LLAMA4_ATTENTION_CHUNK: u64 = 8192;

/// Llama 4 as its config spells it. llama.cpp fixes what the file does not say: rope layers
/// attend in chunks of 8,192 unless `attention.sliding_window` is 0, every fourth layer has no
/// rope, temperature tuning has a floor of 8,192 and a scale of 0.1 (the config readers'
/// defaults), and q/k are normalized except in the 128-expert model.
fn llama4_layers<'a>(
    config: &mut Map<String, Value>,
    key: &impl Fn(&str) -> Option<&'a MetaValue>,
) {
    let window = key("attention.sliding_window").and_then(MetaValue::as_u64);
    config.remove("sliding_window");
    if window != Some(0) {
        config.insert("attention_chunk_size".into(), json!(LLAMA4_ATTENTION_CHUNK));
    }
    config.insert("no_rope_layer_interval".into(), json!(4));
    if let Some(width) = key("feed_forward_length") {
        config.insert("intermediate_size_mlp".into(), metadata_json(width));
    }
    if let Some(width) = key("expert_feed_forward_length") {
        config.insert("intermediate_size".into(), metadata_json(width));
    }
    if let Some(step) = key("interleave_moe_layer_step") {
        config.insert("interleave_moe_layer_step".into(), metadata_json(step));
    }
    if let Some(experts) = key("expert_count").and_then(MetaValue::as_u64) {
        config.insert("num_local_experts".into(), json!(experts));
        config.insert("use_qk_norm".into(), json!(experts != 128));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config of a file with these metadata (`arch.` is replaced by the architecture's
    /// name) and no tensors.
    fn config_of(arch: &str, keys: &[(&str, MetaValue)]) -> Value {
        let mut metadata = BTreeMap::new();
        metadata.insert(
            "general.architecture".to_string(),
            MetaValue::String(arch.to_string()),
        );
        for (key, value) in keys {
            metadata.insert(key.replace("arch.", &format!("{arch}.")), value.clone());
        }
        hf_config(&metadata, &[])
    }

    #[test]
    fn an_absurd_layer_count_builds_no_per_layer_lists() {
        // Every family whose translation builds per-layer lists, with a count that would
        // take terabytes: the config keeps the count for the model's reader to refuse.
        let absurd = 1u64 << 40;
        for arch in [
            "gemma2",
            "gemma3",
            "gemma4",
            "gpt-oss",
            "qwen35",
            "qwen3next",
            "lfm2",
            "llama4",
            "deepseek2",
        ] {
            let config = config_of(arch, &[("arch.block_count", MetaValue::U64(absurd))]);
            assert_eq!(config["num_hidden_layers"], absurd, "{arch}");
            assert!(config.get("layer_types").is_none(), "{arch}: {config}");
        }
    }

    #[test]
    fn gemma2_takes_llama_cpps_fixed_choices() {
        let shape = |layers| {
            [
                ("arch.block_count", MetaValue::U32(layers)),
                ("arch.embedding_length", MetaValue::U32(4608)),
                ("arch.attention.head_count", MetaValue::U32(32)),
                ("arch.attention.key_length", MetaValue::U32(128)),
            ]
        };
        let config = config_of("gemma2", &shape(42));
        assert_eq!(config["query_pre_attn_scalar"], json!(128));
        assert_eq!(config["rope_theta"], json!(10_000.0));
        assert_eq!(config["sliding_window"], json!(4096));
        assert_eq!(config["attn_logit_softcapping"], json!(50.0));
        assert_eq!(config["final_logit_softcapping"], json!(30.0));
        let kinds = config["layer_types"].as_array().map(Vec::len);
        assert_eq!(kinds, Some(42));
        assert_eq!(config["layer_types"][0], json!("sliding_attention"));
        assert_eq!(config["layer_types"][1], json!("full_attention"));
        // The 27B model (46 layers) scales queries by hidden / heads.
        let config = config_of("gemma2", &shape(46));
        assert_eq!(config["query_pre_attn_scalar"], json!(144));
    }

    #[test]
    fn deepseek2_scores_experts_as_llama_cpp_guesses_when_the_file_is_silent() {
        let scoring = |layers, vocab, gating: Option<u32>| {
            let mut keys = vec![
                ("arch.block_count", MetaValue::U32(layers)),
                ("arch.vocab_size", MetaValue::U32(vocab)),
            ];
            if let Some(gating) = gating {
                keys.push(("arch.expert_gating_func", MetaValue::U32(gating)));
            }
            config_of("deepseek2", &keys)["scoring_func"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(scoring(47, 154_880, None), "sigmoid");
        assert_eq!(scoring(48, 154_880, None), "sigmoid");
        assert!(scoring(27, 102_400, None).starts_with("softmax ("));
        assert!(scoring(47, 512, None).starts_with("softmax ("));
        assert_eq!(scoring(2, 512, Some(2)), "sigmoid");
        assert_eq!(scoring(2, 512, Some(1)), "softmax");
        let config = config_of("deepseek2", &[("arch.block_count", MetaValue::U32(2))]);
        assert_eq!(config["first_k_dense_replace"], json!(0));
    }
}
