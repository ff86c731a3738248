//! The engine: one MLX worker thread that owns the resident models and runs their step loops
//! over every request at once, one step of each model with work per round.
//!
//! - `job`: what a generation asks for and what it streams back.
//! - `sequence`: one request's state inside the loop.
//! - `speculating`: a speculating sequence's round state, and the deepest round.
//! - `prefix_cache`: the prefix trie behind every request.
//! - `step`: what every phase of a step shares — the step's error and state ([`step::Step`]:
//!   who ends in it, whether the pool is released after it), the tokens left in flight, the
//!   batch-row helpers. The bottom of the step loop.
//! - `loaded_model`: [`LoadedModel`], what a loaded model holds to serve many sequences at once,
//!   its configuration and status.
//! - `residents`: the models resident on the worker, each under the [`ModelSlot`] its load
//!   gave it.
//! - The step's rooms, each a file over that state: `admission` (the queue, KV reservations,
//!   restoring a new sequence's caches), `prefill` (prompt chunks, image and audio encoding),
//!   `decode` (the batched forward, sampling, reading tokens), `speculation` (speculative
//!   rounds: drafts, one verification forward, lossless acceptance, rewind) and `retirement`
//!   (into the prefix trie); `step_loop` puts them in order.
//! - `prompt_media`: how a model takes images and audio in a prompt, and the checks a job's
//!   media pass at admission.
//! - `rollback`: bringing a round's caches back to what was accepted (attention rewinds,
//!   recurrent states restore captures taken inside the round).
//! - `controllers`: the depth controllers, one per drafter kind, kept across restarts.
//! - `draft_context`: what the engine lends a drafter, and the one trait drafters are reached
//!   through.
//! - `drafters`: a loaded model's drafters, one per kind, each a [`speculate::Drafter`].
//! - `layer_skip`: the target's first layers drafting for it.
//! - `draft_model`: a smaller model with the target's vocabulary drafting beside it, with
//!   caches of its own per sequence.
//! - `embedding`: a text's vector, its last token's final hidden state.
//! - `encoded_media`: the vision and audio encoders' outputs kept by content, under a byte
//!   budget.
//! - `memory`: budgets, KV sizes and when MLX's pool is released.
//! - `prefill_pace`: how long prefill forwards take, and so how many prompt tokens a step may
//!   take to stay near its time target.
//! - `from_store`: building a [`LoadedModel`] and the model's [`ModelInfo`] from a stored model.
//! - `transcription`: a Whisper checkpoint transcribing a clip's windows, beside the loaded
//!   model.
//!
//! Files import only what lies below them: `step` and the types it builds on at the bottom,
//! `loaded_model` above the drafters, the rooms above `loaded_model`, `step_loop` on top. The
//! files' imports form no cycle; `tsort` says so (it names the files of any loop), run in this
//! folder:
//!
//! ```sh
//! for f in *.rs; do grep -v '^ *//' $f | grep -oE '(crate::engine|super)::[a-z_]+' \
//!   | sed "s/.*:://; s/^/${f%.rs} /"; done | awk '$1 != $2' | tsort > /dev/null
//! ```
//!
//! Submitting a job puts it in an inbox and, unless the loop is already running, queues the
//! loop on the worker. The loop steps while anything runs or waits and then returns.
//!
//! Work that needs the worker but is no sequence — one text's embedding, one clip's
//! transcription, loading or unloading a model — goes into a second queue that the loop serves
//! between its rounds of steps: at least one piece, then more while they have taken less time
//! than the round before them. Under generation load such work waits about one round rather
//! than for the generations to end, and when both kinds wait each gets about half of the
//! worker; a round waits for at most one piece (bounded by the context length, one clip, or
//! one model's load) beyond that half.

mod admission;
pub mod assistant;
pub mod block_drafter;
pub mod controllers;
mod decode;
pub mod draft_context;
pub mod draft_model;
pub mod drafters;
pub mod embedding;
pub mod encoded_media;
pub mod from_store;
pub mod head_states;
pub mod job;
pub mod layer_skip;
pub mod loaded_model;
pub mod memory;
pub mod mtp;
mod prefill;
pub mod prefill_pace;
pub mod prefix_cache;
pub mod prompt_media;
pub mod residents;
mod retirement;
pub mod rollback;
pub mod sequence;
pub mod speculating;
pub mod speculation;
pub mod step;
mod step_loop;
pub mod transcription;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use mlx_thread::{Completion, Worker};

pub use from_store::{DraftSource, LoadError, ModelInfo, load_part};
pub use job::{
    DoneReason, DrafterKind, EncoderInput, Event, ImageProcessing, Job, PromptMedia, Speculation,
    SpeculationStats, Stats, TokenLogprobs, UndecodedImage,
};
pub use loaded_model::{LoadedModel, LoopConfig, LoopStatus};
pub use residents::{ModelSlot, Residents};

use crate::group::rank_0::GroupLink;
use crate::model_name::ModelName;
use crate::store::Manifest;

thread_local! {
    /// The resident models live on the worker thread: MLX arrays belong to the thread that
    /// builds their graphs.
    static RESIDENTS: RefCell<Residents> = RefCell::new(Residents::default());
}

/// What request handlers and the loop share.
#[derive(Default)]
struct Shared {
    /// Jobs submitted and not yet handed to the loop, each for the model in its slot.
    inbox: Mutex<VecDeque<(ModelSlot, Job)>>,
    /// Work the loop runs between its steps, one piece per step (see the module docs).
    aside: Mutex<VecDeque<Aside>>,
    /// Whether the loop is queued or running on the worker.
    running: AtomicBool,
    /// Each resident model's last status.
    status: Mutex<HashMap<ModelSlot, LoopStatus>>,
    /// The running loop's completion, kept so the queued loop is not cancelled.
    loop_completion: Mutex<Option<Completion<()>>>,
    /// The slot the next load takes.
    next_slot: AtomicU64,
}

/// A piece of work the loop runs on the worker between two steps, given the resident models
/// (loading and unloading one is such a piece).
type Aside = Box<dyn FnOnce(&mut Residents) + Send>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the engine can fail at.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The worker thread is gone or a job panicked.
    #[error("the MLX worker failed: {0}")]
    Worker(#[from] mlx_thread::Error),
    /// Loading failed.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// MLX failed while setting up.
    #[error(transparent)]
    Mlx(#[from] mlx::Error),
    /// A job was submitted for a model that is not resident.
    #[error("the model is not loaded")]
    NotLoaded,
    /// An embedding could not be computed.
    #[error("embedding: {0}")]
    Embed(#[from] step::StepError),
    /// Work queued beside the step loop ended without an answer (it panicked, or the worker
    /// stopped).
    #[error("the MLX worker dropped the work without an answer")]
    AsideDropped,
}

/// A model [`Engine::load`] made resident.
#[derive(Clone)]
pub struct Resident {
    /// Where its jobs go.
    pub slot: ModelSlot,
    /// What it is.
    pub info: Arc<ModelInfo>,
    /// Its weights' bytes, as measured across the load (the growth of MLX's active memory).
    pub weights_bytes: usize,
    /// What it plans for beyond them ([`LoadedModel::planned_bytes`]).
    pub planned_bytes: usize,
}

impl Resident {
    /// Bytes it is planned to take: its weights and what it plans for beyond them.
    pub fn footprint(&self) -> usize {
        self.weights_bytes.saturating_add(self.planned_bytes)
    }
}

/// Empty caches for one sequence of `model`, as the engine makes them (rewindable by the
/// deepest draft): what a worker of a split model keeps per sequence.
pub fn fresh_caches_of(
    model: &dyn nn::Model,
    kv_storage: Option<kvcache::KvStorage>,
) -> Result<Vec<Option<kvcache::LayerCache>>, step::StepError> {
    loaded_model::fresh_caches(model, kv_storage)
}

/// The MLX worker and the models resident on it.
pub struct Engine {
    worker: Worker,
    shared: Arc<Shared>,
    loop_config: LoopConfig,
    /// The group of processes every model is split across, on rank 0 of one.
    group: Option<Arc<GroupLink>>,
}

impl Engine {
    /// Starts the worker and picks the device (a GPU when MLX has one, else the CPU); models
    /// are served with [`LoopConfig::from_env`].
    pub fn new() -> Result<Engine, EngineError> {
        Engine::with_config(LoopConfig::from_env())
    }

    /// Like [`Engine::new`], serving every model with `loop_config`.
    pub fn with_config(loop_config: LoopConfig) -> Result<Engine, EngineError> {
        let worker = Worker::builder().name("mlx-engine").spawn()?;
        worker.try_run(|| -> Result<(), mlx::Error> {
            let device = mlx::Device::best_available()?;
            device.set_default()
        })??;
        Ok(Engine {
            worker,
            shared: Arc::default(),
            loop_config,
            group: None,
        })
    }

    /// This engine, as rank 0 of `group`: every model it loads is split across the group.
    pub fn with_group(mut self, group: Arc<GroupLink>) -> Engine {
        self.group = Some(group);
        self
    }

    /// The group this engine's models are split across, if any.
    pub fn group(&self) -> Option<&Arc<GroupLink>> {
        self.group.as_ref()
    }

    /// Loads `manifest`'s model from `dir` (its materialized files), and `draft` beside it,
    /// beside the models already resident; what serving it teaches the engine is kept in
    /// `state`.
    ///
    /// The load runs between two rounds of the loop, so generations on the other resident
    /// models pause for it rather than it waiting for them to end.
    pub async fn load(
        &self,
        name: ModelName,
        manifest: Manifest,
        dir: PathBuf,
        state: PathBuf,
        draft: Option<DraftSource>,
    ) -> Result<Resident, EngineError> {
        let loop_config = self.loop_config;
        let group = self.group.clone();
        let slot = ModelSlot(self.shared.next_slot.fetch_add(1, Ordering::SeqCst));
        let (info, weights_bytes, planned_bytes) = self
            .run_aside(
                move |residents| -> Result<(ModelInfo, usize, usize), LoadError> {
                    transcription::release();
                    // The other models' steps may still be computing (a step does not wait
                    // for its tokens): their temporaries must not count for or against this
                    // model's weights.
                    let _ = mlx::synchronize();
                    let _ = memory::release_pool();
                    let before = mlx::memory::active_memory().unwrap_or(0);
                    let (mut loaded, info) = from_store::load(
                        &name,
                        &manifest,
                        &dir,
                        draft.as_ref(),
                        loop_config,
                        group.as_ref(),
                    )?;
                    loaded.keep_state_in(state);
                    let _ = mlx::synchronize();
                    let _ = memory::release_pool();
                    let weights = mlx::memory::active_memory()
                        .unwrap_or(0)
                        .saturating_sub(before);
                    let planned = loaded.planned_bytes();
                    residents.insert(slot, loaded);
                    Ok((info, weights, planned))
                },
            )
            .await??;
        Ok(Resident {
            slot,
            info: Arc::new(info),
            weights_bytes,
            planned_bytes,
        })
    }

    /// Drops the model in `slot` (its running requests end as failed) and returns its memory.
    pub async fn unload(&self, slot: ModelSlot) -> Result<(), EngineError> {
        self.run_aside(move |residents| {
            if let Some(mut loaded) = residents.remove(slot) {
                loaded.fail_all(&EngineError::NotLoaded.to_string());
            }
            if residents.is_empty() {
                transcription::release();
            }
            let _ = memory::release_pool();
        })
        .await?;
        lock(&self.shared.status).remove(&slot);
        Ok(())
    }

    /// Queues `job` for the step loop of the model in `slot`; its events arrive on the job's
    /// channel, ending with `Done` or `Failed`.
    pub fn submit(&self, slot: ModelSlot, job: Job) {
        lock(&self.shared.inbox).push_back((slot, job));
        self.wake_loop();
    }

    /// Queues the loop on the worker unless it is queued or running already.
    fn wake_loop(&self) {
        if !self.shared.running.swap(true, Ordering::SeqCst) {
            let shared = Arc::clone(&self.shared);
            let completion = self.worker.submit(move || run_loop(&shared));
            *lock(&self.shared.loop_completion) = Some(completion);
        }
    }

    /// Runs `work` on the worker between two steps of the loop (see the module docs), given
    /// the resident models, and returns what it returns.
    async fn run_aside<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Residents) -> T + Send + 'static,
    ) -> Result<T, EngineError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        lock(&self.shared.aside).push_back(Box::new(move |residents| {
            let _ = answer.send(work(residents));
        }));
        self.wake_loop();
        answered.await.map_err(|_| EngineError::AsideDropped)
    }

    /// What the step loop is doing with the model in `slot` (as of its last step).
    pub fn status(&self, slot: ModelSlot) -> LoopStatus {
        let mut status = lock(&self.shared.status)
            .get(&slot)
            .copied()
            .unwrap_or_default();
        status.queued += lock(&self.shared.inbox)
            .iter()
            .filter(|(s, _)| *s == slot)
            .count();
        status
    }

    /// Embeddings of `inputs` with the model in `slot`, in order (not normalized). Each input
    /// is one piece of work between two steps of the loop, so generations running meanwhile
    /// neither wait for the whole batch nor make it wait for them.
    pub async fn embed(
        &self,
        slot: ModelSlot,
        inputs: Vec<Vec<u32>>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut vectors = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            let vector = self
                .run_aside(move |residents| match residents.get(slot) {
                    Some(loaded) => loaded.embed(&tokens).map_err(EngineError::from),
                    None => Err(EngineError::NotLoaded),
                })
                .await??;
            vectors.push(vector);
        }
        Ok(vectors)
    }

    /// Transcribes `job`'s windows with the Whisper checkpoint it names: one piece of work
    /// between two steps of the loop, as an embedding is.
    pub async fn transcribe(
        &self,
        job: transcription::TranscriptionJob,
    ) -> Result<
        Result<transcription::TranscriptionResult, transcription::TranscriptionError>,
        EngineError,
    > {
        self.run_aside(move |_| transcription::run(&job)).await
    }

    /// Active and peak MLX memory: read on the worker when it is free, else as of the loop's
    /// last step (a query must not wait behind running generations).
    pub async fn memory(&self) -> Result<(usize, usize), EngineError> {
        if self.shared.running.load(Ordering::SeqCst) {
            let status = lock(&self.shared.status);
            let last = status
                .values()
                .map(|s| (s.active_memory, s.peak_memory))
                .max();
            return Ok(last.unwrap_or_default());
        }
        let result = self
            .worker
            .submit(|| -> Result<(usize, usize), mlx::Error> {
                Ok((mlx::memory::active_memory()?, mlx::memory::peak_memory()?))
            })
            .await?;
        Ok(result?)
    }
}

/// How long the inbox must stay unchanged before an idle loop starts its first step.
const BURST_QUIET: Duration = Duration::from_micros(500);
/// The longest an idle loop waits for a burst to settle.
const BURST_WINDOW: Duration = Duration::from_millis(5);

/// Lets a burst of requests arriving together (an agent's parallel calls, a benchmark's
/// streams) reach the inbox before an idle loop starts: the first step then prefills them all
/// in one batched forward. Started on the first of them, the loop would prefill it alone, and
/// every other one would wait that whole forward and then get a prompt chunk a step beside the
/// first one's decoding (measured on SmolLM2, 8 streams of 128 tokens: first tokens from 0.5
/// to 2.3 s, against 1.56 s for all when admitted together). Returns at once on an empty
/// inbox; a lone request pays `BURST_QUIET` once.
fn wait_for_burst(shared: &Shared) {
    let start = Instant::now();
    let mut seen = lock(&shared.inbox).len();
    if seen == 0 {
        return;
    }
    let mut quiet_since = start;
    while start.elapsed() < BURST_WINDOW {
        std::thread::sleep(Duration::from_micros(100));
        let now = lock(&shared.inbox).len();
        if now != seen {
            seen = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= BURST_QUIET {
            return;
        }
    }
}

/// The step loop: hands submitted jobs to their models, runs aside work between steps
/// ([`run_aside_work`]), and steps every model with work, one step each per round, until
/// nothing runs or waits. A long generation on one model so delays another model's requests
/// by one of its steps per round, never by its whole length. A panic inside a step ends the
/// sequences it concerned with an error, not the loop; one inside aside work drops that
/// work's answer.
fn run_loop(shared: &Shared) {
    RESIDENTS.with(|cell| {
        let mut residents = cell.borrow_mut();
        let mut last_round = Duration::ZERO;
        loop {
            if residents.all_idle() {
                wait_for_burst(shared);
            }
            let jobs: Vec<(ModelSlot, Job)> = lock(&shared.inbox).drain(..).collect();
            for (slot, job) in jobs {
                match residents.get_mut(slot) {
                    Some(loaded) => loaded.submit(job),
                    None => {
                        let message = EngineError::NotLoaded.to_string();
                        let _ = job.events.send(Event::Failed(message));
                    }
                }
            }
            run_aside_work(shared, &mut residents, last_round);
            if residents.all_idle() {
                let mut status = lock(&shared.status);
                for (slot, loaded) in residents.iter_mut() {
                    status.insert(slot, loaded.status());
                }
                drop(status);
                shared.running.store(false, Ordering::SeqCst);
                // A job submitted after the drain above saw the loop running and queued no
                // new one: take it over unless a new loop was queued meanwhile.
                let nothing_left = lock(&shared.inbox).is_empty() && lock(&shared.aside).is_empty();
                if nothing_left || shared.running.swap(true, Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            let round_started = Instant::now();
            // The KV budget is the device's, shared by every resident model.
            let mut reserved = residents.kv_reserved();
            for (slot, loaded) in residents.iter_mut() {
                if loaded.is_idle() {
                    continue;
                }
                let own = loaded.kv_reserved();
                let elsewhere = reserved.saturating_sub(own);
                let stepped =
                    std::panic::catch_unwind(AssertUnwindSafe(|| loaded.step_beside(elsewhere)));
                if let Err(panic) = stepped {
                    let message = panic_message(&*panic);
                    tracing::error!("the engine step panicked: {message}");
                    loaded.fail_all(&format!("internal error in the engine: {message}"));
                }
                reserved = elsewhere.saturating_add(loaded.kv_reserved());
                lock(&shared.status).insert(slot, loaded.status());
            }
            last_round = round_started.elapsed();
        }
    })
}

/// Runs queued aside work between two rounds of steps: at least one piece, then more while
/// they have taken less time than the round just run (`last_round`). When generations and
/// aside work both wait, each gets about half of the worker; with nothing generating, the
/// queue drains.
fn run_aside_work(shared: &Shared, residents: &mut Residents, last_round: Duration) {
    let started = Instant::now();
    loop {
        let Some(work) = lock(&shared.aside).pop_front() else {
            return;
        };
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| work(residents))) {
            tracing::error!(
                "work beside the step loop panicked: {}",
                panic_message(&*panic)
            );
        }
        if started.elapsed() >= last_round {
            return;
        }
    }
}

/// The message a panic carried, when it carried one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
