//! A worker's side of a split model (`mlxkit worker`): it joins rank 0's group, loads its part
//! of whatever model rank 0 loads, and runs every forward rank 0 tells it, over caches it keeps
//! per row tag. It samples nothing and answers no client; rank 0 does both.
//!
//! A worker cannot skip a forward: the group's collectives would fall out of step. So a
//! forward it cannot run breaks the group: the worker closes its connection (which tells rank
//! 0), drops its part and the group, and joins again; so does a worker rank 0 tells to
//! regroup after another rank left. Over the ring backend the group then re-forms.

use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use kvcache::LayerCache;
use mlx::distributed::{Backend, Group};
use nn::{Batch, Model};

use crate::group::Parallel;
use crate::group::control::{Channel, Heartbeat, Row, ToLeader, ToWorker, kv_storage_named};
use crate::group::hostfile::Hostfile;
use crate::model_name::ModelName;
use crate::store::Store;

/// The most tokens one forward may carry: far past any prefill step rank 0 runs, and a bound
/// on what a message can make this rank allocate.
const MAX_FORWARD_TOKENS: usize = 1 << 20;

/// A worker's model: its part, and its caches per row tag.
struct Part {
    model: Box<dyn Model>,
    caches: HashMap<u64, Vec<Option<LayerCache>>>,
    /// How its caches store keys and values, as rank 0's do.
    kv_storage: Option<kvcache::KvStorage>,
}

/// Joins the group `hostfile` describes as `rank`, trying for `join_timeout` to reach rank 0,
/// and follows it until it closes the group. When the group breaks (another rank left, or a
/// forward failed here), drops its part and joins again, so that the group re-forms. Runs on
/// the calling thread, which becomes this rank's MLX thread.
pub fn follow(
    store: &Store,
    hostfile: &Hostfile,
    rank: usize,
    backend: Backend,
    join_timeout: Duration,
) -> Result<(), String> {
    loop {
        let (mut channel, group, heartbeat) = join(hostfile, rank, backend, join_timeout)?;
        let served = serve(store, rank, &mut channel, &group);
        drop(heartbeat);
        let why = match served? {
            Ended::Closed => {
                eprintln!("mlxkit worker: rank 0 closed the group");
                return Ok(());
            }
            Ended::Broken(why) => why,
        };
        // Said before leaving, so that rank 0 names the rank that went first, not this one.
        let _ = channel.send(&ToLeader::Broke { why: why.clone() });
        // Shut, not only dropped: the heartbeat's thread holds the connection a moment more.
        channel.shutdown();
        // The group's last handles here: its connections close once MLX forgets it too.
        drop((channel, group));
        if backend != Backend::Ring {
            return Err(format!(
                "the group broke ({why}); a group over `{backend}` forms once per process: \
                 restart every rank"
            ));
        }
        eprintln!("mlxkit worker: the group broke ({why}); rank {rank} joins it again");
        mlx::distributed::forget_groups().map_err(|e| e.to_string())?;
    }
}

/// How following rank 0 ended.
enum Ended {
    /// Rank 0 closed the group: the worker is done.
    Closed,
    /// The group broke (why): join again.
    Broken(String),
}

/// Reaches rank 0 within `join_timeout`, joins as `rank` and forms MLX's group with the others;
/// the heartbeat runs from the join on, so that a slow forming does not read as silence.
fn join(
    hostfile: &Hostfile,
    rank: usize,
    backend: Backend,
    join_timeout: Duration,
) -> Result<(Channel, Group, Heartbeat), String> {
    let control = hostfile.control()?;
    let deadline = Instant::now() + join_timeout;
    let stream = loop {
        match TcpStream::connect_timeout(&control, Duration::from_secs(2)) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "rank 0 could not be reached at {control} within {} s: {e}",
                    join_timeout.as_secs()
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let mut channel = Channel::new(stream).map_err(|e| e.to_string())?;
    channel
        .send(&ToLeader::Join {
            rank,
            version: env!("CARGO_PKG_VERSION").to_string(),
        })
        .map_err(|e| format!("joining rank 0 at {control}: {e}"))?;
    let heartbeat = channel
        .start_heartbeat()
        .map_err(|e| format!("starting the heartbeat: {e}"))?;
    match recv(&mut channel)? {
        Some(ToWorker::FormGroup) => {}
        None => return Err("rank 0 closed the connection before the group formed".into()),
        Some(other) => return Err(format!("rank 0 sent {other:?} before the group formed")),
    }
    let group = crate::group::forming::init(hostfile, backend)?;
    eprintln!(
        "mlxkit worker: rank {rank} of {} joined the group at {control}",
        hostfile.size()
    );
    Ok((channel, group, heartbeat))
}

/// Runs what rank 0 tells this rank over `channel`, until it closes the group or the group
/// breaks; an error for a message no rank 0 sends.
fn serve(
    store: &Store,
    rank: usize,
    channel: &mut Channel,
    group: &Group,
) -> Result<Ended, String> {
    let mut part: Option<Part> = None;
    while let Some(message) = recv(channel)? {
        match message {
            ToWorker::FormGroup => return Err("rank 0 asked to form the group twice".into()),
            ToWorker::Load {
                model,
                parallel,
                kv_cache,
            } => {
                part = None;
                let kv_storage = match kv_cache.as_deref().map(kv_storage_named) {
                    None => Ok(None),
                    Some(Some(storage)) => Ok(Some(storage)),
                    Some(None) => Err(format!(
                        "rank 0 asked for a KV cache of `{}`, which this build does not know",
                        kv_cache.unwrap_or_default()
                    )),
                };
                let loaded =
                    kv_storage.and_then(|kv| Ok((load(store, &model, parallel, group)?, kv)));
                let answer = match loaded {
                    Ok((model, kv_storage)) => {
                        part = Some(Part {
                            model,
                            caches: HashMap::new(),
                            kv_storage,
                        });
                        ToLeader::Loaded
                    }
                    Err(message) => ToLeader::Failed { message },
                };
                channel
                    .send(&answer)
                    .map_err(|e| format!("answering rank 0: {e}"))?;
            }
            ToWorker::Forward {
                rows,
                width,
                rope_deltas,
            } => {
                let part = part
                    .as_mut()
                    .ok_or("rank 0 sent a forward with no model loaded")?;
                // The collectives fell out of step: the group cannot go on.
                if let Err(e) = part.forward(group, &rows, width, rope_deltas) {
                    return Ok(Ended::Broken(format!(
                        "a forward failed on rank {rank}: {e}"
                    )));
                }
            }
            ToWorker::Release { tags } => {
                if let Some(part) = part.as_mut() {
                    for tag in tags {
                        part.caches.remove(&tag);
                    }
                }
            }
            ToWorker::Unload => part = None,
            ToWorker::ReportMemory => {
                let peak_bytes = mlx::memory::peak_memory().map_err(|e| e.to_string())? as u64;
                channel
                    .send(&ToLeader::Memory { peak_bytes })
                    .map_err(|e| format!("answering rank 0: {e}"))?;
            }
            ToWorker::Regroup { why } => return Ok(Ended::Broken(why)),
        }
    }
    Ok(Ended::Closed)
}

/// The next message from rank 0; `None` once it has closed.
fn recv(channel: &mut Channel) -> Result<Option<ToWorker>, String> {
    channel
        .recv()
        .map_err(|e| format!("reading from rank 0: {e}"))
}

/// This rank's part of stored model `name`.
fn load(
    store: &Store,
    name: &str,
    parallel: Parallel,
    group: &Group,
) -> Result<Box<dyn Model>, String> {
    let name = ModelName::parse(name).map_err(|e| e.to_string())?;
    let entry = store
        .get(&name)
        .map_err(|e| format!("{e} (pull it on this machine too)"))?;
    let dir = store
        .materialize(&entry.manifest)
        .map_err(|e| e.to_string())?;
    let group = group.try_clone().map_err(|e| e.to_string())?;
    let split = match parallel {
        Parallel::Tensor => nn::load::Split::Tensor(group),
        Parallel::Pipeline => nn::load::Split::Pipeline(group),
    };
    crate::engine::load_part(&name, &entry.manifest, &dir, split).map_err(|e| e.to_string())
}

impl Part {
    /// Runs the forward rank 0 announced: the tokens come from rank 0 through the group.
    fn forward(
        &mut self,
        group: &Group,
        rows: &[Row],
        width: usize,
        rope_deltas: Vec<i64>,
    ) -> Result<(), String> {
        let tokens = rows.len().saturating_mul(width);
        if rows.is_empty() || width == 0 || tokens > MAX_FORWARD_TOKENS {
            return Err(format!(
                "a forward of {} rows of {width} tokens is not one rank 0 sends",
                rows.len()
            ));
        }
        let shape = [rows.len() as i32, width as i32];
        let zeros = mlx::Array::zeros(&shape, mlx::Dtype::I32).map_err(|e| e.to_string())?;
        let tokens = group.all_sum(&zeros).map_err(|e| e.to_string())?;
        // The tokens' sum is the forward's first collective on every rank, whether or not
        // this rank's part reads them (a later pipeline stage receives states instead).
        tokens.eval().map_err(|e| e.to_string())?;
        let positions = rows.iter().map(|r| r.position).collect();
        let mut batch = Batch::from_device(&tokens, positions)
            .and_then(|b| b.with_row_tags(rows.iter().map(|r| r.tag).collect()))
            .map_err(|e| e.to_string())?;
        if !rope_deltas.is_empty() {
            batch = batch
                .with_rope_deltas(rope_deltas)
                .map_err(|e| e.to_string())?;
        }
        for row in rows {
            self.caches_at(row)?;
        }
        let mut taken: Vec<(u64, Vec<Option<LayerCache>>)> = rows
            .iter()
            .map(|row| (row.tag, self.caches.remove(&row.tag).unwrap_or_default()))
            .collect();
        let result = {
            let mut borrowed: Vec<&mut [Option<LayerCache>]> =
                taken.iter_mut().map(|(_, c)| c.as_mut_slice()).collect();
            self.model
                .forward_rows(&batch, &mut borrowed)
                .and_then(|out| Ok(mlx::eval([&out.hidden])?))
        };
        self.caches.extend(taken);
        result.map_err(|e| e.to_string())
    }

    /// Makes `row`'s caches end where it starts: fresh ones for a new tag or a row from 0,
    /// rewound ones after rejected drafts.
    fn caches_at(&mut self, row: &Row) -> Result<(), String> {
        let end = self.caches.get(&row.tag).map(|c| {
            c.iter()
                .flatten()
                .map(LayerCache::offset)
                .max()
                .unwrap_or(0)
        });
        match end {
            Some(end) if end == row.position => Ok(()),
            Some(end) if end > row.position && row.position > 0 => {
                for cache in self
                    .caches
                    .get_mut(&row.tag)
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    cache.rewind(row.position).map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            _ if row.position == 0 => {
                let fresh = crate::engine::fresh_caches_of(self.model.as_ref(), self.kv_storage)
                    .map_err(|e| e.to_string())?;
                self.caches.insert(row.tag, fresh);
                Ok(())
            }
            _ => Err(format!(
                "row {} starts at {} where this rank holds no caches",
                row.tag, row.position
            )),
        }
    }
}
