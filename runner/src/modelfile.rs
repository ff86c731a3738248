//! Modelfiles: `FROM`, `PARAMETER`, `TEMPLATE`, `SYSTEM` and `DRAFT`, as `mlxkit create -f`
//! reads them.

use std::collections::BTreeMap;

/// A parsed Modelfile.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Modelfile {
    /// The base: a local GGUF file, a local safetensors folder, or a model in the store.
    pub from: String,
    /// Default options; repeated keys (such as `stop`) collect into a list.
    pub parameters: BTreeMap<String, serde_json::Value>,
    /// A chat template overriding the base's.
    pub template: Option<String>,
    /// A default system prompt.
    pub system: Option<String>,
    /// A draft model (`DRAFT`): its name in the store, or a path to a GGUF file or a
    /// transformers folder that create imports beside the model.
    pub draft: Option<String>,
}

/// A Modelfile error, with its line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Modelfile line {line}: {message}")]
pub struct ModelfileError {
    /// 1-based line of the problem.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Options whose values are numbers; everything else stays a string.
const NUMERIC: &[&str] = &[
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "num_predict",
    "num_ctx",
    "num_draft",
];

impl Modelfile {
    /// Parses Modelfile text.
    pub fn parse(text: &str) -> Result<Modelfile, ModelfileError> {
        let mut out = Modelfile::default();
        let mut lines = text.lines().enumerate().peekable();
        while let Some((index, raw)) = lines.next() {
            let line_no = index + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |message: String| ModelfileError {
                line: line_no,
                message,
            };
            let (command, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim();
            match command.to_ascii_uppercase().as_str() {
                "FROM" => {
                    if rest.is_empty() {
                        return Err(err("FROM needs a model name or a path".into()));
                    }
                    out.from = unquote(rest).to_string();
                }
                "PARAMETER" => {
                    let (key, value) = rest
                        .split_once(char::is_whitespace)
                        .ok_or_else(|| err("PARAMETER needs a name and a value".into()))?;
                    let key = key.to_ascii_lowercase();
                    let value = unquote(value.trim());
                    let parsed = if NUMERIC.contains(&key.as_str()) {
                        let number: f64 = value.parse().map_err(|_| {
                            err(format!("PARAMETER {key} needs a number, got `{value}`"))
                        })?;
                        serde_json::json!(number)
                    } else if key == "speculate" {
                        let on: bool = value.parse().map_err(|_| {
                            err(format!(
                                "PARAMETER speculate needs true or false, got `{value}`"
                            ))
                        })?;
                        serde_json::json!(on)
                    } else if key == "draft"
                        && value != "none"
                        && crate::engine::DrafterKind::parse(value).is_none()
                        && (value.starts_with("self:")
                            || crate::model_name::ModelName::parse(value).is_err())
                    {
                        return Err(err(format!(
                            "PARAMETER draft: unknown drafter `{value}` (known: ngram, \
                             self:<layers>, none, or a draft model's name)"
                        )));
                    } else {
                        serde_json::Value::String(value.to_string())
                    };
                    if key == "stop" {
                        let list = out
                            .parameters
                            .entry(key)
                            .or_insert_with(|| serde_json::json!([]));
                        if let Some(items) = list.as_array_mut() {
                            items.push(parsed);
                        }
                    } else {
                        out.parameters.insert(key, parsed);
                    }
                }
                name @ ("TEMPLATE" | "SYSTEM") => {
                    let value = if let Some(body) = rest.strip_prefix("\"\"\"") {
                        // A triple-quoted block may span lines.
                        let mut text = String::new();
                        let mut current = body.to_string();
                        loop {
                            if let Some(end) = current.find("\"\"\"") {
                                text.push_str(&current[..end]);
                                break;
                            }
                            text.push_str(&current);
                            text.push('\n');
                            match lines.next() {
                                Some((_, next)) => current = next.to_string(),
                                None => {
                                    return Err(err(format!(
                                        "{name} block is not closed with \"\"\""
                                    )));
                                }
                            }
                        }
                        text
                    } else {
                        unquote(rest).to_string()
                    };
                    if name == "TEMPLATE" {
                        out.template = Some(value);
                    } else {
                        out.system = Some(value);
                    }
                }
                "DRAFT" => {
                    let value = unquote(rest);
                    out.draft = Some(match crate::model_name::ModelName::parse(value) {
                        Ok(parsed) => parsed.to_string(),
                        // A file or folder, imported beside the model at create.
                        Err(_) if looks_like_path(value) => value.to_string(),
                        Err(_) => {
                            return Err(err(format!(
                                "DRAFT `{value}`: neither a model in the store nor a path \
                                 (a GGUF file or a transformers folder)"
                            )));
                        }
                    });
                }
                other => return Err(err(format!("unknown command `{other}`"))),
            }
        }
        if out.from.is_empty() {
            return Err(ModelfileError {
                line: text.lines().count().max(1),
                message: "no FROM line".into(),
            });
        }
        Ok(out)
    }
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// Whether a Modelfile value names a file rather than a model: it has a path separator or
/// starts with `.` or `~`.
fn looks_like_path(value: &str) -> bool {
    value.contains('/') || value.contains('\\') || value.starts_with('.') || value.starts_with('~')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        let m = Modelfile::parse(
            "# a comment\nFROM smollm2:135m\nPARAMETER temperature 0.2\nPARAMETER stop \"<end>\"\nPARAMETER stop user:\nSYSTEM \"\"\"You are\nterse.\"\"\"\nTEMPLATE {{ .Prompt }}\n",
        )
        .unwrap();
        assert_eq!(m.from, "smollm2:135m");
        assert_eq!(m.parameters["temperature"], serde_json::json!(0.2));
        assert_eq!(m.parameters["stop"], serde_json::json!(["<end>", "user:"]));
        let spec = Modelfile::parse(
            "FROM x\nPARAMETER draft ngram\nPARAMETER num_draft 6\nPARAMETER speculate true",
        )
        .unwrap();
        assert_eq!(spec.parameters["draft"], serde_json::json!("ngram"));
        assert_eq!(spec.parameters["num_draft"], serde_json::json!(6.0));
        assert_eq!(spec.parameters["speculate"], serde_json::json!(true));
        assert_eq!(m.system.as_deref(), Some("You are\nterse."));
        assert_eq!(m.template.as_deref(), Some("{{ .Prompt }}"));
        let from_path = Modelfile::parse("FROM x\nDRAFT ./drafts/small.gguf").unwrap();
        assert_eq!(from_path.draft.as_deref(), Some("./drafts/small.gguf"));
        let drafted = Modelfile::parse("FROM x\nDRAFT SmolLM2:135m\nPARAMETER draft y:1b").unwrap();
        assert_eq!(drafted.draft.as_deref(), Some("smollm2:135m"));
        assert_eq!(drafted.parameters["draft"], serde_json::json!("y:1b"));
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            Modelfile::parse("FROM x\nPARAMETER top_k many")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            Modelfile::parse("FROM x\nSYSTEM \"\"\"open")
                .unwrap_err()
                .line,
            2
        );
        assert!(
            Modelfile::parse("PARAMETER seed 1")
                .unwrap_err()
                .message
                .contains("FROM")
        );
        for bad in [
            "FROM x\nPARAMETER draft self:many",
            "FROM x\nPARAMETER draft a/../b",
            "FROM x\nPARAMETER speculate maybe",
            "FROM x\nPARAMETER num_draft four",
            "FROM x\nDRAFT bad name!",
        ] {
            assert_eq!(Modelfile::parse(bad).unwrap_err().line, 2, "{bad}");
        }
        assert!(
            Modelfile::parse("FROM x\nADAPTER y")
                .unwrap_err()
                .message
                .contains("ADAPTER")
        );
    }
}
