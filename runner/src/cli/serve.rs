//! `mlxkit serve`: the HTTP APIs on a listening socket until SIGINT or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cli::app::app_state_with;
use crate::engine::LoopConfig;
use crate::group::rank_0::GroupLink;
use crate::model_keeper::ResidentLimits;
use crate::model_name::ModelName;
use crate::store::Store;

/// Serves every API on `host` over a new engine, with `default_model` serving requests that
/// name a hosted model no stored model is called; the first stop signal drains, a second one
/// ends what still runs.
pub(super) async fn serve(
    store: Store,
    host: String,
    config: LoopConfig,
    resident: ResidentLimits,
    default_draft: Option<ModelName>,
    default_model: Option<ModelName>,
    group: Option<Arc<GroupLink>>,
) -> Result<()> {
    use crate::server::{access::Access, limits, listen, stopping};
    let limits = limits::ConnectionLimits::from_env()?;
    let mut access = Access::from_env();
    // The name the server was told to bind is one its clients use.
    access.hosts.add(
        host.rsplit_once(':')
            .map_or(host.as_str(), |(name, _)| name),
    );
    let max_output_tokens = crate::server::output_limit::from_env()?;
    let state = app_state_with(store, config, resident, default_draft, group)?
        .with_max_output_tokens(max_output_tokens)
        .with_default_model(default_model);
    let open_files = limits::raise_open_file_limit();
    let listener = listen::bind(&host)
        .await
        .with_context(|| format!("listening on {host}"))?;
    let address = listener.local_addr()?;
    eprintln!(
        "mlxkit {} listening on {address}",
        env!("CARGO_PKG_VERSION"),
    );
    if !address.ip().is_loopback() && access.api_key.is_none() {
        tracing::warn!(
            "listening on {address}, beyond this machine, with no API key: anyone who can reach \
             it can run and change models (set MLXKIT_API_KEY to require a key)"
        );
        eprintln!(
            "warning: the API on {address} is unauthenticated; set MLXKIT_API_KEY to require a key"
        );
    }
    if let Some(open_files) = open_files
        && (open_files as usize) < limits.max_connections + 64
    {
        tracing::warn!(
            "this process may open {open_files} files, fewer than {} connections need: past \
             that, idle connections are closed to make room",
            limits.max_connections
        );
    }
    // The first SIGINT or SIGTERM drains; a second one ends what is still running at once.
    let signals = stop_signals()?;
    let mut first = signals.clone();
    let mut second = signals;
    let serving = listen::serve_with(
        listener,
        crate::server::router_with(state, access),
        limits,
        async move {
            let _ = first.wait_for(|&n| n >= 1).await;
        },
        stopping::end_generations,
    );
    tokio::select! {
        served = serving => served.context("serving"),
        _ = second.wait_for(|&n| n >= 2) => {
            eprintln!("stopping now");
            stopping::end_generations();
            // A moment for the error events to leave.
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok(())
        }
    }
}

/// Counts the stop signals received (SIGINT, and SIGTERM where there is one), from now on.
fn stop_signals() -> Result<tokio::sync::watch::Receiver<u32>> {
    let (count, received) = tokio::sync::watch::channel(0u32);
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::spawn(async move {
        loop {
            #[cfg(unix)]
            let signal = tokio::select! {
                interrupt = tokio::signal::ctrl_c() => interrupt.map(|()| "SIGINT"),
                _ = terminate.recv() => Ok("SIGTERM"),
            };
            #[cfg(not(unix))]
            let signal = tokio::signal::ctrl_c().await.map(|()| "Ctrl-C");
            let Ok(signal) = signal else { return };
            count.send_modify(|n| *n += 1);
            let n = *count.borrow();
            if n == 1 {
                eprintln!("{signal}: finishing requests in progress (again to stop at once)");
            }
        }
    });
    Ok(received)
}
