//! Model families: which chat format a vocabulary speaks, recognised by its marker tokens.
//!
//! A family supplies what a checkpoint may not ship: a fallback chat template
//! (`template_fallback.rs`) and the output parser configuration for its thinking and tool-call
//! syntax.

use crate::parser::{ParserConfig, ThinkingTags, ToolCallFormat};
use crate::vocab::Tokenizer;

/// A chat format family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `<|im_start|>role … <|im_end|>` (SmolLM2, Qwen2.5); Hermes `<tool_call>` tools.
    ChatMl,
    /// ChatML with `<think>` reasoning and Hermes `<tool_call>` tools (Qwen3).
    Qwen3,
    /// `<|start_header_id|>role<|end_header_id|>` (Llama 3.x); JSON tool calls.
    Llama3,
    /// `<start_of_turn>user` / `<start_of_turn>model` (Gemma 2 and 3).
    Gemma,
    /// `[INST] … [/INST]` (Mistral); `[TOOL_CALLS]` tool calls.
    Mistral,
}

impl Family {
    /// The family whose marker tokens the vocabulary has, if any.
    pub fn detect(tokenizer: &Tokenizer) -> Option<Family> {
        let has = |t: &str| tokenizer.token_to_id(t).is_some();
        if has("<start_of_turn>") {
            Some(Family::Gemma)
        } else if has("<|start_header_id|>") {
            Some(Family::Llama3)
        } else if has("<|im_start|>") && has("<think>") && has("</think>") {
            Some(Family::Qwen3)
        } else if has("<|im_start|>") {
            Some(Family::ChatMl)
        } else if has("[INST]") {
            Some(Family::Mistral)
        } else {
            None
        }
    }

    /// How this family's output is split into thinking, content and tool calls.
    pub fn parser_config(self) -> ParserConfig {
        let think = ThinkingTags {
            open: "<think>".into(),
            close: "</think>".into(),
        };
        match self {
            Family::ChatMl => ParserConfig {
                tool_calls: ToolCallFormat::Hermes,
                ..Default::default()
            },
            Family::Qwen3 => ParserConfig {
                thinking: Some(think),
                tool_calls: ToolCallFormat::Hermes,
                ..Default::default()
            },
            Family::Llama3 => ParserConfig {
                tool_calls: ToolCallFormat::Llama3Json,
                ..Default::default()
            },
            Family::Gemma => ParserConfig::default(),
            Family::Mistral => ParserConfig {
                tool_calls: ToolCallFormat::Mistral,
                ..Default::default()
            },
        }
    }
}
