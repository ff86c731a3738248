//! Per-slot sampling options, their defaults and their validation.

use std::collections::BTreeMap;

use crate::{Error, Result};

/// The longest penalty window accepted. Longer windows would only waste device memory: no model
/// in use has a context this long.
pub const MAX_REPEAT_LAST_N: usize = 1 << 20;

/// How one slot turns logits into tokens.
///
/// Filters apply in this order: logit bias → token mask → penalties → temperature → top-k →
/// top-p → min-p (see the crate docs for how that compares with Ollama's).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Divides the logits; `0` samples greedily (argmax).
    pub temperature: f32,
    /// Keeps the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keeps the smallest set of most likely tokens whose mass reaches `top_p` (the token that
    /// crosses it included); `1` keeps all.
    pub top_p: f32,
    /// Drops tokens less likely than `min_p` times the most likely one; `0` keeps all.
    pub min_p: f32,
    /// How many of the most recent tokens (prompt included) the penalties look at.
    pub repeat_last_n: usize,
    /// Divides positive and multiplies negative logits of tokens in the window; `1` is off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token in the window.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Added to the logits of the given token ids before anything else.
    pub logit_bias: BTreeMap<u32, f32>,
    /// Makes the slot's draws reproducible; `None` draws a fresh seed when the slot is added.
    pub seed: Option<u64>,
    /// Requests logprobs: `Some(n)` returns the chosen token's logprob and the `n` most likely
    /// alternatives; `None` computes nothing.
    pub logprobs: Option<usize>,
}

impl Default for Options {
    /// Ollama's server defaults, except `repeat_penalty`, which is 1.0 (off): a 1.1 default
    /// reached every model whose parameters left it unset, although no current model's maker
    /// recommends it, and it makes a speculating target reject good drafts. A model's own
    /// parameters may still set it.
    fn default() -> Self {
        Options {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.0,
            repeat_last_n: 64,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: BTreeMap::new(),
            seed: None,
            logprobs: None,
        }
    }
}

impl Options {
    /// Greedy decoding with every filter and penalty off.
    pub fn greedy() -> Options {
        Options {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Options::default()
        }
    }

    /// Plain sampling from `softmax(logits / temperature)` with every filter and penalty off.
    pub fn plain(temperature: f32) -> Options {
        Options {
            temperature,
            ..Options::greedy()
        }
    }

    /// Checks every option; each absurd value is an error naming it.
    pub fn validate(&self) -> Result<()> {
        finite("temperature", self.temperature)?;
        if self.temperature < 0.0 {
            return Err(invalid(
                "temperature",
                self.temperature,
                "must be 0 (greedy) or positive",
            ));
        }
        finite("top_p", self.top_p)?;
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(invalid("top_p", self.top_p, "must lie in [0, 1]"));
        }
        finite("min_p", self.min_p)?;
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid("min_p", self.min_p, "must lie in [0, 1]"));
        }
        finite("repeat_penalty", self.repeat_penalty)?;
        if self.repeat_penalty <= 0.0 {
            return Err(invalid(
                "repeat_penalty",
                self.repeat_penalty,
                "must be positive",
            ));
        }
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        if self.repeat_last_n > MAX_REPEAT_LAST_N {
            return Err(invalid(
                "repeat_last_n",
                self.repeat_last_n,
                "must be at most 2^20 tokens",
            ));
        }
        for (&token, &bias) in &self.logit_bias {
            if i32::try_from(token).is_err() {
                return Err(Error::TokenTooLarge(token));
            }
            finite("logit_bias", bias)?;
        }
        Ok(())
    }

    /// Whether two slots turn logits into the same distribution: equal options up to the
    /// seed (each slot draws with its own key anyway) and logprobs (computed for every row
    /// when any row asks). Such slots share one batched pass.
    pub fn same_distribution(&self, other: &Options) -> bool {
        self.temperature == other.temperature
            && self.top_k == other.top_k
            && self.top_p == other.top_p
            && self.min_p == other.min_p
            && self.window() == other.window()
            && self.repeat_penalty == other.repeat_penalty
            && self.presence_penalty == other.presence_penalty
            && self.frequency_penalty == other.frequency_penalty
            && self.logit_bias == other.logit_bias
    }

    /// Whether any penalty changes logits.
    pub(crate) fn penalizes(&self) -> bool {
        self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// The capacity of the slot's history ring: no ring at all when no penalty is active.
    pub(crate) fn window(&self) -> usize {
        if self.penalizes() {
            self.repeat_last_n
        } else {
            0
        }
    }

    /// Whether sampling is the argmax (temperature 0): its distributions are one-hot.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

fn finite(name: &'static str, value: f32) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(invalid(name, value, "must be a finite number"))
    }
}

fn invalid(name: &'static str, value: impl ToString, reason: &'static str) -> Error {
    Error::InvalidOption {
        name,
        value: value.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_do_not_penalize() {
        let options = Options::default();
        options.validate().unwrap();
        assert_eq!(options.repeat_penalty, 1.0);
        assert_eq!(options.window(), 0);
        Options::greedy().validate().unwrap();
    }

    #[test]
    fn absurd_values_are_errors_naming_the_option() {
        let cases: Vec<(&str, Options)> = vec![
            (
                "temperature",
                Options {
                    temperature: f32::NAN,
                    ..Options::default()
                },
            ),
            (
                "temperature",
                Options {
                    temperature: -1.0,
                    ..Options::default()
                },
            ),
            (
                "top_p",
                Options {
                    top_p: 1.5,
                    ..Options::default()
                },
            ),
            (
                "min_p",
                Options {
                    min_p: -0.1,
                    ..Options::default()
                },
            ),
            (
                "repeat_penalty",
                Options {
                    repeat_penalty: 0.0,
                    ..Options::default()
                },
            ),
            (
                "presence_penalty",
                Options {
                    presence_penalty: f32::INFINITY,
                    ..Options::default()
                },
            ),
            (
                "repeat_last_n",
                Options {
                    repeat_last_n: usize::MAX,
                    ..Options::default()
                },
            ),
            (
                "logit_bias",
                Options {
                    logit_bias: [(3, f32::NAN)].into(),
                    ..Options::default()
                },
            ),
        ];
        for (name, options) in cases {
            match options.validate() {
                Err(Error::InvalidOption { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{name}: expected an error, got {other:?}"),
            }
        }
    }

    #[test]
    fn window_follows_the_active_penalties() {
        let o = Options {
            repeat_penalty: 1.1,
            repeat_last_n: 8,
            ..Options::default()
        };
        assert_eq!(o.window(), 8);
        let o = Options {
            frequency_penalty: 0.5,
            repeat_last_n: 3,
            ..Options::default()
        };
        assert_eq!(o.window(), 3);
    }
}
