//! What a model can be asked to do, as `show` reports it: read from its chat template, since
//! that is what decides whether tools and thinking reach the model at all.
//!
//! - `completion`: every model mlxkit serves generates text.
//! - `tools`: the template renders a `tools` list.
//! - `thinking`: the template opens or strips a reasoning block (`<think>`, `enable_thinking`,
//!   `reasoning_content`).
//!
//! Vision and audio are left out until the runtime accepts images and sound for a model
//! (issue 21): a capability listed here is one a request can use.

/// The capabilities a model with this chat template offers.
pub fn of_template(template: Option<&str>) -> Vec<String> {
    let mut out = vec!["completion".to_string()];
    let Some(template) = template else {
        return out;
    };
    if template.contains("tools") {
        out.push("tools".to_string());
    }
    if ["<think>", "enable_thinking", "reasoning_content"]
        .iter()
        .any(|marker| template.contains(marker))
    {
        out.push("thinking".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_templates() {
        assert_eq!(of_template(None), ["completion"]);
        assert_eq!(
            of_template(Some("{% for m in messages %}{{ m.content }}{% endfor %}")),
            ["completion"]
        );
        assert_eq!(
            of_template(Some(
                "{% if tools %}{{ tools | tojson }}{% endif %}{% if enable_thinking %}<think>{% endif %}"
            )),
            ["completion", "tools", "thinking"]
        );
    }
}
