//! `mlxkit run`: one prompt, or an interactive chat kept as a conversation, streamed to the
//! terminal.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use indicatif::ProgressBar;

use crate::cli::listing::human_bytes;
use crate::model_name::ModelName;
use crate::server::AppState;
use crate::server::generation::Output;
use crate::server::options::GenerationOptions;
use crate::server::request::{self, GenerationRequest, PromptSource};
use crate::server::requested_shape::Requested;

/// One-shot or interactive chat, streamed to the terminal.
pub(super) async fn chat(
    state: AppState,
    name: ModelName,
    prompt_text: String,
    think: bool,
    verbose: bool,
    options: serde_json::Map<String, serde_json::Value>,
    requested: Requested,
) -> Result<()> {
    let mut generation = GenerationOptions::default();
    let defaults: serde_json::Map<String, serde_json::Value> = state
        .store
        .get(&name)?
        .manifest
        .parameters
        .into_iter()
        .collect();
    generation.apply(&defaults)?;
    generation.apply(&options)?;
    let draft = generation.draft_model.clone();
    let started = Instant::now();
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!("loading {name}"));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let lease = state
        .keeper
        .acquire_drafted(&name, draft.as_ref(), None)
        .await?;
    spinner.finish_and_clear();
    let load = started.elapsed();
    drop(lease);

    let mut history: Vec<tokenizer::Message> = Vec::new();
    let one_shot = !prompt_text.is_empty();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let user = if one_shot {
            prompt_text.clone()
        } else {
            print!(">>> ");
            std::io::stdout().flush()?;
            match read_message(&mut lines)? {
                Some(text) if text.trim() == "/bye" => break,
                Some(text) if text.trim().is_empty() => continue,
                Some(text) => text,
                None => break,
            }
        };
        history.push(tokenizer::Message::new("user", user));
        let lease = state
            .keeper
            .acquire_drafted(&name, draft.as_ref(), None)
            .await?;
        let mut outputs = request::start(
            lease,
            GenerationRequest {
                source: PromptSource::Chat {
                    messages: history.clone(),
                    think: Some(think),
                },
                media: Vec::new(),
                requested: requested.clone(),
                options: generation.clone(),
                logprobs: None,
                started: Instant::now(),
                load,
            },
        )
        .await?
        .outputs;
        let mut reply = String::new();
        let mut stdout = std::io::stdout();
        while let Some(output) = outputs.recv().await {
            match output {
                Output::Content(text, _) => {
                    reply.push_str(&text);
                    write!(stdout, "{text}")?;
                    stdout.flush()?;
                }
                Output::Thinking(text) => {
                    write!(stdout, "\x1b[2m{text}\x1b[0m")?;
                    stdout.flush()?;
                }
                Output::ToolCall(call) => {
                    writeln!(stdout, "[tool call] {} {}", call.name, call.arguments)?
                }
                Output::Done(summary) => {
                    writeln!(stdout)?;
                    if verbose {
                        let s = summary.stats;
                        eprintln!(
                            "load {:.2}s | prompt {} tokens ({} cached) in {:.2}s | {} tokens in {:.2}s, {:.1} tok/s | peak {}",
                            summary.load.as_secs_f64(),
                            s.prompt_tokens,
                            s.cached_tokens,
                            s.prompt_eval.as_secs_f64(),
                            s.generated_tokens,
                            s.eval.as_secs_f64(),
                            s.generated_tokens as f64 / s.eval.as_secs_f64().max(1e-9),
                            human_bytes(s.peak_memory as u64),
                        );
                        if let Some(spec) = &s.speculation {
                            let drafter = crate::server::generation::drafter_name(
                                spec,
                                summary.draft.as_ref(),
                            );
                            eprintln!(
                                "speculation {drafter}: {} rounds, {} of {} drafts accepted",
                                spec.rounds, spec.accepted, spec.drafted
                            );
                        }
                    }
                }
                Output::Error(message) => bail!(message),
            }
        }
        history.push(tokenizer::Message::new("assistant", reply));
        if one_shot {
            break;
        }
    }
    Ok(())
}

/// Reads one message; a line of `"""` starts and ends a multi-line message.
fn read_message(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<Option<String>> {
    let Some(first) = lines.next().transpose()? else {
        return Ok(None);
    };
    let Some(rest) = first.trim_start().strip_prefix("\"\"\"") else {
        return Ok(Some(first));
    };
    let mut text = rest.to_string();
    if let Some(end) = text.find("\"\"\"") {
        text.truncate(end);
        return Ok(Some(text));
    }
    for line in lines {
        let line = line?;
        if let Some(end) = line.find("\"\"\"") {
            text.push('\n');
            text.push_str(&line[..end]);
            return Ok(Some(text));
        }
        text.push('\n');
        text.push_str(&line);
    }
    Ok(Some(text))
}
