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
//! - `tools`: the template renders a `tools` list (recorded at import); `show` lists it for
//!   every model that completes text, since tools reach every such model, through its template
//!   or written into the system turn (the hermes or generic format, issue 48; [`shown`]).
//! - `insert`: the vocabulary has fill-in-the-middle tokens, so `/api/generate`'s `suffix`
//!   reaches the model ([`tokenizer::FillInMiddle`]).
//! - `thinking`: the template opens or strips a reasoning block (`<think>`, `enable_thinking`,
//!   `reasoning_content`).
//!
//! A capability listed here is one a request can use.

/// The name of the image capability, as recorded in a manifest and shown.
pub const VISION: &str = "vision";

/// The name of the audio capability, as recorded in a manifest and shown.
pub const AUDIO: &str = "audio";

/// The name of the fill-in-the-middle capability, as recorded in a manifest and shown.
pub const INSERT: &str = "insert";

/// The name of the speech-to-text capability, as recorded in a manifest and shown.
pub const TRANSCRIPTION: &str = "transcription";

/// The name of a drafter's one capability (a Gemma 4 assistant, a DFlash drafter): it drafts
/// for its target and serves no request of its own.
pub const DRAFTING: &str = "drafting";

/// The capabilities of a drafter that only drafts (a Gemma 4 assistant, a DFlash drafter).
pub fn of_drafter() -> Vec<String> {
    vec![DRAFTING.to_string()]
}

/// Whether a model with these recorded capabilities only drafts for another.
pub fn only_drafts(capabilities: &[String]) -> bool {
    capabilities.iter().any(|c| c == DRAFTING)
}

/// The capabilities of a speech recognizer (a Whisper checkpoint): transcription only.
pub fn of_transcriber() -> Vec<String> {
    vec![TRANSCRIPTION.to_string()]
}

/// Whether a model with these recorded capabilities transcribes audio.
pub fn transcribes(capabilities: &[String]) -> bool {
    capabilities.iter().any(|c| c == TRANSCRIPTION)
}

/// What a checkpoint reads besides chat turns and plain text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Inputs {
    /// It has a vision tower mlxkit builds.
    pub vision: bool,
    /// It has an audio encoder mlxkit builds.
    pub audio: bool,
    /// Its vocabulary has fill-in-the-middle tokens.
    pub insert: bool,
}

impl Inputs {
    /// The inputs recorded in a manifest's capabilities.
    pub fn of_capabilities(capabilities: &[String]) -> Inputs {
        Inputs {
            vision: capabilities.iter().any(|c| c == VISION),
            audio: capabilities.iter().any(|c| c == AUDIO),
            insert: capabilities.iter().any(|c| c == INSERT),
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
    if inputs.insert {
        insert_before_thinking(&mut out, INSERT);
    }
    out
}

/// Adds `name` to `list` before `thinking` (Ollama's order), or last.
fn insert_before_thinking(list: &mut Vec<String>, name: &str) {
    let at = list
        .iter()
        .position(|c| c == "thinking")
        .unwrap_or(list.len());
    list.insert(at, name.to_string());
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

/// The capabilities `show` lists for a model with these `recorded` ones: `tools` added wherever
/// it completes text, before `thinking` as Ollama orders them.
pub fn shown(mut recorded: Vec<String>) -> Vec<String> {
    let completes = recorded.iter().any(|c| c == "completion");
    if completes && !recorded.iter().any(|c| c == "tools") {
        // Before `insert`, where it is listed.
        let at = recorded
            .iter()
            .position(|c| c == INSERT || c == "thinking")
            .unwrap_or(recorded.len());
        recorded.insert(at, "tools".to_string());
    }
    recorded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_adds_tools_to_every_model_that_completes_text() {
        let list = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(shown(list(&["completion"])), ["completion", "tools"]);
        assert_eq!(
            shown(list(&["completion", "vision", "thinking"])),
            ["completion", "vision", "tools", "thinking"]
        );
        assert_eq!(
            shown(list(&["completion", "tools", "thinking"])),
            ["completion", "tools", "thinking"]
        );
        assert_eq!(shown(of_transcriber()), ["transcription"]);
    }

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
            ..Inputs::default()
        };
        assert_eq!(
            of_model(Some("{{ tools }}"), vision),
            ["completion", "vision", "tools"]
        );
        let audio = Inputs {
            audio: true,
            ..Inputs::default()
        };
        let listed = of_model(Some("{{ tools }}"), audio);
        assert_eq!(listed, ["completion", "audio", "tools"]);
        assert_eq!(Inputs::of_capabilities(&listed), audio);
        let fills_in = Inputs {
            insert: true,
            ..Inputs::default()
        };
        let listed = of_model(Some("{{ tools }}<think>"), fills_in);
        assert_eq!(listed, ["completion", "tools", "insert", "thinking"]);
        assert_eq!(Inputs::of_capabilities(&listed), fills_in);
        assert_eq!(
            shown(of_model(None, fills_in)),
            ["completion", "tools", "insert"]
        );
    }
}
