//! Which models are resident: each loaded on first use beside the others while they fit,
//! the least recently used idle one unloaded when a new one does not, each unloaded after its
//! `keep_alive`; and a bounded queue of requests in front of the engine.
//!
//! A model fits when the resident count stays within [`ResidentLimits::max_models`] and the
//! footprints stay within [`ResidentLimits::bytes`]. A resident's footprint is what the engine
//! measured at its load ([`crate::engine::Resident::footprint`]: weights, one request's KV,
//! its prefix cache's budget); a model not yet loaded counts its files' size. A model with a
//! request in flight is never unloaded: a load that needs its room waits for its requests to
//! end, and meanwhile holds back its new ones, so that a model never idle cannot keep the
//! other out. With nothing resident a model always loads, whatever it needs.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedSemaphorePermit, RwLock, Semaphore};

use crate::engine::from_store::check_draft_vocabulary;
use crate::engine::memory::device_memory;
use crate::engine::{DraftSource, Engine, EngineError, LoadError, ModelInfo, ModelSlot, Resident};
use crate::model_name::ModelName;
use crate::store::{Manifest, Store, StoreError};

/// How long a model stays loaded after its last request, unless the request says otherwise.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(300);

/// Models resident at once unless `MLXKIT_MAX_LOADED_MODELS` says otherwise: a main model, a
/// small fast one and an embedding model, the set a coding agent and its editor name.
pub const DEFAULT_MAX_LOADED_MODELS: usize = 3;

/// How many models may be resident at once, and in how many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResidentLimits {
    /// Models resident at once.
    pub max_models: usize,
    /// Bytes their footprints may take together.
    pub bytes: usize,
}

impl ResidentLimits {
    /// [`DEFAULT_MAX_LOADED_MODELS`] (`MLXKIT_MAX_LOADED_MODELS` overrides it) in three
    /// quarters of the device's memory (`MLXKIT_RESIDENT_BYTES`): the rest is the running
    /// requests' KV beyond each model's planned share, and the system's.
    pub fn from_env() -> ResidentLimits {
        let max_models = std::env::var("MLXKIT_MAX_LOADED_MODELS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_MAX_LOADED_MODELS);
        let bytes = std::env::var("MLXKIT_RESIDENT_BYTES")
            .ok()
            .and_then(|v| crate::engine::memory::parse_bytes(&v))
            .unwrap_or(device_memory() / 4 * 3);
        ResidentLimits { max_models, bytes }
    }
}

/// Why a request could not get the model.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Too many requests are already waiting.
    #[error("server busy: {0} requests are already queued, try again shortly")]
    Busy(usize),
    /// The store has no such model, or its files are damaged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Loading failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The model does not generate text (a speech recognizer).
    #[error(
        "model `{0}` transcribes audio and does not generate text; use POST /v1/audio/transcriptions"
    )]
    NotGenerative(String),
    /// The model only drafts for another (a Gemma 4 assistant, a DFlash drafter).
    #[error(
        "model `{0}` is a drafter: it drafts beside the model it was made for (name it in that \
         model's Modelfile as `DRAFT`) and does not generate text on its own"
    )]
    OnlyDrafts(String),
    /// The group of processes the models are split across has lost a rank.
    #[error("this server cannot run models: {0}")]
    GroupLost(String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A resident model and what the keeper tracks of it.
struct Entry {
    resident: Resident,
    /// When it may be unloaded; `None` keeps it forever (negative keep_alive).
    expires: Mutex<Option<Instant>>,
    /// When a request last took it: the least recent idle one makes room first.
    last_used: Mutex<Instant>,
    /// Held shared by every lease on it; unloading takes it exclusively, under the set's
    /// lock, so a model with a request in flight is never unloaded.
    in_use: Arc<RwLock<()>>,
}

impl Entry {
    fn set_expiry(&self, keep_alive: KeepAlive) {
        *lock(&self.expires) = keep_alive
            .duration()
            .and_then(|d| Instant::now().checked_add(d));
    }

    fn expiry(&self) -> Option<Instant> {
        *lock(&self.expires)
    }

    fn expired(&self) -> bool {
        self.expiry().is_some_and(|t| Instant::now() >= t)
    }

    /// Whether it is `name` with `draft` beside it (any draft, or none, when `None`).
    fn serves(&self, name: &ModelName, draft: Option<&ModelName>) -> bool {
        let info = &self.resident.info;
        info.name == *name && draft.is_none_or(|d| info.draft.as_ref() == Some(d))
    }
}

/// A resident model as `ps` and `/metrics` show it.
#[derive(Clone)]
pub struct RunningModel {
    /// The model.
    pub info: Arc<ModelInfo>,
    /// Its slot on the engine, for the engine's status of it.
    pub slot: ModelSlot,
    /// Its weights' bytes, as measured at its load.
    pub weights_bytes: usize,
    /// Its planned bytes (see the module docs).
    pub footprint: usize,
    /// When it will be unloaded; `None`: never.
    pub expires: Option<Instant>,
}

/// Keeps the resident models and hands requests a [`Lease`] on one, shared by request
/// handlers. It decides which models are resident, not which sequence steps next: that is
/// the engine's step loop.
pub struct ModelKeeper {
    engine: Arc<Engine>,
    store: Store,
    /// The resident models, in the order they were loaded.
    residents: tokio::sync::Mutex<Vec<Arc<Entry>>>,
    /// One load at a time: two loads deciding on room together could both count the same
    /// free bytes.
    loading: tokio::sync::Mutex<()>,
    /// Signalled when a lease ends, so a load waiting for room looks again.
    released: Arc<Notify>,
    limits: ResidentLimits,
    queue: Arc<Semaphore>,
    capacity: usize,
    /// The draft model loaded beside targets whose Modelfile names none (`serve --draft`).
    default_draft: Option<ModelName>,
}

/// A request's hold on a resident model: while it lives, the model stays loaded, and its
/// `keep_alive` counts from when it ends.
pub struct Lease {
    /// The model.
    pub info: Arc<ModelInfo>,
    /// The engine running it.
    pub engine: Arc<Engine>,
    /// The model's slot on the engine, which its jobs name.
    pub slot: ModelSlot,
    entry: Arc<Entry>,
    keep_alive: KeepAlive,
    held: Option<OwnedRwLockReadGuard<()>>,
    released: Arc<Notify>,
    _queue_slot: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // From the request's end, as Ollama counts it: counted from its start, a generation
        // longer than its keep_alive unloaded its model the moment it ended.
        self.entry.set_expiry(self.keep_alive);
        self.held.take();
        self.released.notify_waiters();
    }
}

/// What an attempt to lease a resident model found.
enum Found {
    Leased(Lease),
    /// Not resident: it must be loaded.
    Absent(OwnedSemaphorePermit),
    /// Resident but being unloaded: wait for that, then look again.
    Leaving(Arc<Entry>, OwnedSemaphorePermit),
}

impl ModelKeeper {
    /// A keeper over `engine` admitting at most `capacity` requests at once (running or
    /// waiting); the one after gets [`LeaseError::Busy`]. Models are resident within
    /// [`ResidentLimits::from_env`].
    pub fn new(engine: Arc<Engine>, store: Store, capacity: usize) -> Arc<ModelKeeper> {
        ModelKeeper::with_default_draft(engine, store, capacity, None)
    }

    /// Like [`ModelKeeper::new`], loading `draft` beside every target whose Modelfile names no
    /// draft model and whose vocabulary it shares.
    pub fn with_default_draft(
        engine: Arc<Engine>,
        store: Store,
        capacity: usize,
        draft: Option<ModelName>,
    ) -> Arc<ModelKeeper> {
        ModelKeeper::with_limits(engine, store, capacity, draft, ResidentLimits::from_env())
    }

    /// Like [`ModelKeeper::with_default_draft`], with models resident within `limits`.
    pub fn with_limits(
        engine: Arc<Engine>,
        store: Store,
        capacity: usize,
        draft: Option<ModelName>,
        limits: ResidentLimits,
    ) -> Arc<ModelKeeper> {
        let keeper = Arc::new(ModelKeeper {
            engine,
            store,
            residents: tokio::sync::Mutex::new(Vec::new()),
            loading: tokio::sync::Mutex::new(()),
            released: Arc::new(Notify::new()),
            limits,
            queue: Arc::new(Semaphore::new(capacity)),
            capacity,
            default_draft: draft,
        });
        ModelKeeper::start_reaper(&keeper);
        keeper
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Takes a queue slot and the model `name`, loading it (and unloading others to make room)
    /// if needed. `keep_alive` sets how long it stays loaded after this request.
    pub async fn acquire(
        &self,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, LeaseError> {
        self.acquire_drafted(name, None, keep_alive).await
    }

    /// Like [`ModelKeeper::acquire`], with the draft model `draft` loaded beside the model
    /// (loading it again with that draft if it is resident with another or none).
    pub async fn acquire_drafted(
        &self,
        name: &ModelName,
        draft: Option<&ModelName>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, LeaseError> {
        if let Some(lost) = self.engine.group().and_then(|g| g.lost()) {
            return Err(LeaseError::GroupLost(lost));
        }
        let keep_alive = keep_alive.unwrap_or(KeepAlive::For(DEFAULT_KEEP_ALIVE));
        let mut queue_slot = self
            .queue
            .clone()
            .try_acquire_owned()
            .map_err(|_| LeaseError::Busy(self.capacity))?;
        loop {
            queue_slot = match self
                .lease_resident(name, draft, keep_alive, queue_slot)
                .await
            {
                Found::Leased(lease) => return Ok(lease),
                Found::Leaving(entry, queue_slot) => {
                    drop(entry.in_use.read().await);
                    queue_slot
                }
                Found::Absent(queue_slot) => {
                    let _loading = self.loading.lock().await;
                    // Another request may have loaded it while this one waited to load.
                    match self
                        .lease_resident(name, draft, keep_alive, queue_slot)
                        .await
                    {
                        Found::Leased(lease) => return Ok(lease),
                        Found::Leaving(_, queue_slot) => queue_slot,
                        Found::Absent(queue_slot) => {
                            return self.load(name, draft, keep_alive, queue_slot).await;
                        }
                    }
                }
            };
        }
    }

    /// A lease on the resident `name` (with `draft`), if it is resident.
    async fn lease_resident(
        &self,
        name: &ModelName,
        draft: Option<&ModelName>,
        keep_alive: KeepAlive,
        queue_slot: OwnedSemaphorePermit,
    ) -> Found {
        let residents = self.residents.lock().await;
        let Some(entry) = residents.iter().find(|e| e.serves(name, draft)) else {
            return Found::Absent(queue_slot);
        };
        match entry.in_use.clone().try_read_owned() {
            Ok(held) => Found::Leased(self.lease_on(entry, held, keep_alive, queue_slot)),
            Err(_) => Found::Leaving(Arc::clone(entry), queue_slot),
        }
    }

    fn lease_on(
        &self,
        entry: &Arc<Entry>,
        held: OwnedRwLockReadGuard<()>,
        keep_alive: KeepAlive,
        queue_slot: OwnedSemaphorePermit,
    ) -> Lease {
        entry.set_expiry(keep_alive);
        *lock(&entry.last_used) = Instant::now();
        Lease {
            info: Arc::clone(&entry.resident.info),
            engine: Arc::clone(&self.engine),
            slot: entry.resident.slot,
            entry: Arc::clone(entry),
            keep_alive,
            held: Some(held),
            released: Arc::clone(&self.released),
            _queue_slot: queue_slot,
        }
    }

    /// Loads `name` with `draft` (or its default draft) once there is room for it, and leases
    /// it. The caller holds `loading`.
    async fn load(
        &self,
        name: &ModelName,
        draft: Option<&ModelName>,
        keep_alive: KeepAlive,
        queue_slot: OwnedSemaphorePermit,
    ) -> Result<Lease, LeaseError> {
        let entry = self.store.get(name)?;
        if crate::capabilities::transcribes(&entry.manifest.details.capabilities) {
            return Err(LeaseError::NotGenerative(name.to_string()));
        }
        if crate::capabilities::only_drafts(&entry.manifest.details.capabilities) {
            return Err(LeaseError::OnlyDrafts(name.to_string()));
        }
        let dir = self.materialize(&entry.manifest).await?;
        // Which draft, whether the model fails to load without it (the request's or the
        // Modelfile's must load; the server's default may not fit every target), and whether it
        // drafts for requests that do not choose (the Modelfile's and the server's do; one a
        // request named drafts for requests naming it).
        let wanted = match (draft, &entry.manifest.draft) {
            (Some(draft), _) => Some((draft.clone(), true, false)),
            (None, Some(named)) => {
                let draft = ModelName::parse(named).map_err(|e| StoreError::BadManifest {
                    name: name.to_string(),
                    message: format!("its DRAFT: {e}"),
                })?;
                Some((draft, true, true))
            }
            (None, None) => self.default_draft.clone().map(|d| (d, false, true)),
        };
        let draft = match wanted {
            None => None,
            Some((draft, required, by_default)) => match self
                .draft_source(name, &entry.manifest, &dir, &draft, required, by_default)
                .await
            {
                Ok(source) => Some(source),
                Err(e) if !required => {
                    tracing::warn!("draft model `{draft}` not loaded: {e}");
                    None
                }
                Err(e) => return Err(e),
            },
        };
        let files = files_bytes(&entry.manifest)
            .saturating_add(draft.as_ref().map_or(0, |d| files_bytes(&d.manifest)));
        self.make_room(files).await?;
        let state = self.store.state_dir(&entry.manifest);
        let resident = self
            .engine
            .load(name.clone(), entry.manifest, dir, state, draft)
            .await?;
        let entry = Arc::new(Entry {
            resident,
            expires: Mutex::new(None),
            last_used: Mutex::new(Instant::now()),
            in_use: Arc::new(RwLock::new(())),
        });
        let held = Arc::clone(&entry.in_use)
            .try_read_owned()
            .map_err(|_| EngineError::NotLoaded)?;
        let lease = self.lease_on(&entry, held, keep_alive, queue_slot);
        self.residents.lock().await.push(entry);
        Ok(lease)
    }

    /// Unloads idle models, least recently used first, until a model of `needed` bytes fits
    /// beside the rest. While only models with requests in flight stand in the way, the least
    /// recently used of them is marked leaving: its requests in flight finish, its new ones
    /// wait behind this load (see `Found::Leaving`), and it unloads once the last one ends. A
    /// model kept busy without a pause (two clients taking turns) so cannot keep another out
    /// for good. Should another model fall idle first, it goes instead.
    async fn make_room(&self, needed: usize) -> Result<(), LeaseError> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            // Registered before the set is read: a lease that ends after the read wakes it.
            released.as_mut().enable();
            let residents = self.residents.lock().await;
            let used: usize = residents.iter().map(|e| e.resident.footprint()).sum();
            let fits = residents.len() < self.limits.max_models
                && used.saturating_add(needed) <= self.limits.bytes;
            if residents.is_empty() || fits {
                return Ok(());
            }
            let idle = residents
                .iter()
                .filter_map(|e| {
                    let held = Arc::clone(&e.in_use).try_write_owned().ok()?;
                    Some((Arc::clone(e), held))
                })
                .min_by_key(|(e, _)| *lock(&e.last_used));
            let (victim, held) = match idle {
                Some(idle) => {
                    drop(residents);
                    idle
                }
                None => {
                    let Some(busy) = residents.iter().min_by_key(|e| *lock(&e.last_used)) else {
                        return Ok(());
                    };
                    let busy = Arc::clone(busy);
                    drop(residents);
                    // tokio's RwLock is fair: from the moment this write waits, leases on the
                    // model wait too, so its requests in flight are the last it takes.
                    tokio::select! {
                        held = Arc::clone(&busy.in_use).write_owned() => (busy, held),
                        () = &mut released => continue,
                    }
                }
            };
            if self.take_out(&victim).await {
                tracing::info!(
                    "unloading {} to make room for another model",
                    victim.resident.info.name
                );
                let slot = victim.resident.slot;
                // Its tokenizer and grammar factory go before the engine's unload returns the
                // freed pages to the system, so that they are among them.
                drop(victim);
                self.engine.unload(slot).await?;
            }
            drop(held);
        }
    }

    /// Takes `entry` out of the resident set (its unload is the caller's, who holds it
    /// exclusively); whether it was still there.
    async fn take_out(&self, entry: &Arc<Entry>) -> bool {
        let mut residents = self.residents.lock().await;
        let before = residents.len();
        residents.retain(|e| !Arc::ptr_eq(e, entry));
        residents.len() < before
    }

    /// `manifest`'s files, verified, off the async runtime.
    async fn materialize(&self, manifest: &Manifest) -> Result<PathBuf, LeaseError> {
        let store = self.store.clone();
        let manifest = manifest.clone();
        Ok(
            tokio::task::spawn_blocking(move || store.materialize(&manifest))
                .await
                .map_err(|e| {
                    EngineError::Mlx(mlx::Error::Mlx(format!("verifying the model's files: {e}")))
                })??,
        )
    }

    /// The stored model `name`, ready to load beside `target` (with `manifest`, materialized
    /// in `target_dir`) as its draft model, its vocabulary checked against the target's.
    async fn draft_source(
        &self,
        target: &ModelName,
        manifest: &crate::store::Manifest,
        target_dir: &std::path::Path,
        name: &ModelName,
        required: bool,
        by_default: bool,
    ) -> Result<DraftSource, LeaseError> {
        let refuse = |reason: String| {
            EngineError::Load(LoadError::Draft {
                draft: name.to_string(),
                target: target.to_string(),
                reason,
            })
        };
        let entry = self.store.get(name).map_err(|e| refuse(e.to_string()))?;
        let dir = self
            .materialize(&entry.manifest)
            .await
            .map_err(|e| refuse(e.to_string()))?;
        let source = DraftSource {
            name: name.clone(),
            manifest: entry.manifest,
            dir,
            required,
            by_default,
        };
        let (target, manifest) = (target.clone(), manifest.clone());
        let target_dir = target_dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            check_draft_vocabulary(&target, &manifest, &target_dir, &source).map(|()| source)
        })
        .await
        .map_err(|e| refuse(format!("checking the vocabulary: {e}")))?
        .map_err(|e| LeaseError::Engine(EngineError::Load(e)))
    }

    /// The resident models, the most recently used first (as Ollama's `ps` lists them), for
    /// `ps` and `/metrics`.
    pub async fn running(&self) -> Vec<RunningModel> {
        let mut running: Vec<(Instant, RunningModel)> = self
            .residents
            .lock()
            .await
            .iter()
            .map(|e| {
                let model = RunningModel {
                    info: Arc::clone(&e.resident.info),
                    slot: e.resident.slot,
                    weights_bytes: e.resident.weights_bytes,
                    footprint: e.resident.footprint(),
                    expires: e.expiry(),
                };
                (*lock(&e.last_used), model)
            })
            .collect();
        running.sort_by_key(|(used, _)| std::cmp::Reverse(*used));
        running.into_iter().map(|(_, model)| model).collect()
    }

    /// Unloads `name` wherever it is resident (for `rm`, and `keep_alive: 0`), once the
    /// requests holding it end. Whether it was resident.
    pub async fn unload(&self, name: &ModelName) -> Result<bool, LeaseError> {
        let named: Vec<Arc<Entry>> = {
            let residents = self.residents.lock().await;
            residents
                .iter()
                .filter(|e| e.resident.info.name == *name)
                .cloned()
                .collect()
        };
        let mut unloaded = false;
        for entry in named {
            // Taken outside the set's lock: requests on other models go on meanwhile, and new
            // ones on this model wait for it to leave (see `Found::Leaving`).
            let held = Arc::clone(&entry.in_use).write_owned().await;
            if self.take_out(&entry).await {
                let slot = entry.resident.slot;
                // As in `make_room`: freed before the unload returns the pages.
                drop(entry);
                self.engine.unload(slot).await?;
                unloaded = true;
            }
            drop(held);
        }
        Ok(unloaded)
    }

    /// Unloads each model once its keep-alive has passed and no request holds it, and every
    /// model once the group it is split across has lost a rank: the group re-forms only once
    /// nothing holds it (see `group::rank_0`).
    fn start_reaper(keeper: &Arc<ModelKeeper>) {
        let weak = Arc::downgrade(keeper);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let Some(keeper) = weak.upgrade() else {
                    return;
                };
                let mut expired = Vec::new();
                let group_lost = keeper.engine.group().is_some_and(|g| g.lost().is_some());
                {
                    let mut residents = keeper.residents.lock().await;
                    residents.retain(|entry| {
                        // `try_write` fails while any request holds a lease: next tick.
                        let held = (group_lost || entry.expired())
                            .then(|| Arc::clone(&entry.in_use).try_write_owned().ok())
                            .flatten();
                        match held {
                            Some(held) => {
                                expired.push((entry.resident.slot, held));
                                false
                            }
                            None => true,
                        }
                    });
                }
                for (slot, held) in expired {
                    let _ = keeper.engine.unload(slot).await;
                    drop(held);
                }
            }
        });
    }
}

/// Bytes of `manifest`'s files: what a model not yet loaded is counted at.
fn files_bytes(manifest: &Manifest) -> usize {
    manifest
        .layers
        .iter()
        .map(|layer| usize::try_from(layer.size).unwrap_or(usize::MAX))
        .fold(0, usize::saturating_add)
}

/// How long to keep a model loaded after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// This long.
    For(Duration),
    /// Until unloaded explicitly or replaced.
    Forever,
}

impl KeepAlive {
    /// Parses Ollama's `keep_alive`: a number of seconds, or a duration like `5m`, `1h30m`,
    /// `10s`; negative means forever.
    pub fn parse(value: &serde_json::Value) -> Result<KeepAlive, String> {
        let seconds = match value {
            serde_json::Value::Number(n) => n.as_f64().ok_or("keep_alive is not a number")?,
            serde_json::Value::String(s) => parse_duration(s)?,
            other => {
                return Err(format!(
                    "keep_alive must be a number or a duration, got {other}"
                ));
            }
        };
        if seconds < 0.0 {
            return Ok(KeepAlive::Forever);
        }
        if !seconds.is_finite() || seconds > 1e9 {
            return Err(format!("keep_alive {seconds}s is too long"));
        }
        Ok(KeepAlive::For(Duration::from_secs_f64(seconds)))
    }

    /// The duration, `None` for forever.
    pub fn duration(self) -> Option<Duration> {
        match self {
            KeepAlive::For(d) => Some(d),
            KeepAlive::Forever => None,
        }
    }
}

fn parse_duration(text: &str) -> Result<f64, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Ok(seconds);
    }
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let mut total = 0.0;
    let mut number = String::new();
    let mut chars = body.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let unit = if c == 'm' && chars.peek() == Some(&'s') {
            chars.next();
            0.001
        } else {
            match c {
                'h' => 3600.0,
                'm' => 60.0,
                's' => 1.0,
                _ => return Err(format!("invalid duration `{text}`")),
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("invalid duration `{text}`"))?;
        total += value * unit;
        number.clear();
        any = true;
    }
    if !number.is_empty() || !any {
        return Err(format!("invalid duration `{text}`"));
    }
    Ok(if negative { -total } else { total })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_forms() {
        use serde_json::json;
        assert_eq!(
            KeepAlive::parse(&json!(0)).unwrap(),
            KeepAlive::For(Duration::ZERO)
        );
        assert_eq!(
            KeepAlive::parse(&json!("5m")).unwrap(),
            KeepAlive::For(Duration::from_secs(300))
        );
        assert_eq!(
            KeepAlive::parse(&json!("1h30m")).unwrap(),
            KeepAlive::For(Duration::from_secs(5400))
        );
        assert_eq!(KeepAlive::parse(&json!("-1")).unwrap(), KeepAlive::Forever);
        assert_eq!(KeepAlive::parse(&json!(-1)).unwrap(), KeepAlive::Forever);
        assert!(KeepAlive::parse(&json!("soon")).is_err());
        assert!(KeepAlive::parse(&json!([1])).is_err());
    }
}
