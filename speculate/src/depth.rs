//! Choosing the draft depth: the number of tokens to draft that maximises committed tokens per
//! second.
//!
//! # Model
//!
//! A round that drafts `k` tokens commits `1 + (accepted drafts)` tokens. Write
//! `a_j = P(draft j accepted | drafts before j accepted)`; then the expected number of
//! committed tokens is `E(k) = 1 + Σ_{i=1..k} Π_{j<=i} a_j`. A round at depth `k` observes
//! `a_1 ..= a_{accepted+1}` (the positions it reached), each as accepted or not; the `a_j` are
//! shared by every batch size, because acceptance is a property of the text and the drafter.
//!
//! Cost is not: a round's seconds (the step it ran in) depend on the depth and on how many rows
//! share the step, because a small batch is memory bound (drafts nearly free) and a large one
//! compute bound. So cost is measured per depth and per batch bucket (1, 2, 3–4, 5–8, 9–16,
//! 17+ rows).
//!
//! Both are decayed averages: an observation enters as `mean += (x - mean) / weight` with
//! `weight = decay * weight + 1`, so old evidence fades geometrically. Acceptance decays by
//! 0.98 per observation of its position (half-life ~34 observations, an effective window of
//! 50: a text changing from prose to a code block moves it within a few dozen rounds while a
//! Bernoulli estimate over 50 has up to ±0.07 noise); cost by 0.9 (an effective window of 10:
//! step times follow the context length and the machine's load, and are far less noisy).
//! Acceptance starts at an optimistic 0.8 worth 2 observations, so speculation is tried
//! before it is measured.
//!
//! # Decisions
//!
//! The choice is `argmax_k E(k) / cost(k)` over the depths whose cost in this bucket was
//! observed at least twice (ties to the smaller depth: less wasted compute). That ratio is
//! quasi-concave in `k` (`E` is concave and increasing, cost increasing), so a local search
//! finds its maximum: every 8th decision in a bucket probes a neighbour of the best depth
//! instead, alternating above and below (only 1 when the best is 0, so plain decoding keeps
//! testing whether speculation started to pay). A probe costs at most the gap to a neighbour,
//! and keeps the neighbours' costs fresh. From depth 0, each probe that does not pay (commits
//! fewer tokens per second than plain decoding, whether its drafts were rejected or cost more
//! than they saved) doubles the wait before the next, up to every 64th decision, and one that
//! pays brings it back to every 8th: a drafter that never pays (an expensive draft model that
//! rarely agrees with its target) then costs a probe in 64 rounds rather than one in 8. A probe
//! much dearer than a plain step waits longer still, so that probes take at most 1/64 of the
//! decoding time (up to every 1,024th decision). A bucket with no measured depth yet starts at the
//! best depth of the nearest bucket that has one, else at 3; once that depth is measured, its
//! next decisions measure plain decoding (depth 0) before anything else. Without that, plain
//! decoding was reached only by probing down one depth at a time, each probed depth needing
//! two samples: a drafter that never paid drafted at a losing depth for about a hundred rounds
//! (most of a cold request); with it, the optimistic prior fades within a dozen.
//!
//! # Persistence and replay
//!
//! [`DepthController::to_json`] / [`from_json`](DepthController::from_json) (and
//! [`save`](DepthController::save) / [`load`](DepthController::load)) keep what was learnt
//! across restarts. Every decision and observation is also kept, for offline analysis, in a
//! bounded [`DecisionLog`] together with the state before its oldest event, so [`replay`]
//! reproduces every logged decision even after older events were dropped.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The deepest draft a [`DepthController`] considers; deeper requests are clamped.
pub const MAX_DEPTH: usize = 64;

/// How many events a [`DecisionLog`] keeps unless told otherwise.
pub const DEFAULT_LOG_CAPACITY: usize = 10_000;

/// The version of the JSON written by [`DepthController::to_json`].
const VERSION: u32 = 1;
/// Batch buckets: 1, 2, 3–4, 5–8, 9–16, 17+ rows.
const BUCKETS: usize = 6;
const ACCEPT_DECAY: f64 = 0.98;
const COST_DECAY: f64 = 0.9;
const ACCEPT_PRIOR: f64 = 0.8;
const ACCEPT_PRIOR_WEIGHT: f64 = 2.0;
/// Cost observations a depth needs before it can be chosen: one could be a stray slow step.
const MIN_SAMPLES: u64 = 2;
/// Every this many decisions in a bucket, one probes a neighbour of the best depth.
const PROBE_EVERY: u64 = 8;
/// From depth 0, failed probes double the probe interval up to this many times (every 64th
/// decision).
const MAX_PROBE_BACKOFF: u32 = 3;
/// From depth 0, the most of the decoding time that probes may take: a probe costing ten plain
/// steps more waits for 640 decisions.
const PROBE_SHARE: f64 = 1.0 / 64.0;
/// The longest wait between probes from depth 0, in decisions.
const MAX_PROBE_INTERVAL: u64 = 1024;
/// The first depth tried when nothing is known.
const START_DEPTH: usize = 3;
/// A floor on costs so that a zero-length round cannot divide by zero.
const MIN_COST_S: f64 = 1e-9;

fn bucket(batch: usize) -> usize {
    match batch {
        0..=1 => 0,
        2 => 1,
        3..=4 => 2,
        5..=8 => 3,
        9..=16 => 4,
        _ => 5,
    }
}

/// A decayed average: see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decayed {
    mean: f64,
    weight: f64,
    samples: u64,
}

impl Decayed {
    const EMPTY: Decayed = Decayed {
        mean: 0.0,
        weight: 0.0,
        samples: 0,
    };

    fn add(&mut self, x: f64, decay: f64) {
        self.weight = self.weight * decay + 1.0;
        self.mean += (x - self.mean) / self.weight;
        self.samples = self.samples.saturating_add(1);
    }

    fn is_valid(&self, lo: f64, hi: f64) -> bool {
        self.mean.is_finite()
            && self.mean >= lo
            && self.mean <= hi
            && self.weight.is_finite()
            && self.weight >= 0.0
    }
}

/// What a controller has learnt: everything its decisions depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Model {
    version: u32,
    max_depth: usize,
    /// `accept[j - 1]` estimates `a_j`.
    accept: Vec<Decayed>,
    /// `cost[bucket][k]`: seconds of a round at depth `k`.
    cost: Vec<Vec<Decayed>>,
    /// Decisions made per bucket: the probe schedule's clock.
    rounds: Vec<u64>,
    /// Per bucket: probes from depth 0 rejected in a row (capped), which stretch the
    /// interval between probes. States written before it existed read as none.
    #[serde(default = "no_backoff")]
    backoff: Vec<u32>,
}

fn no_backoff() -> Vec<u32> {
    vec![0; BUCKETS]
}

impl Model {
    fn new(max_depth: usize) -> Model {
        let max_depth = max_depth.min(MAX_DEPTH);
        let prior = Decayed {
            mean: ACCEPT_PRIOR,
            weight: ACCEPT_PRIOR_WEIGHT,
            samples: 0,
        };
        Model {
            version: VERSION,
            max_depth,
            accept: vec![prior; max_depth],
            cost: vec![vec![Decayed::EMPTY; max_depth + 1]; BUCKETS],
            rounds: vec![0; BUCKETS],
            backoff: no_backoff(),
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidState(reason));
        if self.version != VERSION {
            return bad(format!(
                "version {} (this build reads {VERSION})",
                self.version
            ));
        }
        if self.max_depth > MAX_DEPTH {
            return bad(format!("max_depth {} exceeds {MAX_DEPTH}", self.max_depth));
        }
        if self.accept.len() != self.max_depth {
            return bad(format!(
                "{} acceptance rates for max_depth {}",
                self.accept.len(),
                self.max_depth
            ));
        }
        if let Some(j) = self.accept.iter().position(|a| !a.is_valid(0.0, 1.0)) {
            return bad(format!("acceptance rate {} is not a probability", j + 1));
        }
        if self.cost.len() != BUCKETS
            || self.rounds.len() != BUCKETS
            || self.backoff.len() != BUCKETS
        {
            return bad(format!(
                "{} cost buckets, {} round counters and {} probe backoffs; expected {BUCKETS}",
                self.cost.len(),
                self.rounds.len(),
                self.backoff.len()
            ));
        }
        if let Some(b) = self.backoff.iter().position(|&n| n > MAX_PROBE_BACKOFF) {
            return bad(format!(
                "bucket {b}'s probe backoff exceeds {MAX_PROBE_BACKOFF}"
            ));
        }
        for (b, row) in self.cost.iter().enumerate() {
            if row.len() != self.max_depth + 1 {
                return bad(format!(
                    "bucket {b} has {} costs; expected {}",
                    row.len(),
                    self.max_depth + 1
                ));
            }
            if let Some(k) = row.iter().position(|c| !c.is_valid(0.0, f64::MAX)) {
                return bad(format!(
                    "bucket {b}, depth {k}: cost is not a finite duration"
                ));
            }
        }
        Ok(())
    }

    /// `E(k)` for `k` in `0..=max_depth`.
    fn expected(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.max_depth + 1);
        let (mut e, mut reach) = (1.0, 1.0);
        out.push(e);
        for a in &self.accept {
            reach *= a.mean;
            e += reach;
            out.push(e);
        }
        out
    }

    /// The measured depth with the most tokens per second in bucket `b`, if any is measured.
    fn best(&self, b: usize) -> Option<usize> {
        let expected = self.expected();
        let mut best: Option<(usize, f64)> = None;
        for (k, cost) in self.cost[b].iter().enumerate() {
            if cost.samples < MIN_SAMPLES {
                continue;
            }
            let rate = expected[k] / cost.mean.max(MIN_COST_S);
            if best.is_none_or(|(_, r)| rate > r) {
                best = Some((k, rate));
            }
        }
        best.map(|(k, _)| k)
    }

    /// The depth for a bucket with nothing measured: the nearest measured bucket's best.
    fn start(&self, b: usize) -> usize {
        for distance in 1..BUCKETS {
            let below = b.checked_sub(distance);
            let above = Some(b + distance).filter(|&a| a < BUCKETS);
            if let Some(k) = below.into_iter().chain(above).find_map(|n| self.best(n)) {
                return k;
            }
        }
        START_DEPTH.min(self.max_depth)
    }

    /// The best depth, as [`DepthController::best`] documents.
    fn choice(&self, b: usize) -> usize {
        self.best(b).unwrap_or_else(|| self.start(b))
    }

    /// Decisions between two probes of depth 1 while the best depth in bucket `b` is 0: the
    /// backoff's wait, or longer when a probe costs so much more than a plain step that
    /// probing that often would take more than [`PROBE_SHARE`] of the time.
    fn probe_interval_from_zero(&self, b: usize) -> u64 {
        let backoff = PROBE_EVERY << self.backoff[b];
        let (Some(plain), Some(probe)) = (self.cost[b].first(), self.cost[b].get(1)) else {
            return backoff;
        };
        if plain.samples == 0 || probe.samples == 0 {
            return backoff;
        }
        let extra = (probe.mean - plain.mean).max(0.0) / (PROBE_SHARE * plain.mean.max(MIN_COST_S));
        backoff.max((extra.ceil() as u64).min(MAX_PROBE_INTERVAL))
    }

    fn decide(&mut self, batch: usize) -> usize {
        let b = bucket(batch);
        self.rounds[b] = self.rounds[b].wrapping_add(1);
        let round = self.rounds[b];
        let Some(best) = self.best(b) else {
            return self.start(b);
        };
        // Plain decoding is what every depth must beat: measure it as soon as a depth above
        // it is measured, rather than reaching it probe by probe.
        if best > 0 && self.cost[b][0].samples < MIN_SAMPLES {
            return 0;
        }
        let interval = if best == 0 {
            self.probe_interval_from_zero(b)
        } else {
            PROBE_EVERY
        };
        if self.max_depth == 0 || !round.is_multiple_of(interval) {
            return best;
        }
        let up = (round / PROBE_EVERY) % 2 == 1;
        if best == 0 || (up && best < self.max_depth) {
            best + 1
        } else {
            best - 1
        }
    }

    fn observe(&mut self, batch: usize, depth: usize, accepted: usize, cost: Duration) {
        let depth = depth.min(self.max_depth);
        let accepted = accepted.min(depth);
        self.cost[bucket(batch)][depth].add(cost.as_secs_f64(), COST_DECAY);
        // Positions 1..=accepted were accepted; position accepted + 1, if drafted, was the
        // first rejection; later positions were never reached and say nothing.
        let reached = depth.min(accepted + 1);
        for (j, a) in self.accept[..reached].iter_mut().enumerate() {
            a.add(if j < accepted { 1.0 } else { 0.0 }, ACCEPT_DECAY);
        }
        // A probe from depth 0: one that did not pay stretches the wait for the next, one that
        // did (or a best depth above 0) restores it. Paying means committing tokens at least
        // as fast as plain decoding: an accepted draft is not enough when the drafter costs
        // more than it saves (a draft model catching up on the text it skipped).
        let b = bucket(batch);
        let plain = &self.cost[b][0];
        let paid = match plain.samples {
            0 => accepted > 0,
            _ => (1 + accepted) as f64 * plain.mean >= cost.as_secs_f64(),
        };
        self.backoff[b] = match self.best(b) {
            Some(0) if depth > 0 && !paid => (self.backoff[b] + 1).min(MAX_PROBE_BACKOFF),
            Some(0) if depth == 0 => self.backoff[b],
            _ => 0,
        };
    }
}

/// One call a [`DepthController`] received, as kept in its [`DecisionLog`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// [`DepthController::depth`] was asked about a sequence in a batch of `batch` rows and
    /// answered `depth`.
    Depth {
        /// Rows in the batch.
        batch: usize,
        /// The depth returned.
        depth: usize,
    },
    /// [`DepthController::observe`] was told about a finished round.
    Observe {
        /// Rows in the batch.
        batch: usize,
        /// Tokens drafted.
        depth: usize,
        /// Drafts accepted.
        accepted: usize,
        /// The round's cost.
        cost: Duration,
    },
}

/// A controller's recent history: the learnt state before the oldest event it keeps, then the
/// events, oldest first. When full, the oldest event is folded into that state, so the log
/// always replays exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionLog {
    start: Model,
    events: VecDeque<Event>,
    capacity: usize,
}

impl DecisionLog {
    fn new(start: Model, capacity: usize) -> DecisionLog {
        DecisionLog {
            start,
            events: VecDeque::new(),
            capacity,
        }
    }

    fn push(&mut self, event: Event) {
        self.events.push_back(event);
        self.trim();
    }

    fn trim(&mut self) {
        while self.events.len() > self.capacity {
            let Some(oldest) = self.events.pop_front() else {
                break;
            };
            match oldest {
                Event::Depth { batch, .. } => {
                    self.start.decide(batch);
                }
                Event::Observe {
                    batch,
                    depth,
                    accepted,
                    cost,
                } => self.start.observe(batch, depth, accepted, cost),
            }
        }
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> impl ExactSizeIterator<Item = &Event> + '_ {
        self.events.iter()
    }

    /// How many events are kept.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is kept.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// How many events it keeps at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The controller as it was before the oldest event kept (with an empty log of the same
    /// capacity).
    pub fn start(&self) -> DepthController {
        DepthController::from_model(self.start.clone(), self.capacity)
    }

    /// Re-feeds the events to [`start`](DecisionLog::start): see [`replay`].
    pub fn replay(&self) -> Replay {
        replay(self.start(), self.events())
    }

    /// The log as JSON, for offline analysis.
    pub fn to_json(&self) -> String {
        // Serialising plain numbers, strings and sequences cannot fail.
        serde_json::to_string(self).expect("a decision log serialises")
    }

    /// A log written by [`to_json`](DecisionLog::to_json).
    ///
    /// Fails with [`Error::Json`] on malformed JSON and [`Error::InvalidState`] when its state
    /// is inconsistent or it holds more events than its capacity.
    pub fn from_json(s: &str) -> Result<DecisionLog> {
        let log: DecisionLog = serde_json::from_str(s)?;
        log.start.validate()?;
        if log.events.len() > log.capacity {
            return Err(Error::InvalidState(format!(
                "{} events in a log of capacity {}",
                log.events.len(),
                log.capacity
            )));
        }
        Ok(log)
    }
}

/// The outcome of [`replay`].
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The controller after every event.
    pub controller: DepthController,
    /// The number of [`Event::Depth`] events replayed.
    pub decisions: usize,
    /// The decisions that came out differently.
    pub mismatches: Vec<Mismatch>,
}

/// A logged decision that a replay did not reproduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The event's index among those replayed.
    pub event: usize,
    /// Its batch size.
    pub batch: usize,
    /// The depth logged.
    pub logged: usize,
    /// The depth the replay chose.
    pub replayed: usize,
}

/// Feeds `events` to `controller` in order, as the calls they record, and compares each
/// decision with the logged one. From the state a [`DecisionLog`] started at, every decision
/// is reproduced (the controller is deterministic); from another state (a different
/// `max_depth`, a fresh controller for a log that dropped events) the mismatches show where
/// it would have decided differently.
pub fn replay<'a>(
    mut controller: DepthController,
    events: impl IntoIterator<Item = &'a Event>,
) -> Replay {
    let mut decisions = 0;
    let mut mismatches = Vec::new();
    for (index, event) in events.into_iter().enumerate() {
        match *event {
            Event::Depth { batch, depth } => {
                decisions += 1;
                let replayed = controller.depth(batch);
                if replayed != depth {
                    mismatches.push(Mismatch {
                        event: index,
                        batch,
                        logged: depth,
                        replayed,
                    });
                }
            }
            Event::Observe {
                batch,
                depth,
                accepted,
                cost,
            } => controller.observe(batch, depth, accepted, cost),
        }
    }
    Replay {
        controller,
        decisions,
        mismatches,
    }
}

/// Chooses each round's draft depth to maximise expected committed tokens per second; see
/// the module doc for the model.
///
/// One controller serves every speculating sequence of a model: [`depth`](Self::depth) before
/// drafting, [`observe`](Self::observe) after verifying.
#[derive(Debug, Clone, PartialEq)]
pub struct DepthController {
    model: Model,
    log: DecisionLog,
}

impl DepthController {
    /// A controller that knows nothing yet, for depths `0..=max_depth` (clamped to
    /// [`MAX_DEPTH`]), logging the last [`DEFAULT_LOG_CAPACITY`] events.
    pub fn new(max_depth: usize) -> DepthController {
        DepthController::from_model(Model::new(max_depth), DEFAULT_LOG_CAPACITY)
    }

    fn from_model(model: Model, capacity: usize) -> DepthController {
        DepthController {
            log: DecisionLog::new(model.clone(), capacity),
            model,
        }
    }

    /// The deepest draft it chooses.
    pub fn max_depth(&self) -> usize {
        self.model.max_depth
    }

    /// The depth for the next round of a sequence in a batch of `batch` rows: the best
    /// measured depth, or a neighbour of it when this decision is a probe.
    pub fn depth(&mut self, batch: usize) -> usize {
        let depth = self.model.decide(batch);
        self.log.push(Event::Depth { batch, depth });
        depth
    }

    /// The depth it currently believes best for a batch of `batch` rows, without probing or
    /// advancing the probe schedule (for statistics, and the decision it exploits).
    pub fn best(&self, batch: usize) -> usize {
        self.model.choice(bucket(batch))
    }

    /// A finished round: `depth` tokens were drafted in a batch of `batch` rows, `accepted` of
    /// them were accepted, and the step it ran in took `cost`. A depth above
    /// [`max_depth`](Self::max_depth) is counted as `max_depth`, and `accepted` above `depth`
    /// as `depth`.
    pub fn observe(&mut self, batch: usize, depth: usize, accepted: usize, cost: Duration) {
        self.model.observe(batch, depth, accepted, cost);
        self.log.push(Event::Observe {
            batch,
            depth,
            accepted,
            cost,
        });
    }

    /// The estimated conditional acceptance rates `a_1 ..= a_max_depth`.
    pub fn acceptance(&self) -> Vec<f64> {
        self.model.accept.iter().map(|a| a.mean).collect()
    }

    /// `E(depth)`: the expected tokens a round at `depth` commits (`depth` clamped to
    /// [`max_depth`](Self::max_depth)).
    pub fn expected_tokens(&self, depth: usize) -> f64 {
        self.model.expected()[depth.min(self.model.max_depth)]
    }

    /// The average measured cost of a round at `depth` in a batch of `batch` rows; `None` when
    /// never measured or `depth` exceeds [`max_depth`](Self::max_depth).
    pub fn round_cost(&self, batch: usize, depth: usize) -> Option<Duration> {
        let cost = self.model.cost[bucket(batch)].get(depth)?;
        (cost.samples > 0).then(|| Duration::from_secs_f64(cost.mean))
    }

    /// Its recent decisions and observations.
    pub fn log(&self) -> &DecisionLog {
        &self.log
    }

    /// Keeps at most `capacity` events from now on (folding any excess into the log's start).
    pub fn set_log_capacity(&mut self, capacity: usize) {
        self.log.capacity = capacity;
        self.log.trim();
    }

    /// What it has learnt, as a versioned JSON object. The log is not included (see
    /// [`DecisionLog::to_json`]).
    pub fn to_json(&self) -> String {
        // Serialising plain numbers and sequences cannot fail.
        serde_json::to_string_pretty(&self.model).expect("a depth model serialises")
    }

    /// A controller from [`to_json`](Self::to_json)'s output: it decides exactly as the saved
    /// one would have. Its log starts empty, at the loaded state.
    ///
    /// Fails with [`Error::Json`] on malformed JSON and [`Error::InvalidState`] when the state
    /// is inconsistent (another version, lengths that disagree with `max_depth`, rates outside
    /// `[0, 1]`).
    pub fn from_json(s: &str) -> Result<DepthController> {
        let model: Model = serde_json::from_str(s)?;
        model.validate()?;
        Ok(DepthController::from_model(model, DEFAULT_LOG_CAPACITY))
    }

    /// Writes [`to_json`](Self::to_json) to `path` atomically: to a temporary file beside it,
    /// flushed to disk, then renamed over it, so a crash leaves the old file or the new one.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        write_atomic(path.as_ref(), self.to_json().as_bytes())
    }

    /// Reads a file written by [`save`](Self::save); errors as [`from_json`](Self::from_json),
    /// or [`Error::Io`] when it cannot be read.
    pub fn load(path: impl AsRef<Path>) -> Result<DepthController> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        DepthController::from_json(&text)
    }
}

/// Writes `bytes` to a temporary file in `path`'s directory, then renames it to `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    // Unique per process and call, so concurrent saves never share a temporary file.
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let Some(name) = path.file_name() else {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file path",
        )));
    };
    let mut temp_name = OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(
        ".{}.{}.tmp",
        std::process::id(),
        SAVES.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(temp_name);
    let written = (|| {
        let mut file = fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        // Best effort: the error that matters is the write's.
        let _ = fs::remove_file(&temp);
    }
    written.map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The synthetic world: acceptance per position and cost per depth and batch.
    struct World {
        accept: Vec<f64>,
        cost: fn(usize, usize) -> f64,
    }

    impl World {
        fn a(&self, j: usize) -> f64 {
            self.accept[j.min(self.accept.len() - 1)]
        }

        fn expected(&self, k: usize) -> f64 {
            let (mut e, mut reach) = (1.0, 1.0);
            for j in 0..k {
                reach *= self.a(j);
                e += reach;
            }
            e
        }

        /// The analytic optimum, after checking that it is clear (at least 3% ahead), so a
        /// noisy estimate can be asked to find it.
        fn optimum(&self, batch: usize, max_depth: usize) -> usize {
            let rates: Vec<f64> = (0..=max_depth)
                .map(|k| self.expected(k) / (self.cost)(k, batch))
                .collect();
            let best = (0..=max_depth)
                .max_by(|&a, &b| rates[a].total_cmp(&rates[b]))
                .unwrap();
            for (k, r) in rates.iter().enumerate() {
                assert!(
                    k == best || *r < rates[best] / 1.03,
                    "flat optimum: {rates:?}"
                );
            }
            best
        }

        /// One round at the controller's depth; returns the depth it chose.
        fn round(&self, c: &mut DepthController, batch: usize, rng: &mut StdRng) -> usize {
            let depth = c.depth(batch);
            let mut accepted = 0;
            while accepted < depth && rng.random::<f64>() < self.a(accepted) {
                accepted += 1;
            }
            let jitter = 0.95 + 0.1 * rng.random::<f64>();
            let cost = Duration::from_secs_f64((self.cost)(depth, batch) * jitter);
            c.observe(batch, depth, accepted, cost);
            depth
        }
    }

    /// 10 ms a step plus a per-draft cost that grows with the batch (compute bound).
    fn linear_cost(k: usize, batch: usize) -> f64 {
        let per_draft = 0.15 + 0.25 * (batch.min(16) - 1) as f64 / 15.0;
        0.010 * (1.0 + per_draft * k as f64)
    }

    /// Runs `rounds` rounds of `world` through a fresh controller and asserts that it ends on
    /// the analytic optimum, and exploited it in at least 90% of the last 200 rounds.
    fn converges(world: &World, max_depth: usize, batch: usize, rounds: usize, seed: u64) {
        let want = world.optimum(batch, max_depth);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = DepthController::new(max_depth);
        let mut hits = 0;
        for r in 0..rounds {
            world.round(&mut c, batch, &mut rng);
            if r + 200 >= rounds && c.best(batch) == want {
                hits += 1;
            }
        }
        assert_eq!(c.best(batch), want, "acceptance {:?}", c.acceptance());
        assert!(
            hits >= 180,
            "best was {want} in only {hits} of the last 200 rounds"
        );
    }

    #[test]
    fn constant_acceptance_converges_to_the_analytic_optimum() {
        let world = World {
            accept: vec![0.5],
            cost: |k, _| 0.010 * (1.0 + 0.3 * k as f64),
        };
        converges(&world, 8, 1, 600, 1);
        let world = World {
            accept: vec![0.9],
            cost: |k, _| 0.010 * (1.0 + 0.02 * k as f64),
        };
        converges(&world, 4, 1, 600, 2);
    }

    #[test]
    fn decaying_acceptance_converges_per_batch_bucket() {
        let world = World {
            accept: vec![0.95, 0.85, 0.6, 0.3, 0.1],
            cost: linear_cost,
        };
        assert_eq!(world.optimum(1, 8), 3);
        assert_eq!(world.optimum(16, 8), 2);
        converges(&world, 8, 1, 600, 3);
        converges(&world, 8, 16, 600, 4);

        // Interleaved, one controller learns both buckets from shared acceptance.
        let mut rng = StdRng::seed_from_u64(5);
        let mut c = DepthController::new(8);
        for _ in 0..600 {
            world.round(&mut c, 1, &mut rng);
            world.round(&mut c, 16, &mut rng);
        }
        assert_eq!((c.best(1), c.best(16)), (3, 2));
    }

    #[test]
    fn never_accepted_settles_on_zero_and_recovers_through_probes() {
        let mut rng = StdRng::seed_from_u64(6);
        let mut c = DepthController::new(8);
        let hopeless = World {
            accept: vec![0.0],
            cost: linear_cost,
        };
        for _ in 0..300 {
            hopeless.round(&mut c, 1, &mut rng);
        }
        assert_eq!(c.best(1), 0);
        let last: Vec<usize> = (0..64)
            .map(|_| hopeless.round(&mut c, 1, &mut rng))
            .collect();
        // Plain decoding, except a probe of depth 1: every 64th round once probes keep failing.
        assert_eq!(last.iter().filter(|&&d| d == 0).count(), 63, "{last:?}");
        assert!(last.iter().all(|&d| d <= 1));

        let good = World {
            accept: vec![0.95, 0.85, 0.6, 0.3, 0.1],
            cost: linear_cost,
        };
        for _ in 0..600 {
            good.round(&mut c, 1, &mut rng);
        }
        assert!(c.best(1) > 0);
        assert_eq!(c.best(1), good.optimum(1, 8));
    }

    #[test]
    fn failed_probes_from_zero_wait_longer_and_an_accepted_one_restores_the_pace() {
        let mut c = DepthController::new(4);
        // Depth 0 is cheap; depth 1 costs a little more and its drafts are always rejected.
        let run = |c: &mut DepthController, rounds: usize, accept: bool| -> Vec<usize> {
            let mut probes = Vec::new();
            for i in 0..rounds {
                let depth = c.depth(1);
                let accepted = usize::from(accept && depth > 0);
                let cost = Duration::from_millis(if depth == 0 { 10 } else { 11 });
                c.observe(1, depth, accepted.min(depth), cost);
                if depth > 0 {
                    probes.push(i);
                }
            }
            probes
        };
        for _ in 0..20 {
            c.observe(1, 1, 0, Duration::from_millis(11));
        }
        for _ in 0..2 {
            c.observe(1, 0, 0, Duration::from_millis(10));
        }
        assert_eq!(c.best(1), 0);
        let probes = run(&mut c, 320, false);
        assert_eq!(probes[0], 7, "probes at {probes:?}");
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(&gaps[..3], &[8, 16, 32], "probes at {probes:?}");
        assert!(gaps[3..].iter().all(|&g| g == 64), "probes at {probes:?}");
        // One accepted probe: back to probing every 8th decision (or drafting for good).
        let after = run(&mut c, 128, true);
        assert!(
            after.len() >= 2 && after[1] - after[0] <= 8,
            "probes at {after:?}"
        );
        let restored = DepthController::from_json(&c.to_json()).unwrap();
        assert_eq!(restored.to_json(), c.to_json());
    }

    #[test]
    fn accepted_probes_that_cost_more_than_they_commit_still_back_off() {
        // Every probe's draft is accepted, but its round commits 2 tokens in `probe` ms
        // against plain decoding's 1 in 10 ms: it does not pay, so probes thin out past the
        // backoff's every 64th decision, to where they take 1/64 of the time: a 25 ms probe
        // (15 ms more than a plain step) every 96 steps, a 150 ms one every 896.
        for (probe, gap) in [(25, 96), (150, 896)] {
            let mut c = DepthController::new(4);
            for _ in 0..2 {
                c.observe(1, 0, 0, Duration::from_millis(10));
                c.observe(1, 1, 1, Duration::from_millis(probe));
            }
            assert_eq!(c.best(1), 0);
            let mut probes = Vec::new();
            for i in 0..3000 {
                let depth = c.depth(1);
                let cost = Duration::from_millis(if depth == 0 { 10 } else { probe });
                c.observe(1, depth, depth.min(1), cost);
                if depth > 0 {
                    probes.push(i);
                }
            }
            let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(
                gaps.ends_with(&[gap, gap]),
                "{probe} ms: probes at {probes:?}"
            );
        }
    }

    #[test]
    fn a_cold_controller_measures_plain_decoding_early_and_drops_a_drafter_that_never_pays() {
        // A draft model that is never right and makes each draft cost 40% of a step.
        let hopeless = World {
            accept: vec![0.0],
            cost: |k, _| 0.010 * (1.0 + 0.4 * k as f64),
        };
        let mut rng = StdRng::seed_from_u64(9);
        let mut c = DepthController::new(8);
        let first: Vec<usize> = (0..24)
            .map(|_| hopeless.round(&mut c, 1, &mut rng))
            .collect();
        // The start depth twice, then plain decoding twice, so both are measured...
        assert_eq!(&first[..4], &[START_DEPTH, START_DEPTH, 0, 0], "{first:?}");
        // ...and plain decoding from then on but for the odd probe.
        let drafting = first[4..].iter().filter(|&&d| d > 0).count();
        assert!(drafting <= 6, "{first:?}");
        assert_eq!(c.best(1), 0);

        // A drafter that pays keeps drafting once plain decoding is measured too.
        let good = World {
            accept: vec![0.9],
            cost: |k, _| 0.010 * (1.0 + 0.05 * k as f64),
        };
        let mut c = DepthController::new(8);
        let first: Vec<usize> = (0..24).map(|_| good.round(&mut c, 1, &mut rng)).collect();
        assert_eq!(&first[..4], &[START_DEPTH, START_DEPTH, 0, 0], "{first:?}");
        assert!(first[4..].iter().all(|&d| d > 0), "{first:?}");
    }

    #[test]
    fn probes_alternate_around_the_best_depth() {
        let mut c = DepthController::new(8);
        // Depth 3 measured as cheap as plain decoding and always accepted, everything else
        // unmeasured.
        let mut decisions = Vec::new();
        for _ in 0..32 {
            let d = c.depth(1);
            decisions.push(d);
            match d {
                0 => c.observe(1, 0, 0, Duration::from_millis(10)),
                3 => c.observe(1, 3, 3, Duration::from_millis(10)),
                _ => {}
            }
        }
        // The start depth twice, then plain decoding twice to measure it.
        assert_eq!(&decisions[..4], &[3, 3, 0, 0]);
        // Rounds 8, 16, 24, 32 probe 4, 2, 4, 2.
        let probes: Vec<usize> = decisions.iter().copied().skip(7).step_by(8).collect();
        assert_eq!(probes, vec![4, 2, 4, 2]);
        assert!(
            decisions
                .iter()
                .enumerate()
                .all(|(i, &d)| (i + 1) % 8 == 0 || d == 3 || i == 2 || i == 3)
        );
    }

    #[test]
    fn an_unmeasured_bucket_starts_from_its_nearest_measured_neighbour() {
        let mut c = DepthController::new(8);
        assert_eq!(c.best(1), START_DEPTH);
        for _ in 0..3 {
            c.observe(4, 5, 5, Duration::from_millis(10));
        }
        assert_eq!(c.best(3), 5);
        assert_eq!(c.best(1), 5);
        assert_eq!(c.depth(100), 5);
    }

    #[test]
    fn observe_updates_the_positions_it_reached() {
        let mut c = DepthController::new(4);
        c.observe(1, 4, 1, Duration::from_millis(10));
        let a = c.acceptance();
        let prior = ACCEPT_PRIOR;
        assert!(a[0] > prior && a[1] < prior, "{a:?}");
        assert_eq!((a[2], a[3]), (prior, prior));
        // All accepted: every position up.
        c.observe(1, 2, 2, Duration::from_millis(10));
        assert!(c.acceptance()[1] > a[1]);
        // Out-of-range values are clamped, not panics.
        c.observe(1, 99, 120, Duration::from_millis(10));
        assert_eq!(c.round_cost(1, 4), Some(Duration::from_millis(10)));
        assert_eq!(c.round_cost(1, 9), None);
        let e = c.expected_tokens(2);
        let a = c.acceptance();
        assert!((e - (1.0 + a[0] + a[0] * a[1])).abs() < 1e-12);
        assert_eq!(c.expected_tokens(0), 1.0);
    }

    #[test]
    fn max_depth_zero_always_decodes_plainly() {
        let mut c = DepthController::new(0);
        for _ in 0..40 {
            assert_eq!(c.depth(1), 0);
            c.observe(1, 3, 3, Duration::from_millis(5));
        }
        assert_eq!(DepthController::new(1000).max_depth(), MAX_DEPTH);
    }

    fn trained(seed: u64) -> DepthController {
        let world = World {
            accept: vec![0.9, 0.7, 0.4],
            cost: linear_cost,
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let mut c = DepthController::new(6);
        for i in 0..400 {
            world.round(&mut c, [1, 2, 6, 20][i % 4], &mut rng);
        }
        c
    }

    #[test]
    fn a_reloaded_controller_decides_as_before() {
        let mut before = trained(7);
        let mut after = DepthController::from_json(&before.to_json()).unwrap();
        assert_eq!(after.model, before.model);
        let world = World {
            accept: vec![0.9, 0.7, 0.4],
            cost: linear_cost,
        };
        let (mut r1, mut r2) = (StdRng::seed_from_u64(8), StdRng::seed_from_u64(8));
        for i in 0..200 {
            let batch = [1, 3, 9, 17][i % 4];
            assert_eq!(
                world.round(&mut after, batch, &mut r2),
                world.round(&mut before, batch, &mut r1)
            );
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("depth.json");
        before.save(&path).unwrap();
        before.save(&path).unwrap(); // overwriting works too
        let loaded = DepthController::load(&path).unwrap();
        assert_eq!(loaded.model, before.model);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![OsString::from("depth.json")],
            "no temporary file left"
        );
        assert!(matches!(
            DepthController::load(dir.path().join("missing.json")),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn malformed_state_is_an_error_not_a_panic() {
        let good = trained(9).to_json();
        let json = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
            f(&mut v);
            DepthController::from_json(&v.to_string())
        };
        assert!(matches!(
            DepthController::from_json("{"),
            Err(Error::Json(_))
        ));
        assert!(matches!(
            DepthController::from_json("[]"),
            Err(Error::Json(_))
        ));
        assert!(matches!(
            json(&|v| v["version"] = 2.into()),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["max_depth"] = 7.into()),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["max_depth"] = 65.into()),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["accept"][0]["mean"] = 1.5.into()),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["cost"][2][1]["mean"] = (-1.0).into()),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["accept"][0]["mean"] = serde_json::Value::Null),
            Err(Error::Json(_))
        ));
        assert!(matches!(
            json(&|v| {
                v["cost"].as_array_mut().unwrap().pop();
            }),
            Err(Error::InvalidState(_))
        ));
        assert!(matches!(
            json(&|v| v["extra"] = 1.into()),
            Err(Error::Json(_))
        ));
        let err = json(&|v| v["version"] = 2.into()).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid depth controller state: version 2 (this build reads 1)"
        );
    }

    #[test]
    fn the_log_replays_every_decision_from_a_fresh_controller() {
        let c = trained(10);
        assert_eq!(c.log().len(), 800);
        let replay = replay(DepthController::new(6), c.log().events());
        assert_eq!(replay.decisions, 400);
        assert!(replay.mismatches.is_empty(), "{:?}", replay.mismatches);
        assert_eq!(replay.controller, c);

        // Through JSON too.
        let log = DecisionLog::from_json(&c.log().to_json()).unwrap();
        assert_eq!(&log, c.log());
        assert_eq!(log.replay().controller, c);
    }

    #[test]
    fn a_truncated_log_replays_from_its_start_and_a_fresh_one_diverges() {
        let world = World {
            accept: vec![0.9, 0.7, 0.4],
            cost: linear_cost,
        };
        let mut rng = StdRng::seed_from_u64(11);
        let mut c = DepthController::new(6);
        c.set_log_capacity(100);
        for i in 0..400 {
            world.round(&mut c, [1, 2, 6, 20][i % 4], &mut rng);
        }
        assert_eq!(c.log().len(), 100);
        let replay = c.log().replay();
        assert_eq!(replay.decisions, 50);
        assert!(replay.mismatches.is_empty(), "{:?}", replay.mismatches);
        assert_eq!(replay.controller.model, c.model);

        // The same events fed to a controller that did not learn the first 300 rounds, or
        // a logged decision altered, are caught.
        let fresh = super::replay(DepthController::new(6), c.log().events());
        assert!(!fresh.mismatches.is_empty());
        let mut events: Vec<Event> = c.log().events().cloned().collect();
        let i = events
            .iter()
            .position(|e| matches!(e, Event::Depth { .. }))
            .unwrap();
        if let Event::Depth { depth, .. } = &mut events[i] {
            *depth += 1;
        }
        let altered = super::replay(c.log().start(), &events);
        assert_eq!(altered.mismatches.len(), 1);
        assert_eq!(altered.mismatches[0].event, i);
        assert!(matches!(
            DecisionLog::from_json(
                &c.log()
                    .to_json()
                    .replace("\"capacity\":100", "\"capacity\":3")
            ),
            Err(Error::InvalidState(_))
        ));
    }
}
