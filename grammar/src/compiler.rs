//! Compiling specs into matchers, with two caches: one parser factory per tokenizer for the
//! whole process (building it walks the vocabulary, ≈0.2 s), and per tokenizer the compiled
//! form of recent grammars (a repeated schema, such as a client's fixed tool set, costs a
//! clone instead of a compile).

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::{Value, json};

use crate::compile_thread::run_with_deadline;
use crate::error::compiler_message;
use crate::grammar::Grammar;
use crate::spec::{GrammarSpec, Limits};
use crate::{Error, Result, token_env};

/// Whitespace the JSON grammars allow between tokens: at most 32 characters per gap (enough
/// for pretty-printing 15 levels deep). An unbounded gap lets a model loop on newlines forever
/// while the grammar stays satisfied.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{1,32}";

/// Whitespace a tool call allows around its JSON and between calls: a space or a newline or
/// two, as chat templates write them. Inside the JSON there is none beyond the separators
/// (`TOOL_CALL_JSON`): free whitespace runs are where a small model forced to call wanders
/// off (issue 48).
const TOOL_CALL_WHITESPACE: &str = r"[\x20\x0A]{1,2}";

/// How many compiled grammars each tokenizer keeps.
const COMPILED_CACHE_ENTRIES: usize = 128;

/// Compiles grammars for one tokenizer. Cheap to create once the tokenizer has been seen:
/// the factory is shared process-wide.
pub struct GrammarCompiler {
    shared: Arc<Shared>,
    limits: Limits,
}

/// What every compiler of the same tokenizer shares.
struct Shared {
    factory: ParserFactory,
    compiled: Mutex<CompiledCache>,
    ends: Arc<[u32]>,
    vocab_size: usize,
}

impl GrammarCompiler {
    /// A compiler for `tokenizer` with the default [`Limits`].
    pub fn new(tokenizer: &tokenizer::Tokenizer) -> Result<Self> {
        Ok(Self {
            shared: shared_for(tokenizer)?,
            limits: Limits::default(),
        })
    }

    /// Replaces the caps on schema size and nesting.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Tokens in the vocabulary the masks cover (`mask().len() == vocab_size().div_ceil(32)`).
    pub fn vocab_size(&self) -> usize {
        self.shared.vocab_size
    }

    /// The tokens that end generation; a mask allows them exactly when the output is complete.
    pub fn end_tokens(&self) -> &[u32] {
        &self.shared.ends
    }

    /// Compiles `spec` into a fresh matcher at the start of the output, within
    /// [`Limits::max_compile_time`].
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar> {
        spec.check(&self.limits)?;
        let key = cache_key(spec)?;
        let shared = Arc::clone(&self.shared);
        let spec = spec.clone();
        run_with_deadline(self.limits.max_compile_time, move || {
            start(&shared, &spec, key)
        })
    }
}

/// The compiled form of `spec` (from the cache under `key`, else compiled and cached), and
/// a matcher at its start with the first mask computed: the costliest one (the lexer starts
/// cold), kept off the step loop, and where a grammar with no complete sentence shows itself.
fn start(shared: &Shared, spec: &GrammarSpec, key: String) -> Result<Grammar> {
    let cached = lock(&shared.compiled).get(&key);
    let parser = match cached {
        Some(parser) => parser,
        None => {
            let grammar = top_level(spec, shared)?;
            let parser = shared
                .factory
                .create_parser(grammar)
                .map_err(|e| compile_error(spec, &e.to_string()))?;
            lock(&shared.compiled).insert(key, parser.clone());
            parser
        }
    };
    let matcher = Matcher::new(Ok(parser));
    if let Some(message) = matcher.get_error() {
        return Err(compile_error(spec, &message));
    }
    Grammar::start(matcher, shared.vocab_size, shared.ends.clone())
        .map_err(|e| first_mask_error(spec, e))
}

/// The llguidance form of a spec.
fn top_level(spec: &GrammarSpec, shared: &Shared) -> Result<TopLevelGrammar> {
    Ok(match spec {
        GrammarSpec::JsonObject => {
            TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"})))
        }
        GrammarSpec::JsonSchema(schema) => {
            TopLevelGrammar::from_json_schema(with_json_options(schema.clone()))
        }
        GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        GrammarSpec::AfterThinking {
            open,
            close,
            already_open,
            then,
        } => TopLevelGrammar::from_lark(thinking_lark(open, close, *already_open, then, shared)?),
        GrammarSpec::ToolCalls {
            open,
            close,
            calls,
            required,
            parallel,
        } => TopLevelGrammar::from_lark(tool_calls_lark(
            open, close, calls, *required, *parallel, shared,
        )),
    })
}

/// A Lark grammar: the region's text is one lazy lexeme that ends at the first `close`, so
/// the region cannot hold its own closing marker; then optional whitespace and the body.
fn thinking_lark(
    open: &str,
    close: &str,
    already_open: bool,
    then: &GrammarSpec,
    shared: &Shared,
) -> Result<String> {
    let body = match then {
        GrammarSpec::JsonObject => {
            format!("%json {}", with_json_options(json!({"type": "object"})))
        }
        GrammarSpec::JsonSchema(schema) => {
            format!("%json {}", with_json_options(schema.clone()))
        }
        GrammarSpec::Regex(rx) => format!("/{}/", llguidance::regex_to_lark(rx, "")),
        GrammarSpec::Lark(_)
        | GrammarSpec::AfterThinking { .. }
        | GrammarSpec::ToolCalls { .. } => {
            return Err(Error::Unsupported(
                "a thinking region can precede JSON or a regex; write it into the Lark grammar \
                 itself instead"
                    .to_string(),
            ));
        }
    };
    let open_rule = match special_token(shared, open) {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(open),
    };
    let region = match special_token(shared, close) {
        Some(id) => format!("/(?s:.*)/ <[{id}]>"),
        None => format!(
            "thought\nthought[lazy]: /(?s:.*){}/",
            llguidance::regex_to_lark(&regex_escape(close), "")
        ),
    };
    let start = if already_open {
        "start: region WS? body"
    } else {
        "start: open region WS? body"
    };
    Ok(format!(
        "{start}\nopen: {open_rule}\nregion: {region}\nWS: /{JSON_WHITESPACE}/\nbody: {body}\n"
    ))
}

/// A Lark grammar: free text up to the first `open` (a lazy lexeme), or free text that never
/// contains `open` at all; then calls separated by whitespace, each body one of the schemas.
/// A required call comes first, with no text or whitespace before it: a model allowed a
/// preamble can ramble until its budget runs out without ever calling, and whitespace alone
/// before a call would reach the client as an empty text part. Without `parallel`, one call ends
/// the output.
fn tool_calls_lark(
    open: &str,
    close: &str,
    calls: &[Value],
    required: bool,
    parallel: bool,
    shared: &Shared,
) -> String {
    // Each call schema is a root of its own; under `anyOf` its local references must say so.
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let mut call = call.clone();
            crate::schema_shape::rebase_refs(&mut call, &format!("/anyOf/{i}"));
            call
        })
        .collect();
    let body = with_tool_call_json_options(json!({ "anyOf": calls }));
    let (lead, plain, open_rule) = match special_token(shared, open) {
        // Special tokens never occur inside text, so text needs no exclusion.
        Some(id) => (
            format!("/(?s:.*)/ <[{id}]>"),
            "/(?s:.*)/".to_string(),
            format!("<[{id}]>"),
        ),
        None => {
            let open_rx = llguidance::regex_to_lark(&regex_escape(open), "");
            (
                format!("lead_text\nlead_text[lazy]: /(?s:.*){open_rx}/"),
                format!("/(?s:.*)/ & ~/(?s:.*){open_rx}(?s:.*)/"),
                lark_string(open),
            )
        }
    };
    let close_rule = match special_token(shared, close) {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(close),
    };
    let start = if required {
        "start: open call_rest more_calls"
    } else {
        "start: PLAIN | with_calls"
    };
    let more_calls = if parallel {
        "(WS? open call_rest)* WS?"
    } else {
        "WS?"
    };
    format!(
        "{start}\nwith_calls: lead call_rest more_calls\nmore_calls: {more_calls}\nlead: {lead}\n\
         PLAIN: {plain}\nopen: {open_rule}\ncall_rest: WS? body WS? {close_rule}\n\
         WS: /{TOOL_CALL_WHITESPACE}/\nbody: %json {body}\n"
    )
}

/// The id of `marker` when the vocabulary holds it as a special token; such markers are
/// matched as that token, others as text.
fn special_token(shared: &Shared, marker: &str) -> Option<u32> {
    let mut bytes = vec![toktrie::TokTrie::SPECIAL_TOKEN_MARKER];
    bytes.extend_from_slice(marker.as_bytes());
    shared
        .factory
        .tok_env()
        .tok_trie()
        .token_id_at_bytes(&bytes)
}

/// `text` as a Lark string literal (JSON string syntax is a subset Lark accepts).
fn lark_string(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// `text` as a regex matching itself literally.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Our JSON compile options ride in the schema's `x-guidance` field; they replace any the
/// client sent, so the whitespace bound always holds.
fn with_json_options(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".to_string(),
            json!({ "whitespace_pattern": JSON_WHITESPACE }),
        );
    }
    schema
}

/// A call's JSON is written one way, as templates render calls and `json.dumps` writes
/// them: `{"name": "f", "arguments": {"a": 1}}`, no other whitespace. Replaces any options
/// the client sent.
fn with_tool_call_json_options(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.insert(
            "x-guidance".to_string(),
            json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " }),
        );
    }
    schema
}

/// Sorts a compiler message into "unsupported" (the input is valid but uses a feature the
/// compiler lacks, such as `oneOf`) and "invalid", keeping only its part meant for people.
fn compile_error(spec: &GrammarSpec, raw: &str) -> Error {
    let message = compiler_message(raw);
    let lower = message.to_ascii_lowercase();
    if lower.contains("not supported")
        || lower.contains("unsupported")
        || lower.contains("unimplemented")
    {
        Error::Unsupported(format!("{}: {message}", spec.kind()))
    } else {
        Error::Invalid {
            kind: spec.kind(),
            message,
        }
    }
}

/// Why the first mask of a fresh grammar could not be computed: no token can start it (the
/// grammar has no complete sentence), or it needs more work than the parser's limits allow.
fn first_mask_error(spec: &GrammarSpec, error: Error) -> Error {
    let message = match error {
        Error::Matcher(message) => message,
        other => return other,
    };
    if message.starts_with("NoExtension") {
        Error::Unsatisfiable {
            kind: spec.kind(),
            reason: "no token can begin a valid output".to_string(),
        }
    } else {
        Error::Invalid {
            kind: spec.kind(),
            message: format!("its first token cannot be computed: {message}"),
        }
    }
}

fn cache_key(spec: &GrammarSpec) -> Result<String> {
    Ok(match spec {
        GrammarSpec::ToolCalls {
            open,
            close,
            calls,
            required,
            parallel,
        } => format!(
            "tools:{}:{}:{required}:{parallel}:{}",
            lark_string(open),
            lark_string(close),
            Value::Array(calls.clone())
        ),
        GrammarSpec::AfterThinking {
            open,
            close,
            already_open,
            then,
        } => format!(
            "thinking:{}:{}:{already_open}:{}",
            lark_string(open),
            lark_string(close),
            cache_key(then)?
        ),
        GrammarSpec::JsonObject => "object".to_string(),
        GrammarSpec::JsonSchema(schema) => {
            let text = serde_json::to_string(schema).map_err(|e| Error::Invalid {
                kind: spec.kind(),
                message: e.to_string(),
            })?;
            format!("schema:{text}")
        }
        GrammarSpec::Regex(rx) => format!("regex:{rx}"),
        GrammarSpec::Lark(text) => format!("lark:{text}"),
    })
}

/// Recently compiled parsers, oldest evicted first.
#[derive(Default)]
struct CompiledCache {
    parsers: HashMap<String, TokenParser>,
    order: VecDeque<String>,
}

impl CompiledCache {
    fn get(&self, key: &str) -> Option<TokenParser> {
        self.parsers.get(key).cloned()
    }

    fn insert(&mut self, key: String, parser: TokenParser) {
        if self.parsers.contains_key(&key) {
            return;
        }
        while self.order.len() >= COMPILED_CACHE_ENTRIES {
            if let Some(oldest) = self.order.pop_front() {
                self.parsers.remove(&oldest);
            }
        }
        self.order.push_back(key.clone());
        self.parsers.insert(key, parser);
    }
}

/// A poisoned lock only means another request panicked mid-insert; the cache is still a
/// valid map, so keep using it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process-wide state for `tokenizer`, keyed by a hash of its serialized form and end
/// tokens, so two loads of the same vocabulary share one factory.
///
/// The table holds its states weakly: a factory lives as long as some compiler of its
/// vocabulary does, so a server that unloads a model frees its factory (tens of MB for a
/// 262k-token vocabulary) with it.
fn shared_for(tokenizer: &tokenizer::Tokenizer) -> Result<Arc<Shared>> {
    static BY_TOKENIZER: OnceLock<Mutex<HashMap<u64, Weak<Shared>>>> = OnceLock::new();
    let json = tokenizer
        .hf()
        .to_string(false)
        .map_err(|e| Error::Vocabulary(format!("cannot serialize the tokenizer: {e}")))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    json.hash(&mut hasher);
    tokenizer.stop_tokens().hash(&mut hasher);
    tokenizer.vocab_size().hash(&mut hasher);
    let key = hasher.finish();

    let table = BY_TOKENIZER.get_or_init(Default::default);
    if let Some(shared) = lock(table).get(&key).and_then(Weak::upgrade) {
        return Ok(shared);
    }
    // Built outside the lock: another tokenizer's requests need not wait ≈0.2 s.
    let env = token_env::build(tokenizer, &json)?;
    let mut factory = ParserFactory::new_simple(&env)
        .map_err(|e| Error::Vocabulary(format!("grammar factory: {e}")))?;
    factory.quiet();
    // Verbose errors append the parser's state and the whole grammar to every message; those
    // messages reach clients.
    factory.limits_mut().verbose_errors = false;
    let trie = env.tok_trie();
    let shared = Arc::new(Shared {
        ends: trie.eos_tokens().into(),
        vocab_size: trie.vocab_size(),
        factory,
        compiled: Mutex::default(),
    });
    let mut table = lock(table);
    table.retain(|_, state| state.strong_count() > 0);
    // Another request may have built the same state meanwhile: keep the first.
    if let Some(built) = table.get(&key).and_then(Weak::upgrade) {
        return Ok(built);
    }
    table.insert(key, Arc::downgrade(&shared));
    Ok(shared)
}
