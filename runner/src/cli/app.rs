//! What the commands that run models share: the async runtime, the engine's settings, and the
//! server state (engine, keeper, store) that `serve`, `run` and `bench` all drive.

use std::sync::Arc;

use anyhow::{Context, Result};

use crate::cli::args::KvCacheArg;
use crate::engine::{Engine, LoopConfig};
use crate::group::rank_0::GroupLink;
use crate::model_keeper::{ModelKeeper, ResidentLimits};
use crate::model_name::ModelName;
use crate::server::AppState;
use crate::store::Store;

/// Requests admitted at once (running or queued) before the server answers 503.
const QUEUE_CAPACITY: usize = 64;

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The engine's settings from the environment, with the command line's KV cache dtype.
pub(super) fn loop_config(kv_cache: Option<KvCacheArg>) -> LoopConfig {
    LoopConfig {
        kv_storage: kv_cache.and_then(|arg| arg.0),
        ..LoopConfig::from_env()
    }
}

/// The state every API handler (and the CLI's own chat and bench) runs against: a new engine
/// under `config`, models resident within `limits`, with `default_draft` loaded beside
/// targets that name no draft model.
pub(super) fn app_state_with(
    store: Store,
    config: LoopConfig,
    limits: ResidentLimits,
    default_draft: Option<ModelName>,
    group: Option<Arc<GroupLink>>,
) -> Result<AppState> {
    if mlx::blas_is_reference() {
        tracing::warn!(
            "this build found no OpenBLAS: f32 matmuls run on {}. Rebuild with a system \
             libopenblas.so.0 or with PyPI reachable (mlx-sys installs scipy-openblas32)",
            mlx::blas_name()
        );
    }
    let mut engine = Engine::with_config(config)?;
    if let Some(group) = group {
        engine = engine.with_group(group);
    }
    let engine = Arc::new(engine);
    let keeper =
        ModelKeeper::with_limits(engine, store.clone(), QUEUE_CAPACITY, default_draft, limits);
    Ok(AppState::new(store, keeper))
}
