//! Operations metrics, rendered in Prometheus' text format at `GET /metrics` by
//! `metrics-exporter-prometheus`.
//!
//! Counted as they happen: requests by route, method and status; prompt tokens evaluated and
//! served from the prefix cache; generated tokens; images decoded; speculative tokens drafted
//! and accepted.
//! Timed: time to first token and the gap between tokens (histograms). Read at each scrape:
//! per resident model, queue depth, running and prefilling sequences, weights and reserved KV
//! bytes, the prefix cache's bytes and nodes; MLX's active and peak memory.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{Label, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::engine::{LoopStatus, Stats};
use crate::model_keeper::RunningModel;
use crate::server::AppState;
use crate::server::error::ApiError;

/// Bucket bounds for latencies, in seconds: from a fast CPU token (5 ms) to a long prefill.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The process's recorder, installed on first use. `None` when another recorder was installed
/// first (a program embedding the router with its own): metrics then go there.
pub fn handle() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let installed = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!("metrics are not exported: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// The `# HELP` lines.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "mlxkit_http_requests_total",
        "HTTP responses by route pattern, method and status"
    );
    describe_counter!(
        "mlxkit_prompt_tokens_total",
        "Prompt tokens evaluated (not served from the prefix cache)"
    );
    describe_counter!(
        "mlxkit_prompt_cached_tokens_total",
        "Prompt tokens served from the prefix cache"
    );
    describe_counter!("mlxkit_generated_tokens_total", "Tokens generated");
    describe_counter!(
        "mlxkit_images_decoded_total",
        "Images decoded and preprocessed (not those whose encoded features were kept)"
    );
    describe_counter!(
        "mlxkit_speculation_drafted_tokens_total",
        "Draft tokens verified by speculative decoding"
    );
    describe_counter!(
        "mlxkit_speculation_accepted_tokens_total",
        "Draft tokens accepted by speculative decoding"
    );
    describe_histogram!(
        "mlxkit_time_to_first_token_seconds",
        metrics::Unit::Seconds,
        "From a request's arrival to its first generated token"
    );
    describe_histogram!(
        "mlxkit_inter_token_seconds",
        metrics::Unit::Seconds,
        "Between consecutive tokens of one request"
    );
    describe_gauge!("mlxkit_queued_requests", "Requests waiting for admission");
    describe_gauge!(
        "mlxkit_running_sequences",
        "Sequences admitted and not yet finished"
    );
    describe_gauge!("mlxkit_prefilling_sequences", "Of those, still prefilling");
    describe_gauge!("mlxkit_prefix_cache_bytes", "Bytes the prefix cache holds");
    describe_gauge!(
        "mlxkit_prefix_cache_budget_bytes",
        "The prefix cache's budget"
    );
    describe_gauge!("mlxkit_prefix_cache_nodes", "Nodes of the prefix trie");
    describe_gauge!("mlxkit_mlx_active_memory_bytes", "MLX's active memory");
    describe_gauge!("mlxkit_mlx_peak_memory_bytes", "MLX's peak memory");
    describe_gauge!(
        "mlxkit_group_ranks",
        "Processes of the group models are split across (`serve --hostfile`)"
    );
    describe_gauge!(
        "mlxkit_group_serving",
        "1 while the group serves, 0 once it lost a rank (until it re-forms)"
    );
}

/// Middleware counting every response by route (the pattern, never the raw path, so the
/// label set stays bounded), method and status.
pub async fn count_requests(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    counter!("mlxkit_http_requests_total", "route" => route, "method" => method, "status" => status)
        .increment(1);
    response
}

/// One generation's timers and counters, looked up in the registry once per request rather
/// than once per token.
pub struct RequestMetrics {
    model: String,
    first_token: metrics::Histogram,
    inter_token: metrics::Histogram,
}

impl RequestMetrics {
    /// The metrics of a generation on `model`.
    pub fn new(model: &str) -> Self {
        let label = || vec![Label::new("model", model.to_string())];
        Self {
            model: model.to_string(),
            first_token: histogram!("mlxkit_time_to_first_token_seconds", label()),
            inter_token: histogram!("mlxkit_inter_token_seconds", label()),
        }
    }

    /// The first token came `after` the request's arrival.
    pub fn first_token(&self, after: Duration) {
        self.first_token.record(after.as_secs_f64());
    }

    /// A token came `gap` after the previous one.
    pub fn next_token(&self, gap: Duration) {
        self.inter_token.record(gap.as_secs_f64());
    }

    /// The generation finished with `stats`.
    pub fn finished(&self, stats: &Stats) {
        let label = || vec![Label::new("model", self.model.clone())];
        let evaluated = stats.prompt_tokens.saturating_sub(stats.cached_tokens);
        counter!("mlxkit_prompt_tokens_total", label()).increment(evaluated as u64);
        counter!("mlxkit_prompt_cached_tokens_total", label())
            .increment(stats.cached_tokens as u64);
        counter!("mlxkit_generated_tokens_total", label()).increment(stats.generated_tokens as u64);
        if let Some(spec) = &stats.speculation {
            counter!("mlxkit_speculation_drafted_tokens_total", label())
                .increment(spec.drafted as u64);
            counter!("mlxkit_speculation_accepted_tokens_total", label())
                .increment(spec.accepted as u64);
        }
    }
}

/// One resident model's gauges, labelled with its name.
fn set_model_gauges(name: &str, weights_bytes: usize, status: &LoopStatus) {
    let label = || vec![Label::new("model", name.to_string())];
    gauge!("mlxkit_queued_requests", label()).set(status.queued as f64);
    gauge!("mlxkit_running_sequences", label()).set(status.running as f64);
    gauge!("mlxkit_prefilling_sequences", label()).set(status.prefilling as f64);
    gauge!("mlxkit_weights_bytes", label()).set(weights_bytes as f64);
    gauge!("mlxkit_kv_reserved_bytes", label()).set(status.kv_reserved as f64);
    gauge!("mlxkit_prefix_cache_bytes", label()).set(status.cache_bytes as f64);
    gauge!("mlxkit_prefix_cache_budget_bytes", label()).set(status.cache_budget as f64);
    gauge!("mlxkit_prefix_cache_nodes", label()).set(status.cache_nodes as f64);
}

/// Every resident model's gauges; a model whose gauges were set and is no longer resident
/// reads 0, not its last values.
fn set_resident_gauges(state: &AppState, resident: Vec<RunningModel>) {
    static GAUGED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let mut gauged = GAUGED.lock().unwrap_or_else(PoisonError::into_inner);
    let mut stale = std::mem::take(&mut *gauged);
    for running in resident {
        let name = running.info.name.to_string();
        stale.remove(&name);
        let status = state.keeper.engine().status(running.slot);
        set_model_gauges(&name, running.weights_bytes, &status);
        gauged.insert(name);
    }
    for name in stale {
        set_model_gauges(&name, 0, &LoopStatus::default());
    }
}

/// `GET /metrics`.
pub async fn render(State(state): State<AppState>) -> Result<Response, ApiError> {
    let handle = handle().ok_or_else(|| {
        ApiError::internal("another metrics recorder was installed; /metrics has nothing to show")
    })?;
    let resident = state.keeper.running().await;
    set_resident_gauges(&state, resident);
    if let Ok((active, peak)) = state.keeper.engine().memory().await {
        gauge!("mlxkit_mlx_active_memory_bytes").set(active as f64);
        gauge!("mlxkit_mlx_peak_memory_bytes").set(peak as f64);
    }
    if let Some(group) = state.keeper.engine().group() {
        gauge!("mlxkit_group_ranks").set(group.size() as f64);
        gauge!("mlxkit_group_serving").set(if group.lost().is_none() { 1.0 } else { 0.0 });
    }
    handle.run_upkeep();
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}
