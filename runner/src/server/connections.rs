//! The open connections and what each is doing: how many requests it has in progress and
//! since when it has had none. `listen` closes a connection idle for too long, and when the
//! server is at its connection cap it closes the one idle longest to make room, so a flood
//! of sockets that send nothing cannot lock out a client with a request to make.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// Every open connection, by id.
#[derive(Default)]
pub struct Connections {
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    /// Woken whenever a connection closes (for a stop waiting for the last one).
    closed: Notify,
}

/// One open connection.
pub struct Connection {
    activity: watch::Sender<Activity>,
    /// Asked to close (to make room for a new connection, or the server is stopping).
    close: Notify,
    /// Already asked to close: not a candidate to make room again.
    closing: AtomicBool,
}

/// What a connection is doing.
#[derive(Debug, Clone, Copy)]
struct Activity {
    /// Requests whose response has not ended.
    in_flight: usize,
    /// When it last had no request in progress (since it opened, or its last response ended).
    idle_since: Instant,
    /// Whether a request has been served on it.
    served: bool,
}

/// A connection's place in [`Connections`]; dropping it removes the connection.
pub struct Registration {
    connections: Arc<Connections>,
    id: u64,
    /// The connection.
    pub connection: Arc<Connection>,
}

/// A request in progress on a connection, from its headers to the end of its response (or
/// until it is abandoned); dropping it marks the end.
pub struct RequestInProgress(Arc<Connection>);

impl Connections {
    /// Adds a connection opened now.
    pub fn register(self: &Arc<Self>) -> Registration {
        let connection = Arc::new(Connection {
            activity: watch::Sender::new(Activity {
                in_flight: 0,
                idle_since: Instant::now(),
                served: false,
            }),
            close: Notify::new(),
            closing: AtomicBool::new(false),
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Arc::clone(&connection));
        Registration {
            connections: Arc::clone(self),
            id,
            connection,
        }
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks the connection idle longest (no request in progress) to close; `false` when every
    /// connection has a request in progress or is already closing.
    pub fn close_longest_idle(&self) -> bool {
        let open = self.lock();
        let longest = open
            .values()
            .filter(|c| !c.closing.load(Ordering::Relaxed))
            .filter_map(|c| {
                let activity = *c.activity.borrow();
                (activity.in_flight == 0).then_some((activity.idle_since, c))
            })
            .min_by_key(|(since, _)| *since);
        match longest {
            Some((_, connection)) => {
                connection.ask_to_close();
                true
            }
            None => false,
        }
    }

    /// Asks every connection to close once its requests in progress are answered.
    pub fn close_all(&self) {
        for connection in self.lock().values() {
            connection.ask_to_close();
        }
    }

    /// Returns once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            if self.is_empty() {
                return;
            }
            closed.await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        // The map stays consistent whatever a panicking holder was doing: each change is one
        // insert or remove.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
        self.connections.closed.notify_waiters();
    }
}

impl Connection {
    /// Marks a request as started; it ends when the returned guard is dropped.
    pub fn begin_request(self: &Arc<Self>) -> RequestInProgress {
        self.activity.send_modify(|a| a.in_flight += 1);
        RequestInProgress(Arc::clone(self))
    }

    /// Returns once the connection has had no request in progress for `header_timeout` (when
    /// it has served none yet) or `idle_timeout` (after it has).
    pub async fn idle_for_too_long(&self, header_timeout: Duration, idle_timeout: Duration) {
        let mut activity = self.activity.subscribe();
        loop {
            let now = *activity.borrow_and_update();
            if now.in_flight > 0 {
                // The sender lives as long as `self`: `changed` cannot fail here.
                let _ = activity.changed().await;
                continue;
            }
            let limit = if now.served {
                idle_timeout
            } else {
                header_timeout
            };
            tokio::select! {
                () = tokio::time::sleep_until(now.idle_since + limit) => return,
                _ = activity.changed() => {}
            }
        }
    }

    /// Returns once the connection is asked to close.
    pub async fn asked_to_close(&self) {
        self.close.notified().await;
    }

    fn ask_to_close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        // A stored permit: the connection sees it even if it is not waiting right now.
        self.close.notify_one();
    }
}

impl Drop for RequestInProgress {
    fn drop(&mut self) {
        self.0.activity.send_modify(|a| {
            a.in_flight -= 1;
            if a.in_flight == 0 {
                a.idle_since = Instant::now();
                a.served = true;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_connection_is_idle_only_without_a_request_in_progress() {
        let connections = Arc::new(Connections::default());
        let registration = connections.register();
        let connection = Arc::clone(&registration.connection);
        let (header, idle) = (Duration::from_millis(100), Duration::from_millis(300));

        // Unserved: the header timeout applies from the opening.
        let started = Instant::now();
        connection.idle_for_too_long(header, idle).await;
        assert!(started.elapsed() >= header);

        // A request in progress for longer than either timeout is never idle; after it ends
        // the idle timeout runs.
        let request = connection.begin_request();
        let watcher = tokio::spawn({
            let connection = Arc::clone(&connection);
            async move {
                connection.idle_for_too_long(header, idle).await;
                Instant::now()
            }
        });
        tokio::time::sleep(idle * 2).await;
        assert!(
            !watcher.is_finished(),
            "idle while a request was in progress"
        );
        let ended = Instant::now();
        drop(request);
        let expired = tokio::time::timeout(Duration::from_secs(30), watcher)
            .await
            .expect("the idle timeout ran out")
            .unwrap();
        assert!(expired - ended >= idle);
    }

    #[tokio::test]
    async fn the_longest_idle_connection_is_asked_to_close_first() {
        let connections = Arc::new(Connections::default());
        let oldest = connections.register();
        tokio::time::sleep(Duration::from_millis(5)).await;
        let busy_since_before = connections.register();
        let _request = busy_since_before.connection.begin_request();
        let newest = connections.register();
        assert_eq!(connections.len(), 3);

        assert!(connections.close_longest_idle());
        tokio::time::timeout(Duration::from_secs(5), oldest.connection.asked_to_close())
            .await
            .expect("the oldest idle connection was asked to close");
        // The busy one is never chosen: the newest goes next, then there is none.
        assert!(connections.close_longest_idle());
        tokio::time::timeout(Duration::from_secs(5), newest.connection.asked_to_close())
            .await
            .expect("the newest idle connection was asked to close");
        assert!(!connections.close_longest_idle());

        drop((oldest, newest, busy_since_before));
        tokio::time::timeout(Duration::from_secs(5), connections.all_closed())
            .await
            .expect("every registration dropped");
    }
}
