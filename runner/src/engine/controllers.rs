//! The depth controllers of a loaded model, one per drafter kind ([`Controllers`]): what the
//! rounds measured (acceptance, the cost of a round per depth and batch), kept across restarts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use speculate::DepthController;

use crate::engine::job::DrafterKind;
use crate::engine::speculating::MAX_DRAFT_DEPTH;

/// One depth controller per drafter kind, shared by the sequences of a loaded model. When it
/// has a folder, each controller is read from `<folder>/<drafter>.json` at once and written
/// back every [`SAVE_EVERY`] rounds and when the model is unloaded, so a restarted
/// server starts at the depth it had learned; its recent decisions go to
/// `<folder>/<drafter>.log.json` for `mlxkit bench --replay`. A draft model's controller is
/// kept per draft model (`draft-<name>.json`): another draft has other acceptance and costs.
#[derive(Default)]
pub struct Controllers {
    by_drafter: HashMap<DrafterKind, DepthController>,
    dir: Option<PathBuf>,
    /// The loaded draft model's name, which names its controller's files.
    draft_model: Option<String>,
    unsaved: usize,
    /// The deepest round each kind may search ([`Controllers::cap`]).
    caps: HashMap<DrafterKind, usize>,
    /// This step's decisions, per drafter kind and rows in the batch ([`Controllers::depth`]).
    decided: HashMap<(DrafterKind, usize), usize>,
}

/// Rounds between two writes of the controllers.
const SAVE_EVERY: usize = 256;

impl Controllers {
    /// Controllers kept in `dir`, with what it holds already read; `draft_model` names the
    /// draft model loaded beside the target, if any.
    pub fn persisted(dir: PathBuf, draft_model: Option<&str>) -> Controllers {
        let mut controllers = Controllers {
            by_drafter: HashMap::new(),
            dir: Some(dir),
            draft_model: draft_model.map(str::to_string),
            unsaved: 0,
            caps: HashMap::new(),
            decided: HashMap::new(),
        };
        let model_stem = controllers.file_stem(DrafterKind::Model);
        let kinds: Vec<DrafterKind> = controllers
            .dir
            .as_ref()
            .and_then(|dir| std::fs::read_dir(dir).ok())
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".json")?;
                if stem == model_stem && draft_model.is_some() {
                    return Some(DrafterKind::Model);
                }
                DrafterKind::parse(&stem.replace('-', ":"))
            })
            .collect();
        for kind in kinds {
            if let Some(saved) = controllers.path(kind).filter(|p| p.exists()).and_then(|p| {
                DepthController::load(&p)
                    .map_err(|e| tracing::warn!("ignoring {}: {e}", p.display()))
                    .ok()
            }) {
                controllers.by_drafter.insert(kind, saved);
            }
        }
        controllers
    }

    /// The name of `kind`'s controller files (`ngram`, `self-4`, `draft-smollm2-135m`).
    fn file_stem(&self, kind: DrafterKind) -> String {
        match (kind, &self.draft_model) {
            (DrafterKind::Model, Some(name)) => {
                let safe: String = name
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect();
                format!("draft-{safe}")
            }
            _ => kind.name().replace(':', "-"),
        }
    }

    fn path(&self, kind: DrafterKind) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.json", self.file_stem(kind))))
    }

    pub(super) fn get(&mut self, kind: DrafterKind) -> &mut DepthController {
        let deepest = self.caps.get(&kind).copied().unwrap_or(MAX_DRAFT_DEPTH);
        self.by_drafter
            .entry(kind)
            .or_insert_with(|| DepthController::new(deepest))
    }

    /// Starts a step: the decisions of the last one are forgotten.
    pub(super) fn begin_step(&mut self) {
        self.decided.clear();
    }

    /// The depth `kind`'s controller chooses for a batch of `batch` rows in this step, decided
    /// once per step and shared by every sequence of that kind in the batch.
    ///
    /// Deciding per sequence made each of a batch's sequences a decision on the probe
    /// schedule: with eight of them, about one sequence in every step probed (a test's eight
    /// 40-token requests made 257 decisions), and its round, a host sync, ran beside the
    /// pipelined plain forward of the others. Once per step, a probe takes one step in eight
    /// (one in 64 once probes keep failing), and what it measures is the whole batch drafting
    /// at that depth, which is what the batch's bucket estimates.
    pub(super) fn depth(&mut self, kind: DrafterKind, batch: usize) -> usize {
        if let Some(&depth) = self.decided.get(&(kind, batch)) {
            return depth;
        }
        let depth = self.get(kind).depth(batch);
        self.decided.insert((kind, batch), depth);
        depth
    }

    /// Keeps `kind`'s controller from searching past `deepest`, the most a drafter of that
    /// kind proposes (a block drafter's masks): a depth it can never run would never be
    /// measured, and would look best. A controller that learnt deeper starts afresh.
    pub(super) fn cap(&mut self, kind: DrafterKind, deepest: usize) {
        self.caps.insert(kind, deepest);
        if self
            .by_drafter
            .get(&kind)
            .is_some_and(|c| c.max_depth() > deepest)
        {
            self.by_drafter.remove(&kind);
        }
    }

    /// The caps set so far, to carry into controllers read from disk.
    pub(super) fn caps(&self) -> Vec<(DrafterKind, usize)> {
        self.caps.iter().map(|(k, d)| (*k, *d)).collect()
    }

    /// Records a finished round with `kind`'s controller.
    pub(super) fn observe(
        &mut self,
        kind: DrafterKind,
        batch: usize,
        depth: usize,
        accepted: usize,
        cost: Duration,
    ) {
        self.get(kind).observe(batch, depth, accepted, cost);
        self.unsaved += 1;
        if self.unsaved >= SAVE_EVERY {
            self.save();
        }
    }

    /// Writes every controller to the folder (failures are logged: serving goes on).
    pub fn save(&mut self) {
        self.unsaved = 0;
        let Some(dir) = &self.dir else {
            return;
        };
        if let Err(e) = std::fs::create_dir_all(dir) {
            tracing::warn!("cannot keep depth controllers in {}: {e}", dir.display());
            return;
        }
        for (kind, controller) in &self.by_drafter {
            let stem = self.file_stem(*kind);
            let path = dir.join(format!("{stem}.json"));
            if let Err(e) = controller.save(&path) {
                tracing::warn!("saving {}: {e}", path.display());
            }
            // Its recent decisions, for `mlxkit bench --replay`.
            let log = dir.join(format!("{stem}.log.json"));
            if let Err(e) = std::fs::write(&log, controller.log().to_json()) {
                tracing::warn!("saving {}: {e}", log.display());
            }
        }
    }

    /// The depth the controller of `kind` would pick now for a lone sequence (for `ps`).
    pub fn current_depth(&self, kind: DrafterKind) -> Option<usize> {
        self.by_drafter.get(&kind).map(|c| c.best(1))
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        if !self.by_drafter.is_empty() {
            self.save();
        }
    }
}
