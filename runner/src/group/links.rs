//! Rank 0's control connections to its workers ([`Links`]): accepting them as they join,
//! telling every worker the same thing, gathering their answers, and noticing the first that
//! leaves.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::group::control::{Channel, SILENT_WORKER, ToLeader, ToWorker, send_on};
use crate::group::hostfile::Hostfile;

/// How long a worker's word that the group broke under it waits before it is taken as the
/// reason: MLX's ring notices a peer gone within milliseconds, and the watcher of the rank
/// that went sees its connection close about as soon.
const BROKE_AFTER_ANOTHER: Duration = Duration::from_secs(1);

/// Rank 0's connections to ranks `1..size`.
pub struct Links {
    /// Rank `r`'s sending side at `r - 1`.
    senders: Mutex<Vec<TcpStream>>,
    replies: Mutex<Receiver<(usize, ToLeader)>>,
    /// Why the group cannot serve, once a worker has left it.
    lost: Arc<Mutex<Option<String>>>,
    size: usize,
}

/// How long rank 0 waits for its workers to join.
pub enum JoinWait<'a> {
    /// At start: up to this long, then an error naming the ranks still missing.
    For(Duration),
    /// Re-forming: for as long as this says the group is still wanted (an error once not).
    While(&'a dyn Fn() -> bool),
}

/// Rank 0's listener for its workers' control connections, on the hostfile's control address.
pub fn listen(hostfile: &Hostfile) -> Result<TcpListener, String> {
    let address = hostfile.control()?;
    let listener = TcpListener::bind(address)
        .map_err(|e| format!("listening for workers on {address}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening for workers on {address}: {e}"))?;
    Ok(listener)
}

impl Links {
    /// Takes joins on `listener` until every worker of `hostfile` has joined, then tells them
    /// to form the group; how long it waits, `wait` says.
    pub fn accept(
        listener: &TcpListener,
        hostfile: &Hostfile,
        wait: JoinWait<'_>,
    ) -> Result<Links, String> {
        let size = hostfile.size();
        let mut joined: Vec<Option<Channel>> = (1..size).map(|_| None).collect();
        let started = Instant::now();
        while joined.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((stream, peer)) => {
                    if let Err(e) = admit(stream, peer, &mut joined) {
                        tracing::warn!("refused a worker from {peer}: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let missing = || -> String {
                        let ranks: Vec<String> = joined
                            .iter()
                            .enumerate()
                            .filter(|(_, c)| c.is_none())
                            .map(|(i, _)| describe(hostfile, i + 1))
                            .collect();
                        ranks.join(", ")
                    };
                    match wait {
                        JoinWait::For(timeout) if started.elapsed() >= timeout => {
                            return Err(format!(
                                "no worker joined as {} within {} s (start `mlxkit worker` \
                                 there with the same hostfile)",
                                missing(),
                                timeout.as_secs()
                            ));
                        }
                        JoinWait::While(wanted) if !wanted() => {
                            return Err(format!("stopped waiting for {}", missing()));
                        }
                        _ => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                Err(e) => return Err(format!("accepting workers: {e}")),
            }
        }
        let lost = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let mut senders = Vec::with_capacity(size - 1);
        for (i, channel) in joined.into_iter().flatten().enumerate() {
            let rank = i + 1;
            senders.push(channel.sender().map_err(|e| e.to_string())?);
            watch(
                channel,
                rank,
                describe(hostfile, rank),
                tx.clone(),
                Arc::clone(&lost),
            );
        }
        let links = Links {
            senders: Mutex::new(senders),
            replies: Mutex::new(rx),
            lost,
            size,
        };
        links.tell(&ToWorker::FormGroup)?;
        Ok(links)
    }

    /// How many processes the group holds.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Why the group cannot serve, once a worker has left it.
    pub fn lost(&self) -> Option<String> {
        lock(&self.lost).clone()
    }

    /// Why the group cannot serve, waiting up to `wait` for a worker's departure to be
    /// noticed; `None` when every worker is still there.
    pub fn lost_within(&self, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(lost) = self.lost() {
                return Some(lost);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Tells every worker still connected `message`, whether or not the group is lost.
    pub fn tell_each(&self, message: &ToWorker) {
        for sender in lock(&self.senders).iter_mut() {
            let _ = send_on(sender, message);
        }
    }

    /// Tells every worker `message`; an error (and the group lost) when one cannot be told.
    pub fn tell(&self, message: &ToWorker) -> Result<(), String> {
        if let Some(lost) = self.lost() {
            return Err(lost);
        }
        let mut senders = lock(&self.senders);
        for (i, sender) in senders.iter_mut().enumerate() {
            if let Err(e) = send_on(sender, message) {
                let why = format!("rank {} left the group: {e}", i + 1);
                lock(&self.lost).get_or_insert(why.clone());
                return Err(why);
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for every worker to answer that it loaded what it was told; the
    /// first refusal, a worker leaving or the time running out is an error naming the rank.
    pub fn answers(&self, what: &str, timeout: Duration) -> Result<(), String> {
        self.collect(what, timeout, |message| match message {
            ToLeader::Loaded => Some(()),
            _ => None,
        })
        .map(|_| ())
    }

    /// Every worker's peak memory in bytes, in rank order from rank 1.
    pub fn peak_memory(&self, timeout: Duration) -> Result<Vec<u64>, String> {
        self.tell(&ToWorker::ReportMemory)?;
        self.collect("a memory report", timeout, |message| match message {
            ToLeader::Memory { peak_bytes } => Some(*peak_bytes),
            _ => None,
        })
    }

    /// One answer from every worker, in rank order from rank 1, as `take` reads it from its
    /// message (`None`: not the answer awaited, an error naming the rank).
    fn collect<T>(
        &self,
        what: &str,
        timeout: Duration,
        take: impl Fn(&ToLeader) -> Option<T>,
    ) -> Result<Vec<T>, String> {
        let replies = lock(&self.replies);
        let deadline = Instant::now() + timeout;
        let mut answers: Vec<Option<T>> = (1..self.size).map(|_| None).collect();
        while let Some(waiting) = answers.iter().position(Option::is_none).map(|i| i + 1) {
            let left = deadline.saturating_duration_since(Instant::now());
            match replies.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok((rank, ToLeader::Failed { message })) => {
                    return Err(format!("rank {rank}: {message}"));
                }
                Ok((rank, message)) => match (take(&message), answers.get_mut(rank - 1)) {
                    (Some(answer), Some(slot)) => *slot = Some(answer),
                    _ => return Err(format!("rank {rank} answered {message:?} to {what}")),
                },
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(lost) = self.lost() {
                        return Err(lost);
                    }
                    if left.is_zero() {
                        return Err(format!(
                            "rank {waiting} did not answer {what} within {} s",
                            timeout.as_secs()
                        ));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.lost().unwrap_or_else(|| "the workers are gone".into()));
                }
            }
        }
        Ok(answers.into_iter().flatten().collect())
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        // The watchers then see their connections close as the end it is, not a departure.
        lock(&self.lost).get_or_insert_with(|| "rank 0 closed the group".into());
        for sender in lock(&self.senders).iter() {
            let _ = sender.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Reads a joining worker's first message and keeps its channel under its rank.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    joined: &mut [Option<Channel>],
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    // A connection that says nothing must not hold the others up.
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut channel = Channel::new(stream).map_err(|e| e.to_string())?;
    let hello: Option<ToLeader> = channel.recv().map_err(|e| e.to_string())?;
    let Some(ToLeader::Join { rank, version }) = hello else {
        return Err(format!("{peer} did not ask to join"));
    };
    let ours = env!("CARGO_PKG_VERSION");
    let mut refuse = |why: String| {
        let _ = channel.send(&ToLeader::Failed {
            message: why.clone(),
        });
        Err(why)
    };
    if version != ours {
        return refuse(format!(
            "rank {rank} runs mlxkit {version}; rank 0 runs {ours}"
        ));
    }
    let Some(slot) = rank.checked_sub(1).and_then(|i| joined.get_mut(i)) else {
        return refuse(format!(
            "rank {rank} is not a worker of this group of {}",
            joined.len() + 1
        ));
    };
    if slot.is_some() {
        return refuse(format!("rank {rank} has joined already"));
    }
    // A worker beats every second from here on: silence is a worker gone.
    channel
        .stream()
        .set_read_timeout(Some(SILENT_WORKER))
        .map_err(|e| e.to_string())?;
    *slot = Some(channel);
    tracing::info!("rank {rank} joined from {peer}");
    Ok(())
}

/// Reads `rank`'s messages on a thread of their own, passing them on, until it leaves; then
/// records why, so that the next step fails naming it.
fn watch(
    mut channel: Channel,
    rank: usize,
    name: String,
    replies: Sender<(usize, ToLeader)>,
    lost: Arc<Mutex<Option<String>>>,
) {
    let watched = Arc::clone(&lost);
    let spawned = std::thread::Builder::new()
        .name(format!("mlxkit-rank-{rank}"))
        .spawn(move || {
            let mut broke = None;
            let why = loop {
                match channel.recv::<ToLeader>() {
                    Ok(Some(ToLeader::Alive)) => {}
                    Ok(Some(ToLeader::Broke { why })) => broke = Some(why),
                    Ok(Some(message)) => {
                        if replies.send((rank, message)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => match broke {
                        // Another rank going broke it: that rank's watcher names it first.
                        Some(why) => {
                            std::thread::sleep(BROKE_AFTER_ANOTHER);
                            break format!("{name} left the group ({why})");
                        }
                        None => break format!("{name} left the group (its connection closed)"),
                    },
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        break format!(
                            "{name} stopped answering (nothing for {} s: stopped, or out of \
                             reach)",
                            SILENT_WORKER.as_secs()
                        );
                    }
                    Err(e) => break format!("{name} left the group ({e})"),
                }
            };
            let mut lost = lock(&watched);
            if lost.is_none() {
                tracing::error!("{why}");
                *lost = Some(why);
            }
        });
    if let Err(e) = spawned {
        lock(&lost).get_or_insert(format!("watching rank {rank}: {e}"));
    }
}

/// `rank` as the messages name it: with its address.
fn describe(hostfile: &Hostfile, rank: usize) -> String {
    match hostfile.address(rank) {
        Some(address) => format!("rank {rank} ({address})"),
        None => format!("rank {rank}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
