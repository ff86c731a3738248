//! What a model can be asked to do, as `show` reports it: read from its chat template, since
//! that is what decides whether tools and thinking reach the model at all, and from its
//! checkpoint for images and audio.
//!
//! - `completion`: every model mlxkit serves generates text.
//! - `vision`: the checkpoint carries a vision tower mlxkit builds (`vision_config` of an
//!   architecture with an image side, [`nn::registry::image_input`]): Ollama's `images` and
//!   OpenAI's `image_url` parts reach it (issue 21).
//! - `audio`: the checkpoint carries an audio encoder mlxkit builds (`audio_config` of an
//!   architecture with an audio side, [`nn::registry::audio_input`]): OpenAI's `input_audio`
//!   parts reach it (issue 21).
//! - `transcription`: a Whisper checkpoint, which turns speech into text through
//!   `/v1/audio/transcriptions` and does nothing else: it lists no `completion` (issue 21).
//! - `tools`: the template renders a `tools` list.
//! - `thinking`: the template opens or strips a reasoning block (`<think>`, `enable_thinking`,
//!   `reasoning_content`).
//!
//! A capability listed here is one a request can use.

/// The name of the image capability, as recorded in a manifest and shown.
pub const VISION: &str = "vision";

/// The name of the audio capability, as recorded in a manifest and shown.
pub const AUDIO: &str = "audio";

/// The name of the speech-to-text capability, as recorded in a manifest and shown.
pub const TRANSCRIPTION: &str = "transcription";

/// The capabilities of a speech recognizer (a Whisper checkpoint): transcription only.
pub fn of_transcriber() -> Vec<String> {
    vec![TRANSCRIPTION.to_string()]
}

/// Whether a model with these recorded capabilities transcribes audio.
pub fn transcribes(capabilities: &[String]) -> bool {
    capabilities.iter().any(|c| c == TRANSCRIPTION)
}

/// What a checkpoint reads besides text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inputs {
    /// It has a vision tower mlxkit builds.
    pub vision: bool,
    /// It has an audio encoder mlxkit builds.
    pub audio: bool,
}

impl Inputs {
    /// The inputs recorded in a manifest's capabilities.
    pub fn of_capabilities(capabilities: &[String]) -> Inputs {
        Inputs {
            vision: capabilities.iter().any(|c| c == VISION),
            audio: capabilities.iter().any(|c| c == AUDIO),
        }
    }
}

/// The capabilities of a model with this chat template that reads `inputs` besides text.
pub fn of_model(template: Option<&str>, inputs: Inputs) -> Vec<String> {
    let mut out = of_template(template);
    // Media right after `completion`, images before audio, as Ollama lists them.
    let mut at = 1;
    for (has, name) in [(inputs.vision, VISION), (inputs.audio, AUDIO)] {
        if has {
            out.insert(at, name.to_string());
            at += 1;
        }
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
        let vision = Inputs {
            vision: true,
            audio: false,
        };
        assert_eq!(
            of_model(Some("{{ tools }}"), vision),
            ["completion", "vision", "tools"]
        );
        let audio = Inputs {
            vision: false,
            audio: true,
        };
        let listed = of_model(Some("{{ tools }}"), audio);
        assert_eq!(listed, ["completion", "audio", "tools"]);
        assert_eq!(Inputs::of_capabilities(&listed), audio);
    }
}
