//! Serving a model past the context it was trained for: the rotary embedding stretched by
//! YaRN (Peng et al., 2023), written into the config before the model is built.
//!
//! Positions past the trained context are ones the model never saw; rotated as usual, a small
//! model's attention falls apart there (SmolLM2-135M, trained to 8,192, wrote `#` lines until
//! cut off at a 12,100-token prompt). YaRN interpolates the low frequencies by the extension's
//! factor, keeps the high ones, and sharpens attention by `0.1 ln(factor) + 1`, so every
//! position seen lies within the range trained on; the same model answered that prompt in one
//! sentence and stopped. It is what transformers and llama.cpp run for a YaRN config, and the
//! model's own scaling (Llama 3's, a YaRN it ships) is left as it is.

use serde_json::{Map, Value, json};

/// What [`extend_context`] did to a config.
#[derive(Debug, Clone, PartialEq)]
pub enum Extension {
    /// The context asked for is within the trained one: nothing changed.
    Within,
    /// The rotary embedding is stretched by YaRN with this factor.
    Yarn {
        /// The context asked for over the trained one.
        factor: f64,
    },
    /// The model scales its rotary embedding itself, or has none to scale: left as it is.
    Unchanged,
}

/// Stretches the rotary embedding of `config` (transformers' names, as [`crate::load`] reads
/// them) from its `trained` context to `tokens`.
pub fn extend_context(config: &mut Value, trained: usize, tokens: usize) -> Extension {
    if tokens <= trained || trained == 0 {
        return Extension::Within;
    }
    let factor = tokens as f64 / trained as f64;
    let yarn = json!({
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": trained,
    });
    let Some(fields) = config.as_object_mut() else {
        return Extension::Unchanged;
    };
    // transformers 5: `rope_parameters` holds the base and the type. A per-layer-type table
    // (two kinds of layers, two embeddings) is the model's own design: left alone.
    if let Some(Value::Object(parameters)) = fields.get_mut("rope_parameters") {
        if !is_plain(parameters) || parameters.contains_key("full_attention") {
            return Extension::Unchanged;
        }
        merge(parameters, &yarn);
        return Extension::Yarn { factor };
    }
    if !fields.contains_key("rope_theta") {
        return Extension::Unchanged;
    }
    match fields.get("rope_scaling") {
        None | Some(Value::Null) => {}
        Some(Value::Object(scaling)) if is_plain(scaling) => {}
        Some(_) => return Extension::Unchanged,
    }
    fields.insert("rope_scaling".into(), yarn);
    Extension::Yarn { factor }
}

/// Whether a rope table scales nothing (no type, or `default`).
fn is_plain(table: &Map<String, Value>) -> bool {
    let kind = table.get("rope_type").or_else(|| table.get("type"));
    matches!(kind, None | Some(Value::Null)) || kind.and_then(Value::as_str) == Some("default")
}

fn merge(into: &mut Map<String, Value>, from: &Value) {
    if let Some(from) = from.as_object() {
        into.remove("type");
        for (key, value) in from {
            into.insert(key.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_rope_is_stretched_by_yarn() {
        let mut config = json!({"rope_theta": 100000.0, "max_position_embeddings": 8192});
        assert_eq!(
            extend_context(&mut config, 8192, 16384),
            Extension::Yarn { factor: 2.0 }
        );
        assert_eq!(
            config["rope_scaling"],
            json!({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192})
        );
    }

    #[test]
    fn transformers_5_parameters_are_stretched_in_place() {
        let mut config = json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}});
        assert_eq!(
            extend_context(&mut config, 4096, 16384),
            Extension::Yarn { factor: 4.0 }
        );
        assert_eq!(config["rope_parameters"]["rope_type"], "yarn");
        assert_eq!(config["rope_parameters"]["rope_theta"], 1e6);
        assert_eq!(config["rope_parameters"]["factor"], 4.0);
    }

    #[test]
    fn a_models_own_scaling_and_short_contexts_are_left_alone() {
        let llama3 = json!({"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}});
        let mut config = llama3.clone();
        assert_eq!(
            extend_context(&mut config, 131072, 262144),
            Extension::Unchanged
        );
        assert_eq!(config, llama3);
        let mut config = json!({"rope_theta": 1e4});
        assert_eq!(extend_context(&mut config, 8192, 4096), Extension::Within);
        assert_eq!(config, json!({"rope_theta": 1e4}));
        let mut config = json!({"rope_parameters": {"full_attention": {"rope_theta": 1e6}}});
        assert_eq!(
            extend_context(&mut config, 8192, 32768),
            Extension::Unchanged
        );
    }
}
