//! The default model: what serves a request naming a hosted model (`claude-…`, `gpt-…`) that
//! no stored model is called.
//!
//! Coding agents send their vendor's model names (Claude Code `claude-opus-…`, Codex
//! `gpt-…`) unless each is configured otherwise. `mlxkit serve --default-model NAME` (or
//! `MLXKIT_DEFAULT_MODEL`) serves them with a local model instead, so the agents work with
//! their own defaults. Only names that look hosted fall back: a typo in a local model's name
//! stays a 404, and a stored model with the hosted name (`mlxkit cp gemma3:270m
//! claude-sonnet-4-5`) is served as itself, before the default is considered.

use crate::model_name::ModelName;

/// Name prefixes of the models hosted APIs serve, as their clients send them.
const HOSTED_PREFIXES: &[&str] = &[
    "claude-", "gpt-", "chatgpt-", "codex-", "o1", "o3", "o4", "text-",
];

/// Whether `model` (as a request names it) is a hosted model's name, which a request may
/// send only because its client defaults to it.
pub fn looks_hosted(model: &str) -> bool {
    let model = model.to_ascii_lowercase();
    // `anthropic/claude-…` and `openai/gpt-…`, as routers write them.
    let bare = model.rsplit('/').next().unwrap_or(&model);
    HOSTED_PREFIXES
        .iter()
        .any(|prefix| bare.starts_with(prefix))
}

/// The model a request naming `requested` is served with: `requested` itself when `stored`
/// says the store has it, else `default` when `requested` looks hosted, else `requested` (so
/// that the caller reports it missing).
pub fn resolve(
    requested: ModelName,
    text: &str,
    stored: impl FnOnce(&ModelName) -> bool,
    default: Option<&ModelName>,
) -> ModelName {
    match default {
        Some(default) if !stored(&requested) && looks_hosted(text) => default.clone(),
        _ => requested,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> ModelName {
        ModelName::parse(text).unwrap()
    }

    #[test]
    fn hosted_names_are_recognized() {
        for hosted in [
            "claude-opus-5-5",
            "claude-3-5-haiku-20241022",
            "gpt-5.5",
            "gpt-6.2-sol",
            "GPT-4o",
            "o3-mini",
            "anthropic/claude-sonnet-4-5",
            "openai/gpt-4.1",
            "codex-mini-latest",
        ] {
            assert!(looks_hosted(hosted), "{hosted}");
        }
        for local in [
            "smollm2:135m",
            "gemma3:270m",
            "qwen3",
            "llama3.2:1b",
            "olmo2",
        ] {
            assert!(!looks_hosted(local), "{local}");
        }
    }

    #[test]
    fn a_hosted_name_falls_back_only_when_nothing_is_stored_under_it() {
        let default = name("gemma3:270m");
        let served = |text: &str, stored: bool, default: Option<&ModelName>| {
            resolve(name(text), text, |_| stored, default).to_string()
        };
        assert_eq!(
            served("claude-opus-5-5", false, Some(&default)),
            "gemma3:270m"
        );
        assert_eq!(served("gpt-5.5", false, Some(&default)), "gemma3:270m");
        // A stored model with the hosted name (`mlxkit cp`) is served as itself.
        assert_eq!(
            served("claude-opus-5-5", true, Some(&default)),
            "claude-opus-5-5:latest"
        );
        // A local name that is missing stays missing: the caller's 404 names it.
        assert_eq!(served("smollm3:3b", false, Some(&default)), "smollm3:3b");
        // No default: the request's name, missing or not.
        assert_eq!(served("gpt-5.5", false, None), "gpt-5.5:latest");
    }
}
