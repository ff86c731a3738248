//! Which model is loaded: load on first use, unload after `keep_alive`, one model at a time,
//! and a bounded queue of requests in front of the engine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedRwLockReadGuard, OwnedSemaphorePermit, RwLock, Semaphore};

use std::path::PathBuf;

use crate::engine::from_store::check_draft_vocabulary;
use crate::engine::{DraftSource, Engine, EngineError, LoadError, ModelInfo};
use crate::model_name::ModelName;
use crate::store::{Store, StoreError};

/// How long a model stays loaded after its last request, unless the request says otherwise.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(300);

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
}

struct Loaded {
    info: Arc<ModelInfo>,
    /// When the model may be unloaded; `None` keeps it forever (negative keep_alive). Behind
    /// its own lock so a request holding the model can set it.
    expires: std::sync::Mutex<Option<Instant>>,
}

impl Loaded {
    fn set_expiry(&self, keep_alive: KeepAlive) {
        let expiry = keep_alive
            .duration()
            .and_then(|d| Instant::now().checked_add(d));
        if let Ok(mut expires) = self.expires.lock() {
            *expires = expiry;
        }
    }

    fn expiry(&self) -> Option<Instant> {
        self.expires.lock().ok().and_then(|e| *e)
    }

    /// Whether it is `name` with `draft` beside it (any draft, or none, when `None`).
    fn serves(&self, name: &ModelName, draft: Option<&ModelName>) -> bool {
        self.info.name == *name && draft.is_none_or(|d| self.info.draft.as_ref() == Some(d))
    }
}

/// Keeps the loaded model and hands requests a [`Lease`] on it, shared by request handlers.
/// It decides which model is resident, not which sequence steps next: that is the engine's
/// step loop.
pub struct ModelKeeper {
    engine: Arc<Engine>,
    store: Store,
    loaded: Arc<RwLock<Option<Loaded>>>,
    queue: Arc<Semaphore>,
    capacity: usize,
    /// The draft model loaded beside targets whose Modelfile names none (`serve --draft`).
    default_draft: Option<ModelName>,
}

/// A request's hold on the loaded model: while it lives, the model stays loaded.
pub struct Lease {
    /// The model.
    pub info: Arc<ModelInfo>,
    /// The engine running it.
    pub engine: Arc<Engine>,
    _model: OwnedRwLockReadGuard<Option<Loaded>>,
    _slot: OwnedSemaphorePermit,
}

impl ModelKeeper {
    /// A keeper over `engine` admitting at most `capacity` requests at once (running or
    /// waiting); the one after gets [`LeaseError::Busy`].
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
        let keeper = Arc::new(ModelKeeper {
            engine,
            store,
            loaded: Arc::new(RwLock::new(None)),
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

    /// Takes a queue slot and the model `name`, loading it (and unloading another) if needed.
    /// `keep_alive` sets how long it stays loaded after this request.
    pub async fn acquire(
        &self,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, LeaseError> {
        self.acquire_drafted(name, None, keep_alive).await
    }

    /// Like [`ModelKeeper::acquire`], with the draft model `draft` loaded beside the model
    /// (reloading it with that draft if it is loaded with another or none).
    pub async fn acquire_drafted(
        &self,
        name: &ModelName,
        draft: Option<&ModelName>,
        keep_alive: Option<KeepAlive>,
    ) -> Result<Lease, LeaseError> {
        let slot = self
            .queue
            .clone()
            .try_acquire_owned()
            .map_err(|_| LeaseError::Busy(self.capacity))?;
        loop {
            let guard = self.loaded.clone().read_owned().await;
            if let Some(loaded) = guard.as_ref().filter(|l| l.serves(name, draft)) {
                loaded.set_expiry(keep_alive.unwrap_or(KeepAlive::For(DEFAULT_KEEP_ALIVE)));
                return Ok(Lease {
                    info: loaded.info.clone(),
                    engine: Arc::clone(&self.engine),
                    _model: guard,
                    _slot: slot,
                });
            }
            drop(guard);
            self.switch_to(name, draft).await?;
            // Another request may switch models before we read again; the loop takes care.
        }
    }

    /// Loads `name` with `draft` (or its default draft) unless it already is, unloading the
    /// current model first.
    async fn switch_to(
        &self,
        name: &ModelName,
        draft: Option<&ModelName>,
    ) -> Result<(), LeaseError> {
        let mut slot = self.loaded.write().await;
        if slot.as_ref().is_some_and(|l| l.serves(name, draft)) {
            return Ok(());
        }
        let entry = self.store.get(name)?;
        if crate::capabilities::transcribes(&entry.manifest.details.capabilities) {
            return Err(LeaseError::NotGenerative(name.to_string()));
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
        *slot = None;
        let state = self.store.state_dir(&entry.manifest);
        let info = self
            .engine
            .load(name.clone(), entry.manifest, dir, state, draft)
            .await?;
        *slot = Some(Loaded {
            info,
            expires: std::sync::Mutex::new(Instant::now().checked_add(DEFAULT_KEEP_ALIVE)),
        });
        Ok(())
    }

    /// `manifest`'s files, verified, off the async runtime.
    async fn materialize(&self, manifest: &crate::store::Manifest) -> Result<PathBuf, LeaseError> {
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

    /// Sets the expiry of the loaded model `name` (a request with `keep_alive: 0` unloads it
    /// right after; negative keeps it forever).
    pub async fn set_keep_alive(&self, name: &ModelName, keep_alive: KeepAlive) {
        if let Some(loaded) = self
            .loaded
            .read()
            .await
            .as_ref()
            .filter(|l| l.info.name == *name)
        {
            loaded.set_expiry(keep_alive);
        }
    }

    /// The loaded model and when it expires, for `ps`.
    pub async fn running(&self) -> Option<(Arc<ModelInfo>, Option<Instant>)> {
        self.loaded
            .read()
            .await
            .as_ref()
            .map(|l| (l.info.clone(), l.expiry()))
    }

    /// Unloads `name` if it is loaded (for `rm`, and `keep_alive: 0`).
    pub async fn unload(&self, name: &ModelName) -> Result<bool, LeaseError> {
        let mut slot = self.loaded.write().await;
        if slot.as_ref().is_some_and(|l| l.info.name == *name) {
            *slot = None;
            self.engine.unload().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Unloads the model once its keep-alive has passed and no request holds it.
    fn start_reaper(keeper: &Arc<ModelKeeper>) {
        let weak = Arc::downgrade(keeper);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let Some(keeper) = weak.upgrade() else {
                    return;
                };
                let expired = |slot: &Option<Loaded>| {
                    slot.as_ref()
                        .and_then(Loaded::expiry)
                        .is_some_and(|t| Instant::now() >= t)
                };
                if expired(&*keeper.loaded.read().await) {
                    // `try_write` fails while any request holds a lease: try again next tick.
                    if let Ok(mut slot) = keeper.loaded.try_write()
                        && expired(&slot)
                    {
                        *slot = None;
                        let _ = keeper.engine.unload().await;
                    }
                }
            }
        });
    }
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
