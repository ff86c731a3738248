//! The process's log output: human-readable lines, or one JSON object per event for log
//! pipelines (`MLXKIT_LOG_FORMAT=json`). `MLXKIT_LOG` filters (`warn` by default; `info` adds a
//! line per HTTP request and per generation).
//!
//! Events inside a request carry its id (the server's `request` span, see
//! `server::request_log`): a JSON line has it as `span.request_id`.

use std::str::FromStr;

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields (the request id).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format `{other}` is not `text` or `json`")),
        }
    }
}

/// A subscriber writing `format` to `writer`, filtered by `filter` (an `EnvFilter` directive
/// such as `info` or `runner=debug`).
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Installs the process's subscriber from `MLXKIT_LOG` and `MLXKIT_LOG_FORMAT`, writing to
/// stderr. An unknown format falls back to text, with a warning naming it.
pub fn init_from_env() {
    let filter = EnvFilter::try_from_env("MLXKIT_LOG").unwrap_or_else(|_| "warn".into());
    let format = std::env::var("MLXKIT_LOG_FORMAT").map(|value| value.parse::<LogFormat>());
    let chosen = match &format {
        Ok(Ok(format)) => *format,
        _ => LogFormat::Text,
    };
    // A second installation (a test harness with its own) keeps the first.
    let _ = tracing::subscriber::set_global_default(subscriber(chosen, filter, std::io::stderr));
    if let Ok(Err(problem)) = format {
        tracing::warn!("MLXKIT_LOG_FORMAT: {problem}; logging text");
    }
}
