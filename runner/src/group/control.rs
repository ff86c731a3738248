//! The control channel between rank 0 and each worker: one TCP connection per worker, carrying
//! JSON lines. It says what to do (load a model, run a forward over which rows, free which
//! caches); the tensors themselves travel over MLX's own backend. MLX's collectives have no
//! timeout and no notion of a peer leaving, so this connection is also how rank 0 learns that
//! a worker is gone: its end closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest message read: a forward names its rows (three numbers each) and nothing else.
const MAX_LINE: u64 = 4 << 20;

/// How a model is split across the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parallel {
    /// Every layer's heads and MLP columns split across the ranks.
    Tensor,
    /// The layers split into contiguous ranges, one per rank.
    Pipeline,
}

impl Parallel {
    /// The name `--parallel` takes.
    pub fn name(self) -> &'static str {
        match self {
            Parallel::Tensor => "tensor",
            Parallel::Pipeline => "pipeline",
        }
    }
}

/// `storage` as a [`ToWorker::Load`] names it.
pub fn kv_storage_name(storage: kvcache::KvStorage) -> String {
    match storage {
        kvcache::KvStorage::Q8 => "q8".into(),
        kvcache::KvStorage::Float(dtype) => format!("{dtype:?}").to_lowercase(),
    }
}

/// The storage [`kv_storage_name`] named `name`, if any.
pub fn kv_storage_named(name: &str) -> Option<kvcache::KvStorage> {
    use mlx::Dtype;
    [
        kvcache::KvStorage::Q8,
        kvcache::KvStorage::Float(Dtype::F32),
        kvcache::KvStorage::Float(Dtype::F16),
        kvcache::KvStorage::Float(Dtype::Bf16),
    ]
    .into_iter()
    .find(|&storage| kv_storage_name(storage) == name)
}

/// One row of a forward: whose caches, from which position, how many tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The caches' tag ([`nn::Batch::row_tags`]).
    pub tag: u64,
    /// The position of its first token.
    pub position: usize,
}

/// What rank 0 tells a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToWorker {
    /// Joined: every rank forms the group now.
    FormGroup,
    /// Load this rank's part of the stored model `model`, split as `parallel` says.
    Load {
        /// Its name in the worker's store.
        model: String,
        /// How it is split.
        parallel: Parallel,
        /// How its attention caches store keys and values ([`kv_storage_name`]); `None`: in
        /// the dtype the model computes in.
        kv_cache: Option<String>,
    },
    /// Run one forward over `rows`, each `width` tokens; the tokens come over MLX's backend.
    Forward {
        /// The rows, in the batch's order.
        rows: Vec<Row>,
        /// Tokens per row.
        width: usize,
        /// Per row, its rotary position minus its cache position (empty: all 0).
        rope_deltas: Vec<i64>,
    },
    /// The caches tagged so will run no forward again.
    Release {
        /// Their tags.
        tags: Vec<u64>,
    },
    /// Drop the loaded model.
    Unload,
    /// Say how much memory this rank has held at most.
    ReportMemory,
    /// Another rank left: drop the model and the group, and join again to re-form it.
    Regroup {
        /// Which rank left, and how, as rank 0 saw it.
        why: String,
    },
}

/// What a worker tells rank 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToLeader {
    /// A worker asks to join as `rank`, running mlxkit `version`.
    Join {
        /// Its rank.
        rank: usize,
        /// Its mlxkit version, which must be rank 0's.
        version: String,
    },
    /// The model asked for is loaded.
    Loaded,
    /// The most memory MLX has held on this rank ([`ToWorker::ReportMemory`]).
    Memory {
        /// Bytes.
        peak_bytes: u64,
    },
    /// What rank 0 asked for failed.
    Failed {
        /// Why.
        message: String,
    },
    /// This worker still runs (sent every [`HEARTBEAT`], from a thread of its own, so that a
    /// long forward does not hold it back): rank 0 takes a worker silent for
    /// [`SILENT_WORKER`] as lost.
    Alive,
    /// This worker leaves the group, which broke under it (a forward failed here, usually
    /// because another rank went), to join it again.
    Broke {
        /// Why.
        why: String,
    },
}

/// How often a worker says it is [`ToLeader::Alive`].
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How long rank 0 waits to hear from a worker before taking it as lost: ten heartbeats
/// missed, which a process running at all does not miss (a stopped process, a machine gone
/// or a network cut does).
pub const SILENT_WORKER: Duration = Duration::from_secs(10);

/// One end of a control connection.
pub struct Channel {
    reader: BufReader<TcpStream>,
    /// Shared with a heartbeat's thread: one message at a time on the wire.
    writer: Arc<Mutex<TcpStream>>,
}

impl Channel {
    /// A channel over `stream`.
    pub fn new(stream: TcpStream) -> std::io::Result<Channel> {
        stream.set_nodelay(true)?;
        Ok(Channel {
            reader: BufReader::new(stream.try_clone()?),
            writer: Arc::new(Mutex::new(stream)),
        })
    }

    /// Another handle on the sending side, for a thread that only sends.
    pub fn sender(&self) -> std::io::Result<TcpStream> {
        self.writer().try_clone()
    }

    /// Sends `message`.
    pub fn send(&mut self, message: &impl Serialize) -> std::io::Result<()> {
        send_on(&mut self.writer(), message)
    }

    /// Sends [`ToLeader::Alive`] every [`HEARTBEAT`] from a thread of its own, until the
    /// returned guard is dropped or the connection fails.
    pub fn start_heartbeat(&self) -> std::io::Result<Heartbeat> {
        let writer = Arc::clone(&self.writer);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("mlxkit-heartbeat".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let sent = send_on(
                        &mut writer.lock().unwrap_or_else(|p| p.into_inner()),
                        &ToLeader::Alive,
                    );
                    if sent.is_err() {
                        return;
                    }
                    std::thread::sleep(HEARTBEAT);
                }
            })?;
        Ok(Heartbeat { stop })
    }

    fn writer(&self) -> MutexGuard<'_, TcpStream> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next message; `None` once the other end has closed.
    pub fn recv<T: for<'de> Deserialize<'de>>(&mut self) -> std::io::Result<Option<T>> {
        let mut line = Vec::new();
        let read = (&mut self.reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a control message was cut off or longer than the limit",
            ));
        }
        serde_json::from_slice(&line).map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("an unreadable control message ({e})"),
            )
        })
    }

    /// Closes both directions, waking a thread blocked reading it.
    pub fn shutdown(&self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }

    /// The underlying socket.
    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }
}

/// A channel's heartbeat ([`Channel::start_heartbeat`]); it stops within a beat of being
/// dropped.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Sends `message` as one line on `stream`.
pub fn send_on(stream: &mut TcpStream, message: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kv_storage_reads_back_by_its_name() {
        for storage in [
            kvcache::KvStorage::Q8,
            kvcache::KvStorage::Float(mlx::Dtype::F32),
            kvcache::KvStorage::Float(mlx::Dtype::F16),
            kvcache::KvStorage::Float(mlx::Dtype::Bf16),
        ] {
            assert_eq!(kv_storage_named(&kv_storage_name(storage)), Some(storage));
        }
        assert_eq!(kv_storage_named("f8"), None);
    }

    #[test]
    fn messages_read_back_as_they_were_sent() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut channel = Channel::new(TcpStream::connect(address).unwrap()).unwrap();
            channel
                .send(&ToLeader::Join {
                    rank: 1,
                    version: "0.1.0".into(),
                })
                .unwrap();
            channel.recv::<ToWorker>().unwrap()
        });
        let (stream, _) = listener.accept().unwrap();
        let mut channel = Channel::new(stream).unwrap();
        let join: ToLeader = channel.recv().unwrap().unwrap();
        assert_eq!(
            join,
            ToLeader::Join {
                rank: 1,
                version: "0.1.0".into()
            }
        );
        let forward = ToWorker::Forward {
            rows: vec![Row {
                tag: 7,
                position: 12,
            }],
            width: 1,
            rope_deltas: Vec::new(),
        };
        channel.send(&forward).unwrap();
        assert_eq!(client.join().unwrap(), Some(forward));
        // The client's end is closed now.
        assert_eq!(channel.recv::<ToLeader>().unwrap(), None);
    }
}
