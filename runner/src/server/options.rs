//! Request options (Ollama's `options`, OpenAI's top-level fields) checked and turned into
//! what the engine takes.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::engine::speculating::MAX_DRAFT_DEPTH;
use crate::engine::{DrafterKind, Speculation};
use crate::model_name::ModelName;
use crate::server::request_error::RequestError;

/// Generation settings of one request, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationOptions {
    /// Sampling options for the engine.
    pub sampling: sampler::Options,
    /// The most tokens to generate (`None`: until the context is full).
    pub num_predict: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Ollama's `num_ctx`: a lower context limit for this request.
    pub num_ctx: Option<usize>,
    /// Generate through end-of-sequence tokens, so a benchmark measures exactly the length
    /// it asks for. Set by `mlxkit bench --ignore-eos`; no API request can set it.
    pub ignore_eos: bool,
    /// Speculative decoding (`draft`, `num_draft`, `speculate`).
    pub speculation: Speculation,
    /// The draft model `draft` names, when it names one rather than a built-in drafter: the
    /// model is loaded with it beside.
    pub draft_model: Option<ModelName>,
}

fn number(key: &str, value: &Value) -> Result<f64, RequestError> {
    let n = value.as_f64().ok_or_else(|| {
        RequestError::invalid(format!("option `{key}` must be a number, got {value}"))
    })?;
    if !n.is_finite() {
        return Err(RequestError::invalid(format!(
            "option `{key}` must be finite"
        )));
    }
    Ok(n)
}

fn in_range(key: &str, value: &Value, lo: f64, hi: f64) -> Result<f64, RequestError> {
    let n = number(key, value)?;
    if n < lo || n > hi {
        return Err(RequestError::invalid(format!(
            "option `{key}` must be between {lo} and {hi}, got {n}"
        )));
    }
    Ok(n)
}

fn count(key: &str, value: &Value, hi: f64) -> Result<usize, RequestError> {
    let n = in_range(key, value, 0.0, hi)?;
    if n.fract() != 0.0 {
        return Err(RequestError::invalid(format!(
            "option `{key}` must be an integer, got {n}"
        )));
    }
    Ok(n as usize)
}

impl GenerationOptions {
    /// A model's stored defaults, then a request's fields over them: `(option, value)` pairs
    /// under Ollama's option names, absent values skipped. Errors are in Ollama's shape.
    pub fn layered(
        defaults: &Map<String, Value>,
        given: &[(&str, Option<&Value>)],
    ) -> Result<GenerationOptions, RequestError> {
        let mut options = GenerationOptions::default();
        options.apply(defaults)?;
        let given: Map<String, Value> = given
            .iter()
            .filter_map(|(key, value)| value.map(|v| (key.to_string(), v.clone())))
            .collect();
        options.apply(&given)?;
        Ok(options)
    }

    /// Applies Ollama-style options (`temperature`, `top_k`, …, `num_predict`, `stop`,
    /// `seed`) over the current values. Unknown keys are ignored, as Ollama does, except that
    /// a known key with a bad value is an error naming it.
    pub fn apply(&mut self, options: &Map<String, Value>) -> Result<(), RequestError> {
        for (key, value) in options {
            if value.is_null() {
                continue;
            }
            let s = &mut self.sampling;
            match key.as_str() {
                "temperature" => s.temperature = in_range(key, value, 0.0, 100.0)? as f32,
                "top_k" => s.top_k = count(key, value, 1e9)?,
                "top_p" => s.top_p = in_range(key, value, 0.0, 1.0)? as f32,
                "min_p" => s.min_p = in_range(key, value, 0.0, 1.0)? as f32,
                "repeat_penalty" => s.repeat_penalty = in_range(key, value, 0.0, 100.0)? as f32,
                "repeat_last_n" => {
                    // Ollama: -1 means the whole context.
                    s.repeat_last_n = if number(key, value)? == -1.0 {
                        sampler::MAX_REPEAT_LAST_N
                    } else {
                        count(key, value, sampler::MAX_REPEAT_LAST_N as f64)?
                    }
                }
                "presence_penalty" => {
                    s.presence_penalty = in_range(key, value, -100.0, 100.0)? as f32
                }
                "frequency_penalty" => {
                    s.frequency_penalty = in_range(key, value, -100.0, 100.0)? as f32
                }
                "seed" => {
                    let n = number(key, value)?;
                    // Ollama: a negative seed means "random".
                    s.seed = if n < 0.0 {
                        None
                    } else if n.fract() == 0.0 && n <= u64::MAX as f64 {
                        Some(n as u64)
                    } else {
                        return Err(RequestError::invalid(format!(
                            "option `seed` must be an integer, got {n}"
                        )));
                    };
                }
                "num_predict" | "max_tokens" | "max_completion_tokens" => {
                    let n = number(key, value)?;
                    // Ollama: -1 (or -2) means "until the context is full".
                    self.num_predict = if n < 0.0 {
                        if n == -1.0 || n == -2.0 {
                            None
                        } else {
                            return Err(RequestError::invalid(format!(
                                "option `{key}` must be -1 or a non-negative integer, got {n}"
                            )));
                        }
                    } else if n.fract() != 0.0 {
                        return Err(RequestError::invalid(format!(
                            "option `{key}` must be an integer, got {n}"
                        )));
                    } else {
                        // However large, a limit ends at the context's end: it is never
                        // refused for its size (issue 48; Claude Code asks for 32,000).
                        // `as` saturates a number past `usize`.
                        Some(n as usize)
                    };
                }
                "num_ctx" => self.num_ctx = Some(count(key, value, 1e8)?.max(1)),
                "stop" => self.stop = stop_list(value)?,
                "logit_bias" => s.logit_bias = logit_bias(value)?,
                "draft" | "speculate" | "num_draft" => {
                    let (speculation, model) =
                        speculation(key, value, self.speculation, self.draft_model.take())?;
                    self.speculation = speculation;
                    self.draft_model = model;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// `current` (with its draft model, if it drafts with one) changed by one speculation option:
/// `draft` names a built-in drafter, a draft model or `"none"`, `speculate: false` turns
/// speculation off, `num_draft` caps the depth (0: off).
fn speculation(
    key: &str,
    value: &Value,
    current: Speculation,
    model: Option<ModelName>,
) -> Result<(Speculation, Option<ModelName>), RequestError> {
    let depth = match current {
        Speculation::On { max_depth, .. } | Speculation::ServerDefault { max_depth } => max_depth,
        Speculation::Off => None,
    };
    let next = match key {
        "speculate" => match value.as_bool() {
            Some(true) => match current {
                Speculation::Off => Speculation::ServerDefault { max_depth: depth },
                other => other,
            },
            Some(false) => Speculation::Off,
            None => {
                return Err(RequestError::invalid(format!(
                    "option `speculate` must be true or false, got {value}"
                )));
            }
        },
        "num_draft" => match count(key, value, MAX_DRAFT_DEPTH as f64)? {
            0 => Speculation::Off,
            n => match current {
                Speculation::On { drafter, .. } => Speculation::On {
                    drafter,
                    max_depth: Some(n),
                },
                _ => Speculation::ServerDefault { max_depth: Some(n) },
            },
        },
        _ => match value {
            Value::Bool(false) => Speculation::Off,
            Value::String(name) if name == "none" || name == "off" => Speculation::Off,
            Value::String(name) => {
                let drafter = match DrafterKind::parse(name) {
                    Some(drafter) => drafter,
                    // `self:<layers>` with a bad count is a layer-skip typo, not a model.
                    None if name.starts_with("self:") => {
                        return Err(RequestError::invalid(format!(
                            "option `draft`: `{name}` needs a layer count from 1 to {}",
                            crate::engine::job::MAX_SELF_DRAFT_LAYERS
                        )));
                    }
                    None => {
                        let named = ModelName::parse(name).map_err(|_| {
                            RequestError::invalid(format!(
                                "option `draft`: unknown drafter `{name}` (known: ngram, \
                                 self:<layers>, none, or a draft model's name)"
                            ))
                        })?;
                        let next = Speculation::On {
                            drafter: DrafterKind::Model,
                            max_depth: depth,
                        };
                        return Ok((next, Some(named)));
                    }
                };
                Speculation::On {
                    drafter,
                    max_depth: depth,
                }
            }
            _ => {
                return Err(RequestError::invalid(format!(
                    "option `draft` must be a drafter name, got {value}"
                )));
            }
        },
    };
    // A built-in drafter replaces the draft model; a depth or `speculate` keeps it.
    let model = match next {
        Speculation::On { drafter, .. } if drafter != DrafterKind::Model => None,
        _ => model,
    };
    Ok((next, model))
}

/// `stop` as a string or a list of strings.
pub fn stop_list(value: &Value) -> Result<Vec<String>, RequestError> {
    match value {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    RequestError::invalid(format!("`stop` entries must be strings, got {v}"))
                })
            })
            .collect(),
        other => Err(RequestError::invalid(format!(
            "`stop` must be a string or a list, got {other}"
        ))),
    }
}

/// OpenAI's `logit_bias`: token id (as a string key) → bias in [-100, 100].
fn logit_bias(value: &Value) -> Result<BTreeMap<u32, f32>, RequestError> {
    let map = value
        .as_object()
        .ok_or_else(|| RequestError::invalid("`logit_bias` must be an object"))?;
    map.iter()
        .map(|(k, v)| {
            let id: u32 = k.parse().map_err(|_| {
                RequestError::invalid(format!("`logit_bias` key `{k}` is not a token id"))
            })?;
            Ok((id, in_range("logit_bias", v, -100.0, 100.0)? as f32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(v: Value) -> Result<GenerationOptions, crate::server::error::ApiError> {
        let mut o = GenerationOptions::default();
        o.apply(v.as_object().unwrap())?;
        Ok(o)
    }

    #[test]
    fn reads_ollama_options() {
        let o = apply(
            json!({"temperature": 0, "top_k": 5, "seed": 42, "num_predict": 16, "stop": ["\n"]}),
        )
        .unwrap();
        assert_eq!(o.sampling.temperature, 0.0);
        assert_eq!(o.sampling.top_k, 5);
        assert_eq!(o.sampling.seed, Some(42));
        assert_eq!(o.num_predict, Some(16));
        assert_eq!(o.stop, vec!["\n"]);
        assert_eq!(apply(json!({"num_predict": -1})).unwrap().num_predict, None);
        assert_eq!(apply(json!({"seed": -1})).unwrap().sampling.seed, None);
        // The context bounds a limit, whatever its size.
        assert_eq!(
            apply(json!({"max_tokens": 1e15})).unwrap().num_predict,
            Some(1_000_000_000_000_000)
        );
        assert_eq!(
            apply(json!({"max_tokens": 1e300})).unwrap().num_predict,
            Some(usize::MAX)
        );
    }

    #[test]
    fn refuses_negative_or_absurd_values_by_name() {
        for (bad, key) in [
            (json!({"temperature": -1}), "temperature"),
            (json!({"top_p": 3}), "top_p"),
            (json!({"top_k": -5}), "top_k"),
            (json!({"num_predict": 2.5}), "num_predict"),
            (json!({"num_predict": -7}), "num_predict"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"stop": 5}), "stop"),
            (json!({"repeat_last_n": 2.5}), "repeat_last_n"),
            (json!({"draft": "medusa eagle"}), "draft"),
            (json!({"draft": "self:many"}), "draft"),
            (json!({"draft": "self:0"}), "draft"),
            (json!({"draft": 3}), "draft"),
            (json!({"num_draft": 99}), "num_draft"),
            (json!({"speculate": "yes"}), "speculate"),
        ] {
            let err = apply(bad.clone()).unwrap_err();
            assert_eq!(err.status, 400, "{bad}");
            assert!(err.message.contains(key), "{bad}: {}", err.message);
        }
    }

    #[test]
    fn reads_speculation_options() {
        let on = |depth| Speculation::On {
            drafter: DrafterKind::Ngram,
            max_depth: depth,
        };
        let cases = [
            (json!({}), Speculation::default()),
            (json!({"draft": "ngram"}), on(None)),
            (json!({"draft": "ngram", "num_draft": 4}), on(Some(4))),
            (json!({"num_draft": 4, "draft": "ngram"}), on(Some(4))),
            (
                json!({"num_draft": 5}),
                Speculation::ServerDefault { max_depth: Some(5) },
            ),
            (json!({"draft": "none"}), Speculation::Off),
            (json!({"draft": false}), Speculation::Off),
            (
                json!({"draft": "ngram", "speculate": false}),
                Speculation::Off,
            ),
            (json!({"draft": "ngram", "num_draft": 0}), Speculation::Off),
        ];
        for (options, expected) in cases {
            let applied = apply(options.clone()).unwrap();
            assert_eq!(applied.speculation, expected, "{options}");
            assert_eq!(applied.draft_model, None, "{options}");
        }
    }

    #[test]
    fn a_draft_model_is_named_by_its_model_name() {
        let applied = apply(json!({"draft": "SmolLM2:135m", "num_draft": 4})).unwrap();
        assert_eq!(
            applied.speculation,
            Speculation::On {
                drafter: DrafterKind::Model,
                max_depth: Some(4),
            }
        );
        assert_eq!(
            applied.draft_model,
            Some(ModelName::parse("smollm2:135m").unwrap())
        );
        // A request's built-in drafter replaces a Modelfile's draft model.
        let mut options = apply(json!({"draft": "smollm2:135m"})).unwrap();
        options
            .apply(json!({"draft": "ngram"}).as_object().unwrap())
            .unwrap();
        assert_eq!(options.draft_model, None);
        // Turning speculation off and on again keeps it.
        options
            .apply(
                json!({"draft": "smollm2:135m", "speculate": false})
                    .as_object()
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(options.speculation, Speculation::Off);
        assert!(options.draft_model.is_some());
    }
}
