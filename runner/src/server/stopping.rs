//! The process is stopping: generations still running once the drain's grace has passed end
//! with an error event of their own, rather than a stream cut mid-answer when the process
//! exits. Process-wide, as the signals that start a stop are.

use std::sync::LazyLock;

use tokio::sync::watch;

static STOPPING: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::Sender::new(false));

/// What a generation ended by a stop says to its client.
pub const STOPPED_MESSAGE: &str = "the server is stopping; the generation was ended early";

/// Ends every generation in progress (and any started later) with [`STOPPED_MESSAGE`].
pub fn end_generations() {
    STOPPING.send_replace(true);
}

/// Returns once [`end_generations`] has been called.
pub async fn generations_ended() {
    let mut stopping = STOPPING.subscribe();
    // The sender is a static: it is never dropped, so `wait_for` cannot fail.
    let _ = stopping.wait_for(|&stopping| stopping).await;
}
