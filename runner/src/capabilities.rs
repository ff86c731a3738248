//! What a model can be asked to do, as `show` reports it: read from its chat template, since
//! that is what decides whether tools and thinking reach the model at all, and from its
//! checkpoint for images.
//!
//! - `completion`: every model mlxkit serves generates text.
//! - `vision`: the checkpoint carries a vision tower mlxkit builds (`vision_config` of an
//!   architecture with an image side, [`nn::registry::image_input`]): Ollama's `images` and
//!   OpenAI's `image_url` parts reach it (issue 21).
//! - `tools`: the template renders a `tools` list.
//! - `thinking`: the template opens or strips a reasoning block (`<think>`, `enable_thinking`,
//!   `reasoning_content`).
//!
//! Audio is left out until the runtime accepts sound for a model: a capability listed here is
//! one a request can use.

/// The name of the image capability, as recorded in a manifest and shown.
pub const VISION: &str = "vision";

/// The capabilities of a model with this chat template that reads images when `vision`.
pub fn of_model(template: Option<&str>, vision: bool) -> Vec<String> {
    let mut out = of_template(template);
    if vision {
        out.insert(1, VISION.to_string());
    }
    out
}

/// The capabilities a model with this chat template offers (images aside, see [`of_model`]).
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
        assert_eq!(
            of_model(Some("{{ tools }}"), true),
            ["completion", "vision", "tools"]
        );
    }
}
