//! Special tokens and the chat template from a Hugging Face checkpoint's JSON side files.
//!
//! `tokenizer_config.json`, `special_tokens_map.json` and `generation_config.json` each may name
//! BOS/EOS (as a string, an `{"content": …}` object, an id, or a list of ids); all of them are
//! merged into one [`SpecialTokens`]. The chat template comes from `tokenizer_config.json`
//! (a string, or a list of named templates where `default` wins) or a `chat_template.jinja`.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::special_tokens::SpecialTokens;

/// The optional JSON files beside a `tokenizer.json`, as raw bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct HfSideFiles<'a> {
    /// `tokenizer_config.json`.
    pub tokenizer_config: Option<&'a [u8]>,
    /// `special_tokens_map.json`.
    pub special_tokens_map: Option<&'a [u8]>,
    /// `generation_config.json`.
    pub generation_config: Option<&'a [u8]>,
    /// A standalone `chat_template.jinja`, which newer checkpoints ship instead of the config key.
    pub chat_template: Option<&'a str>,
}

pub(crate) struct HfConfig {
    pub(crate) specials: SpecialTokens,
    pub(crate) chat_template: Option<String>,
}

fn parse(bytes: Option<&[u8]>, what: &str) -> Result<Value> {
    match bytes {
        None => Ok(Value::Null),
        Some(bytes) => serde_json::from_slice(bytes).map_err(|err| Error::Json {
            what: what.to_string(),
            reason: err.to_string(),
        }),
    }
}

/// Reads specials and template; `token_id` resolves a token's text in the loaded vocabulary.
pub(crate) fn read_hf_config(
    files: &HfSideFiles<'_>,
    token_id: impl Fn(&str) -> Option<u32>,
    is_special: impl Fn(&str) -> Option<u32>,
) -> Result<HfConfig> {
    let config = parse(files.tokenizer_config, "tokenizer_config.json")?;
    let map = parse(files.special_tokens_map, "special_tokens_map.json")?;
    let generation = parse(files.generation_config, "generation_config.json")?;

    let mut specials = SpecialTokens::default();
    // Ids from generation_config are what the model was trained to emit; they come first.
    specials.bos_if_unset(
        ids(&generation["bos_token_id"], "generation_config.json")?
            .first()
            .copied(),
    );
    for id in ids(&generation["eos_token_id"], "generation_config.json")? {
        specials.add_eos(id);
    }
    for source in [&config, &map] {
        specials.bos_if_unset(
            token_texts(&source["bos_token"])
                .iter()
                .find_map(|t| token_id(t)),
        );
        for text in token_texts(&source["eos_token"]) {
            if let Some(id) = token_id(&text) {
                specials.add_eos(id);
            }
        }
        if specials.pad.is_none() {
            specials.pad = token_texts(&source["pad_token"])
                .iter()
                .find_map(|t| token_id(t));
        }
        if specials.unk.is_none() {
            specials.unk = token_texts(&source["unk_token"])
                .iter()
                .find_map(|t| token_id(t));
        }
    }
    if specials.pad.is_none() {
        specials.pad = ids(&generation["pad_token_id"], "generation_config.json")?
            .first()
            .copied();
    }
    specials.add_known_end_of_turn(is_special);
    specials.add_bos = config["add_bos_token"].as_bool().unwrap_or(false);
    specials.add_eos = config["add_eos_token"].as_bool().unwrap_or(false);

    let chat_template = match files.chat_template {
        Some(template) => Some(template.to_string()),
        None => template_from_config(&config["chat_template"])?,
    };
    Ok(HfConfig {
        specials,
        chat_template,
    })
}

/// Ids given as a number or a list of numbers; anything else is an error naming the file.
fn ids(value: &Value, file: &str) -> Result<Vec<u32>> {
    let one = |v: &Value| {
        v.as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| Error::Json {
                what: file.to_string(),
                reason: format!("token id {v} is not a 32-bit unsigned integer"),
            })
    };
    match value {
        Value::Null => Ok(Vec::new()),
        Value::Array(items) => items.iter().map(one).collect(),
        single => Ok(vec![one(single)?]),
    }
}

/// Token texts given as a string, an AddedToken object, or a list of either.
fn token_texts(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Object(obj) => obj
            .get("content")
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect(),
        Value::Array(items) => items.iter().flat_map(token_texts).collect(),
        _ => Vec::new(),
    }
}

fn template_from_config(value: &Value) -> Result<Option<String>> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(named) => {
            let template_of = |entry: &Value| entry["template"].as_str().map(str::to_string);
            let default = named
                .iter()
                .find(|e| e["name"] == "default")
                .and_then(template_of);
            Ok(default.or_else(|| named.first().and_then(template_of)))
        }
        other => Err(Error::Json {
            what: "tokenizer_config.json".into(),
            reason: format!("chat_template is neither a string nor a list: {other}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(text: &str) -> Option<u32> {
        ["<s>", "</s>", "<|im_end|>", "<pad>", "<|eot_id|>"]
            .iter()
            .position(|t| *t == text)
            .map(|i| i as u32)
    }

    #[test]
    fn eos_from_every_source_is_merged() {
        let config = br#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#;
        let map = br#"{"eos_token": ["<|im_end|>"], "pad_token": "<pad>"}"#;
        let generation = br#"{"eos_token_id": [1, 4], "bos_token_id": 0}"#;
        let files = HfSideFiles {
            tokenizer_config: Some(config),
            special_tokens_map: Some(map),
            generation_config: Some(generation),
            chat_template: None,
        };
        let cfg = read_hf_config(&files, lookup, |_| None).unwrap();
        assert_eq!(cfg.specials.bos, Some(0));
        assert_eq!(
            cfg.specials.eos.iter().copied().collect::<Vec<_>>(),
            [1, 2, 4]
        );
        assert_eq!(cfg.specials.pad, Some(3));
        assert!(cfg.specials.add_bos);
        assert_eq!(cfg.chat_template.as_deref(), Some("D"));
    }

    #[test]
    fn malformed_files_are_named() {
        let files = HfSideFiles {
            generation_config: Some(b"{\"eos_token_id\": -3}"),
            ..Default::default()
        };
        let err = read_hf_config(&files, lookup, |_| None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("generation_config.json"), "{err}");
        let files = HfSideFiles {
            tokenizer_config: Some(b"{not json"),
            ..Default::default()
        };
        let err = read_hf_config(&files, lookup, |_| None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("tokenizer_config.json"), "{err}");
    }
}
