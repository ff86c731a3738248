//! The server's default output limit, `MLXKIT_MAX_OUTPUT_TOKENS`: the most tokens a request
//! that names no limit of its own generates. Without it such a request runs until the model
//! stops or the context is full (the API's length reason then), which for a base model that
//! never emits its stop token and a 32k context is many minutes (issue 48: Codex sends no
//! `max_output_tokens`).
//!
//! What decides a request's limit, first match wins: the request's own (`num_predict`,
//! `max_tokens`, `max_completion_tokens`, `max_output_tokens`; `-1` asks for no limit), the
//! model's Modelfile (`PARAMETER num_predict`), this default, the context's end. A limit past
//! what the context has left stops at the context's end, never a refusal.

use serde_json::{Map, Value};

/// The variable naming the default, read once when `serve` starts.
pub const VARIABLE: &str = "MLXKIT_MAX_OUTPUT_TOKENS";

/// `MLXKIT_MAX_OUTPUT_TOKENS` holding something other than a token count.
#[derive(Debug, thiserror::Error)]
#[error(
    "{VARIABLE}=`{0}` is not a positive whole number of tokens (unset it for no default limit)"
)]
pub struct InvalidOutputLimit(String);

/// The default limit `MLXKIT_MAX_OUTPUT_TOKENS` sets, `None` when it is unset or empty.
pub fn from_env() -> Result<Option<usize>, InvalidOutputLimit> {
    parse(std::env::var(VARIABLE).ok().as_deref())
}

/// The limit `value` (the variable's text, if set) names.
fn parse(value: Option<&str>) -> Result<Option<usize>, InvalidOutputLimit> {
    let Some(text) = value.map(str::trim).filter(|text| !text.is_empty()) else {
        return Ok(None);
    };
    match text.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(InvalidOutputLimit(text.to_string())),
    }
}

/// Adds `limit` to a model's stored parameters as their `num_predict` when they name none, so
/// that it applies below the Modelfile's and the request's own limits on every API.
pub fn apply_default(defaults: &mut Map<String, Value>, limit: Option<usize>) {
    if let Some(limit) = limit {
        defaults
            .entry("num_predict")
            .or_insert_with(|| Value::from(limit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::options::GenerationOptions;
    use serde_json::json;

    #[test]
    fn reads_a_positive_count_or_nothing() {
        assert_eq!(parse(None).unwrap(), None);
        assert_eq!(parse(Some("")).unwrap(), None);
        assert_eq!(parse(Some(" 4096 ")).unwrap(), Some(4096));
        for bad in ["0", "-1", "many", "1.5", "4k"] {
            let message = parse(Some(bad)).unwrap_err().to_string();
            assert!(
                message.contains(VARIABLE) && message.contains(bad),
                "{message}"
            );
        }
    }

    /// The request's limit beats the Modelfile's, which beats the server's; `-1` in either
    /// asks for no limit at all.
    #[test]
    fn the_default_comes_after_the_modelfile_and_the_request() {
        let limit = |stored: Value, request: Option<Value>| {
            let mut defaults = stored.as_object().cloned().unwrap_or_default();
            apply_default(&mut defaults, Some(100));
            GenerationOptions::layered(&defaults, &[("max_tokens", request.as_ref())])
                .unwrap()
                .num_predict
        };
        assert_eq!(limit(json!({}), None), Some(100));
        assert_eq!(limit(json!({"num_predict": 7}), None), Some(7));
        assert_eq!(limit(json!({"num_predict": -1}), None), None);
        assert_eq!(limit(json!({"num_predict": 7}), Some(json!(3))), Some(3));
        assert_eq!(limit(json!({}), Some(json!(500))), Some(500));
        assert_eq!(limit(json!({}), Some(json!(-1))), None);
        let mut untouched = Map::new();
        apply_default(&mut untouched, None);
        assert!(untouched.is_empty());
    }
}
