//! [`ChatTemplate`]: a conversation (and tools) → the prompt text the model was trained on.
//!
//! Before rendering, messages are normalised the way chat clients need and templates rarely
//! allow: a `developer` message becomes `system` (unless the template knows the role), and the
//! leading run of system messages is folded into one. Coding agents also insert system messages
//! mid-conversation (Claude Code's `mid-conversation-system` beta, reminders after tool
//! results). Each is rendered as a system turn where it stands when the template takes it: the
//! render succeeds and the message's text is in the prompt. A template that raises on it (roles
//! must alternate) or renders without it (it only prints user and assistant turns) is rendered
//! again with each such message turned into a user turn, merged with its neighbours, instead of
//! failing the request or losing the text; [`ChatTemplate::render_reporting`] says which
//! happened ([`LateSystem`]). Templates without a system role get the leading one folded into
//! the first user turn.

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::family::Family;
use crate::template_env::{NOW_VARIABLE, new_environment};
use crate::vocab::Tokenizer;

const TEMPLATE_NAME: &str = "chat";

/// One turn of a conversation, with the fields HF templates read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text of the turn.
    #[serde(default)]
    pub content: String,
    /// An assistant turn's reasoning, for templates that re-render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls an assistant turn made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MessageToolCall>,
    /// For `tool` turns: the function whose result this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For `tool` turns: the id of the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A turn with just a role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

/// A tool call inside an assistant message, in the OpenAI shape templates expect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageToolCall {
    /// Always `function`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// What was called.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

/// A function name and its arguments (a JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// Function name.
    pub name: String,
    /// Arguments, usually a JSON object.
    pub arguments: serde_json::Value,
}

impl MessageToolCall {
    /// A call of `name` with `arguments`.
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        MessageToolCall {
            kind: function_type(),
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// Per-request render settings.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Open an assistant turn at the end of the prompt.
    pub add_generation_prompt: bool,
    /// Passed as `enable_thinking` when set (Qwen3 and others read it).
    pub enable_thinking: Option<bool>,
    /// Pins `strftime_now` to this Unix time (seconds), for reproducible prompts.
    pub now_unix: Option<i64>,
    /// Further template variables (a request's `chat_template_kwargs`); the fields above win.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Where a conversation's mid-conversation system messages (system turns after the first
/// non-system one) went in its prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateSystem {
    /// Rendered as system turns where they stand: the template takes them.
    InPlace,
    /// The template raised on them (roles must alternate, no system role): each became a
    /// user turn, merged with the user turns beside it.
    FoldedRefused,
    /// The template rendered without their text (it prints only some roles): each became a
    /// user turn, merged with the user turns beside it.
    FoldedDropped,
    /// The template leaves them out, as user turns too (or refuses them so): the prompt
    /// lacks them.
    Dropped,
}

impl std::fmt::Display for LateSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LateSystem::InPlace => "rendered as system turns in place",
            LateSystem::FoldedRefused => {
                "folded into the adjacent user turns (the template refuses them in place)"
            }
            LateSystem::FoldedDropped => {
                "folded into the adjacent user turns (the template leaves them out in place)"
            }
            LateSystem::Dropped => "left out: the template drops them, in place and as user turns",
        })
    }
}

/// A rendered prompt and where its mid-conversation system messages went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    /// The prompt text.
    pub text: String,
    /// Where the system messages after the conversation's start went; `None` when it has
    /// none.
    pub late_system: Option<LateSystem>,
}

/// The work one render may do, in minijinja's fuel (about one instruction, or 64 bytes of data
/// created): a template that loops or builds huge strings fails with an error instead of
/// holding a thread. Real templates over a full context spend a few hundred thousand.
pub const RENDER_FUEL: u64 = 8_000_000;

/// A compiled chat template with the special-token texts it refers to.
pub struct ChatTemplate {
    env: Environment<'static>,
    knows_developer_role: bool,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates splice in.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        let source = source.into();
        let mut env = new_environment().map_err(|e| Error::TemplateSyntax(e.to_string()))?;
        env.set_fuel(Some(RENDER_FUEL));
        let knows_developer_role = source.contains("developer");
        let source = without_generation_blocks(&source);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| Error::TemplateSyntax(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            knows_developer_role,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Checks a template a user supplies before it is stored: it must compile and render a
    /// one-message conversation within its work budget, so that a broken template is refused
    /// once instead of failing every request that reaches it.
    pub fn check(source: &str) -> Result<()> {
        let template = Self::new(source, "", "")?;
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        template.render(&[Message::new("user", "Hello")], None, &options)?;
        Ok(())
    }

    /// The template the tokenizer's checkpoint ships, else its family's fallback.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        let source = match tokenizer.chat_template() {
            Some(source) => source.to_string(),
            None => Family::detect(tokenizer)
                .ok_or(Error::NoChatTemplate)?
                .fallback_template()
                .to_string(),
        };
        Self::new(
            source,
            tokenizer.bos_text().unwrap_or_default(),
            tokenizer.eos_text().unwrap_or_default(),
        )
    }

    /// Renders `messages` (and `tools`, JSON function schemas) into a prompt.
    ///
    /// Fails with [`Error::TemplateRender`] when the template raises or breaks, after the
    /// mid-conversation system message rewrite described in the module docs was tried.
    pub fn render(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        options: &RenderOptions,
    ) -> Result<String> {
        self.render_reporting(messages, tools, options)
            .map(|rendered| rendered.text)
    }

    /// Like [`ChatTemplate::render`], also saying where mid-conversation system messages
    /// went (`None` when the conversation has none).
    pub fn render_reporting(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        options: &RenderOptions,
    ) -> Result<RenderedChat> {
        let messages = self.normalize(messages);
        let late: Vec<&str> = messages
            .iter()
            .skip(1)
            .filter(|m| m.role == "system")
            .map(|m| m.content.trim())
            .collect();
        let demoted = demote_late_system_messages(&messages);
        let err = match self.render_exact(&messages, tools, options)? {
            Ok(text) if late.is_empty() => {
                return Ok(RenderedChat {
                    text,
                    late_system: None,
                });
            }
            // Taken where they stand, unless the template printed the turn without its text
            // (one that renders only user and assistant turns): then as user turns, if it
            // takes those; else as it rendered.
            Ok(text) => {
                if late.iter().all(|content| text.contains(content)) {
                    return Ok(RenderedChat {
                        text,
                        late_system: Some(LateSystem::InPlace),
                    });
                }
                return Ok(match self.render_exact(&demoted, tools, options)? {
                    Ok(folded) if late.iter().all(|content| folded.contains(content)) => {
                        RenderedChat {
                            text: folded,
                            late_system: Some(LateSystem::FoldedDropped),
                        }
                    }
                    _ => RenderedChat {
                        text,
                        late_system: Some(LateSystem::Dropped),
                    },
                });
            }
            Err(err) if err.kind() == ErrorKind::OutOfFuel => {
                return Err(Error::TemplateRender(format!(
                    "the chat template exceeded its work budget of {RENDER_FUEL} steps \
                     (does it loop, or build huge strings?): {}",
                    describe(&err)
                )));
            }
            Err(err) => Error::TemplateRender(describe(&err)),
        };
        // Retry the shapes templates commonly reject, keeping the first error to report.
        let late_system = (!late.is_empty()).then_some(LateSystem::FoldedRefused);
        let folded = fold_system_into_first_user(&demoted);
        let retries = (demoted != messages)
            .then_some(&demoted)
            .into_iter()
            .chain(folded.as_ref());
        for retry in retries {
            if let Ok(Ok(text)) = self.render_exact(retry, tools, options) {
                return Ok(RenderedChat { text, late_system });
            }
        }
        Err(err)
    }

    /// One render of exactly `messages`: the outer error is ours (the context could not be
    /// built), the inner one the template's.
    fn render_exact(
        &self,
        messages: &[Message],
        tools: Option<&[serde_json::Value]>,
        options: &RenderOptions,
    ) -> Result<std::result::Result<String, minijinja::Error>> {
        let mut ctx = options.extra.clone();
        ctx.insert("messages".into(), to_json(messages)?);
        if let Some(tools) = tools {
            ctx.insert("tools".into(), to_json(tools)?);
        }
        ctx.insert(
            "add_generation_prompt".into(),
            options.add_generation_prompt.into(),
        );
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        if let Some(enable) = options.enable_thinking {
            ctx.insert("enable_thinking".into(), enable.into());
        }
        if let Some(now) = options.now_unix {
            ctx.insert(NOW_VARIABLE.into(), now.into());
        }
        Ok(self
            .env
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render(Value::from(minijinja::value::Serde(&ctx)))))
    }

    fn normalize(&self, messages: &[Message]) -> Vec<Message> {
        let mut out: Vec<Message> = Vec::with_capacity(messages.len());
        for message in messages {
            let mut message = message.clone();
            if message.role == "developer" && !self.knows_developer_role {
                message.role = "system".into();
            }
            // Fold the leading run of instructions into one system turn: templates only look
            // at messages[0] for it.
            let leading_run = out.iter().all(|m| m.role == "system");
            match out.last_mut() {
                Some(prev) if leading_run && message.role == "system" => {
                    prev.content = join(&prev.content, &message.content);
                }
                _ => out.push(message),
            }
        }
        out
    }
}

/// Non-leading system turns become user turns, merged into adjacent user turns so that
/// templates that demand alternation accept them.
fn demote_late_system_messages(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let mut message = message.clone();
        if i > 0 && message.role == "system" {
            message.role = "user".into();
        }
        match out.last_mut() {
            Some(prev) if prev.role == "user" && message.role == "user" => {
                prev.content = join(&prev.content, &message.content);
            }
            _ => out.push(message),
        }
    }
    out
}

/// For templates without a system role ("System role not supported"): the leading system
/// turn becomes the start of the first user turn.
fn fold_system_into_first_user(messages: &[Message]) -> Option<Vec<Message>> {
    let (first, rest) = messages.split_first()?;
    if first.role != "system" {
        return None;
    }
    let mut out = rest.to_vec();
    match out.iter_mut().find(|m| m.role == "user") {
        Some(user) => user.content = join(&first.content, &user.content),
        None => out.insert(0, Message::new("user", first.content.clone())),
    }
    Some(out)
}

/// Rewrites HF's `{% generation %}…{% endgeneration %}` (which marks assistant tokens for
/// training masks and has no effect on the text) into an always-true `if`, keeping the tags'
/// whitespace control.
fn without_generation_blocks(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        // The closing `%}` is searched after the opening `{%`: in `{%}` they overlap.
        let Some(len) = rest[start + 2..].find("%}").map(|end| end + 4) else {
            break;
        };
        let tag = &rest[start..start + len];
        let inner =
            tag[2..len - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        match inner {
            "generation" => out.push_str(&tag.replacen("generation", "if true", 1)),
            "endgeneration" => out.push_str(&tag.replacen("endgeneration", "endif", 1)),
            _ => out.push_str(tag),
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    out
}

fn join(a: &str, b: &str) -> String {
    if a.is_empty() {
        b.to_string()
    } else {
        format!("{a}\n\n{b}")
    }
}

/// minijinja's error with its cause chain and template location.
fn describe(err: &minijinja::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<serde_json::Value> {
    serde_json::to_value(value)
        .map_err(|e| Error::TemplateRender(format!("cannot pass to the template: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_blocks_become_plain_ifs() {
        let src = "a{%- generation -%}b{% endgeneration %}c{% if x %}{% endif %}";
        let rewritten = without_generation_blocks(src);
        assert_eq!(
            rewritten,
            "a{%- if true -%}b{% endif %}c{% if x %}{% endif %}"
        );
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[], None, &RenderOptions::default()).unwrap(),
            "abc"
        );
    }

    #[test]
    fn system_folds_into_the_first_user_turn_when_unsupported() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}\
                   {{ raise_exception('System role not supported') }}{% endif %}\
                   [{{ m.role }}:{{ m.content }}]{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let msgs = [Message::new("system", "S"), Message::new("user", "U")];
        assert_eq!(
            t.render(&msgs, None, &RenderOptions::default()).unwrap(),
            "[user:S\n\nU]"
        );
    }

    /// A conversation with a system message after the start, as agents send it.
    fn with_late_system() -> Vec<Message> {
        vec![
            Message::new("system", "S"),
            Message::new("user", "A"),
            Message::new("assistant", "B"),
            Message::new("system", "Late"),
            Message::new("user", "C"),
        ]
    }

    #[test]
    fn a_late_system_message_stays_in_place_where_the_template_takes_it() {
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                      {% endfor %}";
        let t = ChatTemplate::new(chatml, "", "").unwrap();
        let rendered = t
            .render_reporting(&with_late_system(), None, &RenderOptions::default())
            .unwrap();
        assert_eq!(rendered.late_system, Some(LateSystem::InPlace));
        assert!(
            rendered
                .text
                .contains("<|im_end|>\n<|im_start|>system\nLate<|im_end|>\n<|im_start|>user\nC"),
            "{}",
            rendered.text
        );
        // Without one there is nothing to report.
        let plain = [Message::new("system", "S"), Message::new("user", "A")];
        let rendered = t
            .render_reporting(&plain, None, &RenderOptions::default())
            .unwrap();
        assert_eq!(rendered.late_system, None);
    }

    #[test]
    fn a_late_system_message_is_folded_where_the_template_refuses_it() {
        // Llama 2 and Mistral's check: after an optional system turn, user and assistant
        // alternate.
        let alternating = "{% for m in messages %}{% if m.role != 'system' or not loop.first %}\
            {% if (m.role == 'user') != (loop.index0 % 2 == (1 if messages[0].role == 'system' else 0)) %}\
            {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
            {% endif %}{% endif %}[{{ m.role }}:{{ m.content }}]{% endfor %}";
        let t = ChatTemplate::new(alternating, "", "").unwrap();
        let rendered = t
            .render_reporting(&with_late_system(), None, &RenderOptions::default())
            .unwrap();
        assert_eq!(rendered.late_system, Some(LateSystem::FoldedRefused));
        assert_eq!(
            rendered.text,
            "[system:S][user:A][assistant:B][user:Late\n\nC]"
        );
    }

    #[test]
    fn a_late_system_message_is_folded_where_the_template_drops_it() {
        // Prints the leading system prompt and then only user and assistant turns.
        let dropping = "{% for m in messages %}{% if m.role in ['user', 'assistant'] or loop.first %}\
                        [{{ m.role }}:{{ m.content }}]{% endif %}{% endfor %}";
        let t = ChatTemplate::new(dropping, "", "").unwrap();
        let rendered = t
            .render_reporting(&with_late_system(), None, &RenderOptions::default())
            .unwrap();
        assert_eq!(rendered.late_system, Some(LateSystem::FoldedDropped));
        assert_eq!(
            rendered.text,
            "[system:S][user:A][assistant:B][user:Late\n\nC]"
        );
        // A template that prints no user turns either cannot be given the text at all: it is
        // said, and the prompt is the template's own.
        let only_assistant = "{% for m in messages %}{% if m.role == 'assistant' %}\
                              [{{ m.content }}]{% endif %}{% endfor %}";
        let t = ChatTemplate::new(only_assistant, "", "").unwrap();
        let rendered = t
            .render_reporting(&with_late_system(), None, &RenderOptions::default())
            .unwrap();
        assert_eq!(rendered.late_system, Some(LateSystem::Dropped));
    }

    #[test]
    fn a_tag_whose_markers_overlap_is_a_syntax_error_not_a_panic() {
        for source in ["{%}", "a{%}b", "{%-}", "{%%}", "{% generation %}{%}"] {
            let err = ChatTemplate::new(source, "", "").unwrap_err();
            assert!(matches!(err, Error::TemplateSyntax(_)), "{source}: {err}");
        }
    }

    #[test]
    fn check_refuses_what_would_fail_every_request() {
        assert!(ChatTemplate::check("{% for m in messages %}{{ m.content }}{% endfor %}").is_ok());
        for broken in [
            "{%}",
            "{{ foo(",
            "{{ raise_exception('no') }}",
            "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
        ] {
            assert!(ChatTemplate::check(broken).is_err(), "{broken}");
        }
    }

    #[test]
    fn a_template_that_loops_runs_out_of_fuel() {
        let looping =
            "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(looping, "", "").unwrap();
        match t.render(
            &[Message::new("user", "U")],
            None,
            &RenderOptions::default(),
        ) {
            Err(err) => assert!(err.to_string().contains("work budget"), "{err}"),
            Ok(text) => panic!("rendered {} bytes", text.len()),
        }
    }

    #[test]
    fn unrecoverable_errors_report_the_first_failure() {
        let t = ChatTemplate::new("{{ raise_exception('first') }}", "", "").unwrap();
        let msgs = [Message::new("system", "S"), Message::new("user", "U")];
        let err = t
            .render(&msgs, None, &RenderOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("first"), "{err}");
    }
}
