//! Prompt text to tokens, held to the context: a text that cannot fit however it tokenizes is
//! refused before the tokenizer runs. Every path that tokenizes a prompt (chat and generate,
//! images' expanded text, embeddings, `/tokenize`) goes through here.

use crate::engine::ModelInfo;
use crate::server::request_error::RequestError;

/// Tokenizes prompt text, refusing first a text too long for the context whatever its tokens.
pub fn encode(info: &ModelInfo, text: &str, add_special: bool) -> Result<Vec<u32>, RequestError> {
    check_bytes(info, text.len())?;
    info.tokenizer
        .encode(text, add_special)
        .map_err(|e| RequestError::invalid(format!("tokenizing the prompt: {e}")))
}

/// Refuses `bytes` of prompt text that cannot fit the context however it tokenizes: no token
/// covers more than the vocabulary's longest, so this is exact, not a guess, and it spares
/// tokenizing megabytes (a 50 MB prompt took 31 s to tokenize only to be refused).
pub fn check_bytes(info: &ModelInfo, bytes: usize) -> Result<(), RequestError> {
    let most = info.context_length.saturating_mul(info.longest_token_bytes);
    if bytes > most {
        return Err(RequestError::refused(format!(
            "the prompt is {bytes} bytes, more than the context of {} tokens can hold \
             (at most {most} bytes with this vocabulary)",
            info.context_length
        )));
    }
    Ok(())
}
