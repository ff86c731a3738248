//! The engine: one MLX worker thread that owns the loaded model and runs jobs on it in order.
//!
//! - `job`: what a generation asks for and what it streams back.
//! - `session`: the loaded model, its live caches and the prefill/decode loop.
//! - `loader`: building a session and the model's [`ModelInfo`] from a stored model.

pub mod job;
pub mod loader;
pub mod session;

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

use mlx_thread::{Completion, Worker};

pub use job::{DoneReason, Event, Job, Stats, TokenLogprobs};
pub use loader::{LoadError, ModelInfo};

use crate::model_name::ModelName;
use crate::store::Manifest;
use session::Session;

thread_local! {
    /// The loaded model lives on the worker thread: MLX arrays belong to the thread that
    /// builds their graphs.
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
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
    /// A job was submitted with no model loaded.
    #[error("no model is loaded")]
    NotLoaded,
}

/// The MLX worker and the model it holds.
pub struct Engine {
    worker: Worker,
}

impl Engine {
    /// Starts the worker and picks the device (a GPU when MLX has one, else the CPU).
    pub fn new() -> Result<Engine, EngineError> {
        let worker = Worker::builder().name("mlx-engine").spawn()?;
        worker.try_run(|| -> Result<(), mlx::Error> {
            let device = mlx::Device::best_available()?;
            device.set_default()
        })??;
        Ok(Engine { worker })
    }

    /// Loads `manifest`'s model from `dir` (its materialized files), replacing any loaded one.
    pub async fn load(
        &self,
        name: ModelName,
        manifest: Manifest,
        dir: PathBuf,
    ) -> Result<Arc<ModelInfo>, EngineError> {
        let completion = self.worker.submit(move || -> Result<ModelInfo, LoadError> {
            // Free the previous model first: two models need not fit in memory at once.
            SESSION.with(|s| s.borrow_mut().take());
            let _ = mlx::memory::clear_cache();
            let (session, info) = loader::load(&name, &manifest, &dir)?;
            SESSION.with(|s| *s.borrow_mut() = Some(session));
            Ok(info)
        });
        Ok(Arc::new(completion.await??))
    }

    /// Drops the loaded model and returns its memory.
    pub async fn unload(&self) -> Result<(), EngineError> {
        self.worker
            .submit(|| {
                SESSION.with(|s| s.borrow_mut().take());
                let _ = mlx::memory::clear_cache();
            })
            .await?;
        Ok(())
    }

    /// Queues `job`; its events arrive on the job's channel. The returned completion must be
    /// kept (or awaited) until the job ends: dropping it before the job starts cancels it.
    pub fn submit(&self, job: Job) -> Completion<()> {
        self.worker.submit(move || {
            SESSION.with(|s| match s.borrow_mut().as_mut() {
                Some(session) => session.run(job),
                None => {
                    let _ = job
                        .events
                        .send(Event::Failed(EngineError::NotLoaded.to_string()));
                }
            })
        })
    }

    /// Active and peak MLX memory, read on the worker.
    pub async fn memory(&self) -> Result<(usize, usize), EngineError> {
        let result = self
            .worker
            .submit(|| -> Result<(usize, usize), mlx::Error> {
                Ok((mlx::memory::active_memory()?, mlx::memory::peak_memory()?))
            })
            .await?;
        Ok(result?)
    }
}
