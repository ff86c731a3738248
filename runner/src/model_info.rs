//! `show`'s `model_info` in Ollama's shape: GGUF metadata keys (`general.architecture`,
//! `general.parameter_count`, `<arch>.context_length`, `<arch>.embedding_length`, …).
//!
//! Clients read these keys by name: litellm (and so aider) takes a model's context size from
//! the first `model_info` key containing `context_length`, and reads nothing else there. A
//! GGUF checkpoint's own metadata is copied as Ollama copies it (without `general.name` and
//! `tokenizer.chat_template`, and with the vocabulary-sized arrays left empty, as Ollama's
//! non-verbose `show` leaves them); a transformers checkpoint's `config.json` is mapped to the
//! keys llama.cpp's converter would have written. Recorded at import, so `show` never opens
//! weights.

use std::collections::BTreeMap;

use quant::MetaValue;
use serde_json::{Value, json};

/// Longer GGUF arrays (the vocabulary, its scores and merges) are shown empty, as Ollama's
/// non-verbose `show` shows them; per-layer lists (a few hundred entries at most) are kept.
const LONGEST_SHOWN_ARRAY: usize = 1024;

/// The `model_info` of a GGUF file: its metadata, and the parameter count when the file does
/// not state one.
pub fn of_gguf(metadata: &BTreeMap<String, MetaValue>, parameters: u64) -> BTreeMap<String, Value> {
    let mut info: BTreeMap<String, Value> = metadata
        .iter()
        .filter(|(key, _)| !matches!(key.as_str(), "general.name" | "tokenizer.chat_template"))
        .map(|(key, value)| (key.clone(), to_json(value)))
        .collect();
    info.entry("general.parameter_count".into())
        .or_insert_with(|| json!(parameters));
    info
}

/// The `model_info` of a transformers checkpoint with this `config.json` (for a multimodal
/// one, its `text_config`), `parameters` weights (when known) and the context length mlxkit
/// reads from it.
pub fn of_config(
    config: &Value,
    parameters: Option<u64>,
    context_length: usize,
) -> BTreeMap<String, Value> {
    let text = config
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(config);
    let model_type = text
        .get("model_type")
        .or_else(|| config.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let arch = gguf_architecture(model_type);
    let mut info = BTreeMap::new();
    info.insert("general.architecture".to_string(), json!(arch));
    if let Some(parameters) = parameters {
        info.insert("general.parameter_count".to_string(), json!(parameters));
    }
    info.insert(format!("{arch}.context_length"), json!(context_length));
    // (GGUF key, config.json key), as llama.cpp's converter maps them.
    const KEYS: &[(&str, &str)] = &[
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("attention.key_length", "head_dim"),
        ("attention.value_length", "head_dim"),
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("attention.sliding_window", "sliding_window"),
        ("rope.freq_base", "rope_theta"),
        ("expert_count", "num_experts"),
        ("expert_count", "num_local_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("vocab_size", "vocab_size"),
    ];
    for (gguf, hf) in KEYS {
        if let Some(value) = text.get(*hf).filter(|v| v.is_number()) {
            info.insert(format!("{arch}.{gguf}"), value.clone());
        }
    }
    // A config without `num_key_value_heads` has as many as query heads.
    if let Some(heads) = info.get(&format!("{arch}.attention.head_count")).cloned() {
        info.entry(format!("{arch}.attention.head_count_kv"))
            .or_insert(heads);
    }
    for (gguf, hf) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = config
            .get(hf)
            .or_else(|| text.get(hf))
            .filter(|v| v.is_u64())
        {
            info.insert(gguf.to_string(), id.clone());
        }
    }
    info
}

/// The name llama.cpp (and so Ollama) gives the architecture transformers calls `model_type`;
/// the inverse of `quant`'s GGUF-to-transformers table, and the name itself where both agree.
pub fn gguf_architecture(model_type: &str) -> &str {
    match model_type {
        "gemma3_text" | "gemma3" => "gemma3",
        "gemma4_text" | "gemma4" => "gemma4",
        "qwen3_moe" => "qwen3moe",
        "qwen3_5_text" | "qwen3_5" => "qwen35",
        "qwen3_5_moe_text" | "qwen3_5_moe" => "qwen35moe",
        "qwen3_next" => "qwen3next",
        "qwen2_5_vl" => "qwen25vl",
        "granitemoehybrid" => "granitehybrid",
        "deepseek_v3" => "deepseek2",
        "gpt_oss" => "gpt-oss",
        "llama4_text" | "llama4" => "llama4",
        other => other,
    }
}

/// `value` as Ollama shows it: arrays past [`LONGEST_SHOWN_ARRAY`] items empty.
fn to_json(value: &MetaValue) -> Value {
    match value {
        MetaValue::Array(items) if items.len() > LONGEST_SHOWN_ARRAY => json!([]),
        MetaValue::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        scalar => quant::metadata_json(scalar),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gguf_file_shows_its_metadata_without_name_template_or_vocabulary() {
        let metadata = BTreeMap::from([
            (
                "general.architecture".to_string(),
                MetaValue::String("llama".into()),
            ),
            (
                "general.name".to_string(),
                MetaValue::String("SmolLM2".into()),
            ),
            ("llama.context_length".to_string(), MetaValue::U32(8192)),
            (
                "llama.attention.layer_norm_rms_epsilon".to_string(),
                MetaValue::F32(1e-5),
            ),
            (
                "tokenizer.chat_template".to_string(),
                MetaValue::String("{{ x }}".into()),
            ),
            (
                "tokenizer.ggml.tokens".to_string(),
                MetaValue::Array(vec![MetaValue::String("a".into()); 2000]),
            ),
            (
                "gemma3.attention.sliding_window_pattern".to_string(),
                MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
            ),
        ]);
        let info = of_gguf(&metadata, 134_515_008);
        assert_eq!(
            Value::Object(info.into_iter().collect()),
            json!({
                "general.architecture": "llama",
                "general.parameter_count": 134_515_008u64,
                "llama.context_length": 8192,
                "llama.attention.layer_norm_rms_epsilon": 1e-5,
                "tokenizer.ggml.tokens": [],
                "gemma3.attention.sliding_window_pattern": [true, false],
            })
        );
    }

    #[test]
    fn a_transformers_config_maps_to_llama_cpp_keys() {
        let config = json!({
            "model_type": "qwen3_moe",
            "hidden_size": 2048,
            "num_hidden_layers": 48,
            "intermediate_size": 6144,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 40960,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "vocab_size": 151_936,
            "eos_token_id": 151_645,
            "torch_dtype": "bfloat16",
        });
        let info = of_config(&config, Some(30_532_122_624), 40960);
        assert_eq!(
            Value::Object(info.into_iter().collect()),
            json!({
                "general.architecture": "qwen3moe",
                "general.parameter_count": 30_532_122_624u64,
                "qwen3moe.context_length": 40960,
                "qwen3moe.embedding_length": 2048,
                "qwen3moe.block_count": 48,
                "qwen3moe.feed_forward_length": 6144,
                "qwen3moe.attention.head_count": 32,
                "qwen3moe.attention.head_count_kv": 4,
                "qwen3moe.attention.key_length": 128,
                "qwen3moe.attention.value_length": 128,
                "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6,
                "qwen3moe.rope.freq_base": 1_000_000.0,
                "qwen3moe.expert_count": 128,
                "qwen3moe.expert_used_count": 8,
                "qwen3moe.vocab_size": 151_936,
                "tokenizer.ggml.eos_token_id": 151_645,
            })
        );
    }

    #[test]
    fn a_multimodal_config_describes_its_text_model() {
        let config = json!({
            "model_type": "gemma3",
            "text_config": { "model_type": "gemma3_text", "hidden_size": 2560,
                             "num_attention_heads": 8 },
            "vision_config": { "hidden_size": 1152 },
        });
        let info = of_config(&config, Some(4_300_079_472), 131_072);
        assert_eq!(info["general.architecture"], "gemma3");
        assert_eq!(info["gemma3.context_length"], 131_072);
        assert_eq!(info["gemma3.embedding_length"], 2560);
        assert_eq!(info["gemma3.attention.head_count_kv"], 8);
    }
}
