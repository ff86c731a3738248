//! The request builder's path for embeddings: a request's inputs read (text or token ids),
//! tokenized off the async runtime, held to the model's context (cut or refused, as the API
//! asks), evaluated on the worker and scaled to unit length. Like [`crate::server::request`]
//! for generations, it fails with a [`RequestError`], which each API puts in its wire format
//! at its edge ([`crate::server::embeddings`]).

use serde_json::Value;

use crate::engine::embedding::normalize;
use crate::model_keeper::Lease;
use crate::server::request_error::RequestError;
use crate::server::{prompt, prompt_tokens};

/// The most inputs one request may embed.
pub const MAX_INPUTS: usize = 2048;

/// What becomes of an input longer than the model's context.
#[derive(Debug, Clone, Copy)]
pub enum Overlong {
    /// Its first tokens are embedded (Ollama's `truncate`, on unless a request turns it off).
    Truncate,
    /// It is refused, the message ending with `hint`: how to get it embedded.
    Refuse {
        /// What the client can do instead.
        hint: &'static str,
    },
}

impl Overlong {
    /// Ollama's `truncate` option: cut unless it is `false`.
    pub fn ollama(truncate: Option<bool>) -> Overlong {
        match truncate {
            Some(false) => Overlong::Refuse {
                hint: "set `truncate` to cut it",
            },
            _ => Overlong::Truncate,
        }
    }

    /// OpenAI's embeddings have no truncation option and refuse an input past the context.
    pub const OPENAI: Overlong = Overlong::Refuse {
        hint: "shorten or split it (OpenAI's embeddings API does not truncate)",
    };
}

/// An input: text, or (OpenAI) token ids.
pub enum Input {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn inputs(value: &Value) -> Result<Vec<Input>, RequestError> {
    let one = |v: &Value| -> Result<Input, RequestError> {
        match v {
            Value::String(s) => Ok(Input::Text(s.clone())),
            Value::Array(ids) => ids
                .iter()
                .map(|id| {
                    id.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| RequestError::invalid("token ids must be integers"))
                })
                .collect::<Result<_, _>>()
                .map(Input::Tokens),
            other => Err(RequestError::invalid(format!(
                "an input must be a string or a list of token ids, got {other}"
            ))),
        }
    };
    let list = match value {
        Value::String(_) => vec![one(value)?],
        // A list of numbers is one tokenized input; a list of lists or strings is several.
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![one(value)?]
        }
        Value::Array(items) => items.iter().map(one).collect::<Result<_, _>>()?,
        other => {
            return Err(RequestError::invalid(format!(
                "`input` must be a string or a list, got {other}"
            )));
        }
    };
    if list.is_empty() {
        return Err(RequestError::invalid("`input` is empty"));
    }
    if list.len() > MAX_INPUTS {
        return Err(RequestError::invalid(format!(
            "{} inputs; at most {MAX_INPUTS} per request",
            list.len()
        )));
    }
    Ok(list)
}

/// Embeds `inputs` with the leased model: tokenized off the runtime, each longer than the
/// context cut to it or refused (`overlong`), then evaluated on the worker. Returns the raw
/// vectors and the tokens evaluated.
pub async fn embed(
    lease: &Lease,
    inputs: Vec<Input>,
    overlong: Overlong,
) -> Result<(Vec<Vec<f32>>, usize), RequestError> {
    let info = lease.info.clone();
    let tokenized = prompt::off_runtime(move || {
        let vocab = info.tokenizer.vocab_size();
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let mut tokens = match input {
                    Input::Text(text) if text.is_empty() => {
                        return Err(RequestError::invalid(format!("input {i} is empty")));
                    }
                    Input::Text(text) => prompt_tokens::encode(&info, &text, true)?,
                    Input::Tokens(ids) => ids,
                };
                if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                    return Err(RequestError::invalid(format!(
                        "input {i}: token {bad} is outside the vocabulary of {vocab}"
                    )));
                }
                if tokens.len() > info.context_length {
                    if let Overlong::Refuse { hint } = overlong {
                        return Err(RequestError::invalid(format!(
                            "input {i} is {} tokens, more than the model's context of {}; {hint}",
                            tokens.len(),
                            info.context_length
                        )));
                    }
                    tokens.truncate(info.context_length);
                }
                if tokens.is_empty() {
                    return Err(RequestError::invalid(format!("input {i} has no tokens")));
                }
                Ok(tokens)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let evaluated = tokenized.iter().map(Vec::len).sum();
    let vectors = lease
        .engine
        .embed(lease.slot, tokenized)
        .await
        .map_err(|e| RequestError::internal(e.to_string()))?;
    Ok((vectors, evaluated))
}

/// Unit vectors, cut to `dimensions` first when asked.
pub fn unit_vectors(
    mut vectors: Vec<Vec<f32>>,
    dimensions: Option<usize>,
) -> Result<Vec<Vec<f32>>, RequestError> {
    for vector in &mut vectors {
        if let Some(d) = dimensions {
            if d == 0 || d > vector.len() {
                return Err(RequestError::invalid(format!(
                    "`dimensions` must be between 1 and {}",
                    vector.len()
                )));
            }
            vector.truncate(d);
        }
        normalize(vector);
    }
    Ok(vectors)
}
