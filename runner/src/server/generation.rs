//! The text side of a generation, shared by every endpoint: runs a job on the engine and turns
//! its token stream into text pieces (never splitting a character), held back at stop strings,
//! split into content, thinking and tool calls by the model's output parser.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokenizer::{Detokenizer, OutputParser, ParserConfig, ParserEvent, StopMatcher, ToolCall};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::engine::{DoneReason, DrafterKind, Event, Job, SpeculationStats, Stats, TokenLogprobs};
use crate::model_keeper::Lease;
use crate::model_name::ModelName;
use crate::server::error::client_text;
use crate::server::metrics;
use crate::server::options::GenerationOptions;
use crate::server::request_error::RequestError;
use crate::server::stopping;

/// One alternative in a logprobs entry.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// The logprob of one generated token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogprobEntry {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// What a generation produces, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Text for the user, with the logprobs of the tokens it came from (when asked for).
    Content(String, Vec<LogprobEntry>),
    /// Reasoning text.
    Thinking(String),
    /// A complete tool call.
    ToolCall(ToolCall),
    /// The end, with why and the statistics.
    Done(Summary),
    /// A failure after the response started; nothing follows.
    Error(String),
}

/// How a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// `stop` or `length`.
    pub reason: DoneReason,
    /// Engine statistics.
    pub stats: Stats,
    /// Wall time from the request's arrival.
    pub total: Duration,
    /// Time spent loading the model for this request.
    pub load: Duration,
    /// The draft model loaded beside the model, if any.
    pub draft: Option<ModelName>,
    /// The stop string that ended the output, when one did.
    pub stop_sequence: Option<String>,
}

/// The drafter of `spec` by the name requests give it; `draft` names the draft model loaded
/// beside the model, which a `model` round drafted with.
pub fn drafter_name(spec: &SpeculationStats, draft: Option<&ModelName>) -> String {
    match (spec.drafter, draft) {
        (DrafterKind::Model, Some(draft)) => draft.to_string(),
        (kind, _) => kind.name(),
    }
}

/// Adds the extension fields naming how many of the prompt's images the vision encoder ran
/// for (the rest came from its cache), when the prompt had images, and how many of its audio
/// segments the audio encoder ran for, when it had audio.
pub fn insert_images_encoded(object: &mut serde_json::Value, stats: &Stats) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    if stats.images > 0 {
        map.insert(
            "images_encoded".into(),
            serde_json::json!(stats.images_encoded),
        );
    }
    if stats.audio > 0 {
        map.insert(
            "audio_encoded".into(),
            serde_json::json!(stats.audio_encoded),
        );
    }
}

/// What speculative decoding did for a request, as both APIs report it (`draft` as for
/// [`drafter_name`]).
pub fn speculation_json(spec: &SpeculationStats, draft: Option<&ModelName>) -> serde_json::Value {
    serde_json::json!({
        "drafter": drafter_name(spec, draft),
        "rounds": spec.rounds,
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "mean_depth": spec.mean_depth(),
        "plain_tokens": spec.plain,
    })
}

/// A prepared generation: prompt tokens and settings.
pub struct Prepared {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Validated options.
    pub options: GenerationOptions,
    /// Top logprobs to report per token (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// The output parser's settings (thinking and tool calls), when the model has any.
    pub parser: Option<ParserConfig>,
    /// The compiled constraint on the output's shape, when the request asked for one.
    pub grammar: Option<grammar::Grammar>,
    /// Prompt offsets where conversation turns start (restore points for the prefix cache).
    pub turn_starts: Vec<usize>,
    /// The images in the prompt, in order.
    pub images: Vec<crate::engine::PromptMedia>,
    /// When the request arrived.
    pub started: Instant,
    /// Time spent loading the model for this request.
    pub load: Duration,
}

/// Starts `prepared` on the engine and returns its outputs. Dropping the receiver cancels the
/// generation at its next step. What can only be checked against the loaded model (token ids
/// in `logit_bias`) is checked here, before the response starts.
///
/// `lease` is shared by the jobs of one request (OpenAI's `n` choices); the last to end lets
/// the model go.
pub fn start(
    lease: Arc<Lease>,
    prepared: Prepared,
) -> Result<mpsc::Receiver<Output>, RequestError> {
    let vocab = lease.info.tokenizer.vocab_size();
    if let Some(&token) = prepared
        .options
        .sampling
        .logit_bias
        .keys()
        .find(|&&token| token as usize >= vocab)
    {
        return Err(RequestError::invalid(format!(
            "`logit_bias` names token {token}, outside the vocabulary of {vocab}"
        )));
    }
    let (tx, rx) = mpsc::channel(64);
    // In the request's span: the generation's log lines carry its request id.
    tokio::spawn(
        async move {
            run(lease, prepared, tx).await;
        }
        .in_current_span(),
    );
    Ok(rx)
}

async fn run(lease: Arc<Lease>, prepared: Prepared, out: mpsc::Sender<Output>) {
    let info = Arc::clone(&lease.info);
    let context = prepared
        .options
        .num_ctx
        .map(|n| n.min(info.context_length))
        .unwrap_or(info.context_length);
    let room = context.saturating_sub(prepared.prompt.len());
    let max_tokens = prepared.options.num_predict.unwrap_or(room).min(room);
    let mut sampling = prepared.options.sampling.clone();
    sampling.logprobs = prepared.logprobs;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job {
        prompt: prepared.prompt,
        sampling,
        max_tokens,
        stop_tokens: if prepared.options.ignore_eos {
            Vec::new()
        } else {
            info.tokenizer.stop_tokens().iter().copied().collect()
        },
        grammar: prepared.grammar,
        turn_starts: prepared.turn_starts,
        images: prepared.images,
        speculation: prepared.options.speculation,
        events: events_tx,
        cancel: Arc::clone(&cancel),
    };
    // The lease, held until the job ends, keeps the model loaded.
    lease.engine.submit(lease.slot, job);
    let mut text = TextPipeline::new(&info.tokenizer, &prepared.options.stop, prepared.parser);
    let metrics = metrics::RequestMetrics::new(&info.name.to_string());
    let mut last_token: Option<Instant> = None;
    let mut stopped_by_text: Option<String> = None;
    let mut client_gone = false;
    let mut ended = false;
    let stopping = stopping::generations_ended();
    tokio::pin!(stopping);
    let group_lost = group_lost(&lease.engine);
    tokio::pin!(group_lost);
    loop {
        // A client that goes away is noticed at once, not at the next token: a long prefill
        // stops at its next chunk.
        let event = tokio::select! {
            event = events.recv() => event,
            () = out.closed(), if !client_gone => {
                client_gone = true;
                cancel.store(true, Ordering::Relaxed);
                continue;
            }
            // The server is stopping and its grace is over: the client hears why its answer
            // ends here; the engine's last events are drained as for a client gone.
            () = &mut stopping, if !client_gone => {
                let _ = out.send(Output::Error(stopping::STOPPED_MESSAGE.to_string())).await;
                client_gone = true;
                cancel.store(true, Ordering::Relaxed);
                continue;
            }
            // The engine fails a step whose group lost a rank, naming it; a step caught in
            // MLX's ring never returns, and this ends the request anyway.
            why = &mut group_lost, if !client_gone => {
                tracing::warn!(model = %info.name, "generation failed: {why}");
                let _ = out.send(Output::Error(client_text(&why))).await;
                cancel.store(true, Ordering::Relaxed);
                ended = true;
                break;
            }
        };
        let Some(event) = event else {
            break;
        };
        match event {
            Event::Token { id, logprobs } => {
                let now = Instant::now();
                match last_token.replace(now) {
                    None => metrics.first_token(now - prepared.started),
                    Some(previous) => metrics.next_token(now - previous),
                }
                if stopped_by_text.is_some() || client_gone {
                    continue; // Draining what the engine produced before it saw `cancel`.
                }
                let entry = logprobs.map(|lp| LogprobEntry::new(&info.tokenizer, id, &lp));
                let (outputs, stopped) = text.push(id, entry);
                for output in outputs {
                    let failed = matches!(output, Output::Error(_));
                    if out.send(output).await.is_err() {
                        client_gone = true;
                    }
                    if failed {
                        // The parser gave up: report once and end the request.
                        client_gone = true;
                    }
                }
                if stopped.is_some() || client_gone {
                    stopped_by_text = stopped;
                    cancel.store(true, Ordering::Relaxed);
                }
            }
            Event::Done { reason, stats } => {
                metrics.finished(&stats);
                tracing::info!(
                    model = %info.name,
                    reason = reason.as_str(),
                    prompt_tokens = stats.prompt_tokens,
                    cached_tokens = stats.cached_tokens,
                    generated_tokens = stats.generated_tokens,
                    prompt_ms = stats.prompt_eval.as_secs_f64() * 1e3,
                    eval_ms = stats.eval.as_secs_f64() * 1e3,
                    client_gone,
                    "generation finished"
                );
                if !client_gone {
                    // A token limit or a stop string ended the output, wherever it was: a
                    // tool call they cut is dropped, not an error nor raw text (issue 48).
                    let cut_off = reason == DoneReason::Length || stopped_by_text.is_some();
                    for output in text.finish(cut_off) {
                        let _ = out.send(output).await;
                    }
                    let reason = if stopped_by_text.is_some() {
                        DoneReason::Stop
                    } else {
                        reason
                    };
                    let _ = out
                        .send(Output::Done(Summary {
                            reason,
                            stats,
                            total: prepared.started.elapsed(),
                            load: prepared.load,
                            draft: info.draft.clone(),
                            stop_sequence: stopped_by_text,
                        }))
                        .await;
                }
                ended = true;
                break;
            }
            Event::Failed(message) => {
                tracing::warn!(model = %info.name, "generation failed: {message}");
                let _ = out.send(Output::Error(client_text(&message))).await;
                ended = true;
                break;
            }
        }
    }
    if !ended && !client_gone {
        let message = "the engine stopped without finishing the generation".to_string();
        let _ = out.send(Output::Error(message)).await;
    }
}

/// How long a group may have lost a rank before a request waiting on it ends: the engine's
/// own error, which names the rank, comes within two seconds when its step returns at all.
const GROUP_LOST_GRACE: Duration = Duration::from_secs(4);

/// Why `engine`'s group cannot serve, once it has not for [`GROUP_LOST_GRACE`]; never, for an
/// engine that is not rank 0 of a group.
async fn group_lost(engine: &crate::engine::Engine) -> String {
    let Some(group) = engine.group() else {
        return std::future::pending().await;
    };
    let mut lost_since = None;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match group.lost() {
            Some(why) => {
                let since: &mut Instant = lost_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GROUP_LOST_GRACE {
                    return why;
                }
            }
            None => lost_since = None,
        }
    }
}

impl LogprobEntry {
    fn new(tokenizer: &tokenizer::Tokenizer, id: u32, lp: &TokenLogprobs) -> LogprobEntry {
        let token = token_text(tokenizer, id);
        LogprobEntry {
            bytes: token.clone().into_bytes(),
            token,
            logprob: lp.logprob,
            top_logprobs: lp
                .top
                .iter()
                .map(|&(tid, logprob)| {
                    let token = token_text(tokenizer, tid);
                    TopLogprob {
                        bytes: token.clone().into_bytes(),
                        token,
                        logprob,
                    }
                })
                .collect(),
        }
    }
}

fn token_text(tokenizer: &tokenizer::Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// How the output ended, for the parser's last word.
#[derive(Clone, Copy)]
enum End {
    Finished,
    CutOff,
}

/// Token ids in, user-facing outputs out: detokenize, hold back stop strings, parse.
struct TextPipeline<'t> {
    detokenizer: Detokenizer<'t>,
    stops: StopMatcher,
    parser: Option<OutputParser>,
    /// Logprobs of tokens whose text has not been released yet.
    pending: Vec<LogprobEntry>,
}

impl<'t> TextPipeline<'t> {
    fn new(
        tokenizer: &'t tokenizer::Tokenizer,
        stops: &[String],
        parser: Option<ParserConfig>,
    ) -> Self {
        TextPipeline {
            detokenizer: Detokenizer::new(tokenizer, true),
            stops: StopMatcher::new(stops.iter().cloned()),
            parser: parser.map(OutputParser::new),
            pending: Vec::new(),
        }
    }

    /// Feeds one token; returns the outputs it releases and the stop string that matched.
    fn push(&mut self, id: u32, logprobs: Option<LogprobEntry>) -> (Vec<Output>, Option<String>) {
        self.pending.extend(logprobs);
        let piece = match self.detokenizer.push(id) {
            Ok(piece) => piece,
            Err(e) => return (vec![Output::Error(format!("detokenizing: {e}"))], None),
        };
        let released = self.stops.push(&piece);
        (self.parse(&released.text, None), released.stopped)
    }

    /// Flushes everything held back at the end of generation; `cut_off` when a limit ended it
    /// (a tool call left unfinished is then dropped, see [`OutputParser::finish_cut_off`]).
    fn finish(&mut self, cut_off: bool) -> Vec<Output> {
        let mut text = String::new();
        if !self.stops.is_stopped() {
            if let Ok(tail) = self.detokenizer.finish() {
                text.push_str(&self.stops.push(&tail).text);
            }
            text.push_str(&self.stops.finish().text);
        }
        let end = if cut_off { End::CutOff } else { End::Finished };
        self.parse(&text, Some(end))
    }

    fn parse(&mut self, text: &str, end: Option<End>) -> Vec<Output> {
        let events = match &mut self.parser {
            Some(parser) => {
                let mut events = parser.push(text);
                match end {
                    Some(End::Finished) => events.extend(parser.finish()),
                    Some(End::CutOff) => events.extend(parser.finish_cut_off()),
                    None => {}
                }
                events
            }
            None if text.is_empty() => Vec::new(),
            None => vec![ParserEvent::Content(text.to_string())],
        };
        let mut outputs = Vec::with_capacity(events.len());
        for event in events {
            outputs.push(match event {
                ParserEvent::Content(c) => Output::Content(c, std::mem::take(&mut self.pending)),
                ParserEvent::Thinking(t) => Output::Thinking(t),
                ParserEvent::ToolCall(call) => Output::ToolCall(call),
                ParserEvent::Error(e) => Output::Error(e),
            });
        }
        outputs
    }
}
