//! The front door: accepting connections and speaking HTTP/1.1 and HTTP/2 on them within the
//! [`ConnectionLimits`]. `axum::serve` sets no limits, and hyper's own header timeout covers
//! HTTP/1 only once the protocol is known: a socket that sent nothing, or only HTTP/2's
//! preface, or a body a byte at a time, held a task and a file descriptor forever.
//!
//! Each connection is watched by what it is doing, not by its bytes: with no request in
//! progress it is closed after the header timeout (before its first request) or the idle
//! timeout (after one); a request's body must arrive within the body timeout; a response in
//! progress, a generation streaming for minutes included, is never cut. Past the connection
//! cap the connection idle longest makes room; only when every connection has a request in
//! progress is a newcomer answered 503.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::server::body_deadline::DeadlineBody;
use crate::server::connections::{Connection, Connections, Registration, RequestInProgress};
pub use crate::server::limits::ConnectionLimits;

/// How long a connection asked to close (the server stopping, or room needed) gets once its
/// requests in progress are answered, and how long a closed idle one gets to say goodbye.
const CLOSING_GRACE: Duration = Duration::from_secs(1);

/// How long the generations ended at a stop get to send their error event.
const ENDED_GENERATIONS_GRACE: Duration = Duration::from_secs(2);

/// File descriptors kept free below the point where accepting failed: the connection cap
/// drops to that many fewer connections than were open then.
const DESCRIPTOR_HEADROOM: usize = 32;

/// The fewest connections the cap drops to for want of file descriptors.
const MIN_CAP: usize = 16;

/// How long a refused newcomer may take to send the request its 503 answers.
const REFUSAL_BUDGET: Duration = Duration::from_secs(2);

/// Connections the kernel may hold completed for `accept` (it caps this at `somaxconn`). The
/// standard library's 128 overflowed under a flood of connects whenever the accept loop was
/// held up for a few milliseconds, and each dropped handshake cost its client a one-second
/// retry.
const BACKLOG: u32 = 4096;

/// A listener on `address` (`host:port`, a name resolved first) with a deep backlog.
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    let mut last_error = None;
    for resolved in tokio::net::lookup_host(address).await? {
        let socket = if resolved.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As the standard library's bind does: a restart may take the port while connections
        // of the previous process linger in TIME_WAIT.
        #[cfg(unix)]
        socket.set_reuseaddr(true)?;
        match socket.bind(resolved).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("`{address}` names no address"),
        )
    }))
}

/// Serves `app` on `listener` with the default [`ConnectionLimits`] until `shutdown` resolves,
/// then drains as [`serve_with`] does.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, app, ConnectionLimits::default(), shutdown, || {}).await
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves. Then it stops
/// accepting, lets every request in progress finish for up to `limits.shutdown_grace`, calls
/// `overdue` if some are still running (to end them with an error of their own), gives those
/// a moment to send it, and returns.
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    overdue: impl FnOnce(),
) -> std::io::Result<()> {
    // No hyper timer: the watch on each connection bounds header reads for both protocols.
    let builder = Arc::new(auto::Builder::new(TokioExecutor::new()));
    let connections = Arc::new(Connections::default());
    let mut resource_warning = RateLimitedWarning::default();
    let mut cap = limits.max_connections;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) if out_of_resources(&e) => {
                    // Out of file descriptors (or memory): from now on keep fewer connections
                    // than this, so that making room happens before the next failure; free
                    // one now by closing the connection idle longest; and wait a little
                    // rather than spin on the error. The caller still in the backlog is
                    // accepted next time round.
                    let open = connections.len();
                    let lowered = open.saturating_sub(DESCRIPTOR_HEADROOM).max(MIN_CAP);
                    if lowered < cap {
                        cap = lowered;
                        tracing::warn!(
                            "accepting a connection: {e} with {open} open; keeping at most \
                             {cap} connections from now on"
                        );
                    }
                    let freed = connections.close_longest_idle();
                    if !freed {
                        resource_warning.warn(&format!(
                            "accepting a connection: {e}; all {open} open connections have a \
                             request in progress"
                        ));
                    }
                    let pause = if freed { 1 } else { 50 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    continue;
                }
                // The peer gave up before it was accepted, and the like: only that one is lost.
                Err(e) => {
                    tracing::debug!("accepting a connection: {e}");
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if connections.len() >= cap && !connections.close_longest_idle() {
            resource_warning.warn(&format!(
                "{} connections open, each with a request in progress: refusing new ones \
                 with 503 (MLXKIT_MAX_CONNECTIONS raises the cap)",
                connections.len()
            ));
            tokio::spawn(refuse(stream));
            continue;
        }
        let registration = connections.register();
        tokio::spawn(serve_connection(
            Arc::clone(&builder),
            stream,
            app.clone(),
            registration,
            limits,
        ));
    }
    drop(listener);
    drain(&connections, limits.shutdown_grace, overdue).await;
    Ok(())
}

/// Asks every connection to close once its requests are answered, and waits for them: for
/// `grace`, then (after `overdue`) a moment more.
async fn drain(connections: &Connections, grace: Duration, overdue: impl FnOnce()) {
    let open = connections.len();
    if open > 0 {
        tracing::info!("stopping: waiting up to {grace:?} for {open} open connections");
    }
    connections.close_all();
    if tokio::time::timeout(grace, connections.all_closed())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        "requests still in progress after {grace:?}; ending them ({} connections open)",
        connections.len()
    );
    overdue();
    if tokio::time::timeout(ENDED_GENERATIONS_GRACE, connections.all_closed())
        .await
        .is_err()
    {
        tracing::warn!("closing {} connections unfinished", connections.len());
    }
}

/// Serves one connection until it ends, is idle too long, or is asked to close.
async fn serve_connection(
    builder: Arc<auto::Builder<TokioExecutor>>,
    stream: TcpStream,
    app: Router,
    registration: Registration,
    limits: ConnectionLimits,
) {
    let _ = stream.set_nodelay(true);
    let connection = Arc::clone(&registration.connection);
    let service = TrackedService {
        app: TowerToHyperService::new(app),
        connection: Arc::clone(&connection),
        body_timeout: limits.body_timeout,
    };
    let served = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let why = tokio::select! {
        ended = served.as_mut() => {
            // A client that hangs up or breaks the protocol ends only its own connection.
            if let Err(e) = ended {
                tracing::debug!("connection ended: {e}");
            }
            return;
        }
        () = connection.idle_for_too_long(limits.header_timeout, limits.idle_timeout) => "idle",
        () = connection.asked_to_close() => "asked to close",
    };
    tracing::debug!("closing a connection: {why}");
    // HTTP/1 stops after the request in progress, if any; HTTP/2 sends GOAWAY and finishes
    // its open streams. A request that began as the timer fired is still answered in full.
    served.as_mut().graceful_shutdown();
    tokio::select! {
        _ = served.as_mut() => {}
        () = connection.idle_for_too_long(CLOSING_GRACE, CLOSING_GRACE) => {}
    }
    drop(registration);
}

/// Answers a connection past the cap with a 503 and closes it, within [`REFUSAL_BUDGET`].
async fn refuse(mut stream: TcpStream) {
    const BODY: &str = r#"{"error":"the server has too many connections with a request in progress; try again shortly"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(REFUSAL_BUDGET, async {
        // Read the request first: closing a socket with unread input resets it, and the
        // client would see a reset instead of the answer.
        let mut buffer = [0u8; 4096];
        let _ = stream.read(&mut buffer).await?;
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        while stream.read(&mut buffer).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// Whether an accept error means the process or system ran out of something, rather than
/// one caller giving up.
fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// A warning logged at most once a second: a flood would otherwise write one per connection.
#[derive(Default)]
struct RateLimitedWarning {
    last: Option<Instant>,
}

impl RateLimitedWarning {
    fn warn(&mut self, message: &str) {
        let now = Instant::now();
        if self
            .last
            .is_none_or(|last| now - last >= Duration::from_secs(1))
        {
            self.last = Some(now);
            tracing::warn!("{message}");
        }
    }
}

/// The router as one connection's hyper service: each request is counted as in progress on
/// its connection until its response ends, and its body gets a deadline.
#[derive(Clone)]
struct TrackedService {
    app: TowerToHyperService<Router>,
    connection: Arc<Connection>,
    body_timeout: Duration,
}

impl hyper::service::Service<Request<Incoming>> for TrackedService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_progress = self.connection.begin_request();
        let timeout = self.body_timeout;
        let request = request.map(|body| AxumBody::new(DeadlineBody::new(body, timeout)));
        let answer = hyper::service::Service::call(&self.app, request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody {
                inner: body,
                _in_progress: in_progress,
            }))
        })
    }
}

/// A response body that keeps its request counted as in progress until it is dropped.
struct TrackedBody {
    inner: AxumBody,
    _in_progress: RequestInProgress,
}

impl Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
