//! Rank 0's hold on its group over time ([`GroupLink`]): the [`Formation`] serving now (the
//! workers' control links and MLX's group), the state `/health` and `/api/ps` show, and
//! re-forming the group once a worker that left joins again, without restarting rank 0.
//!
//! Re-forming, over the ring backend:
//! 1. a worker leaves; the formation is lost, and every request fails or is refused naming it;
//! 2. the model keeper unloads the models split over it (see `ModelKeeper`'s reaper) once
//!    their requests have ended, and with them every handle on MLX's group;
//!    Rank 0 first shuts down its ring connections ([`sever`]): a step in flight may wait on a
//!    rank that is alive but waits too, and would never end;
//! 3. the workers still there are told to regroup, the control connections close and MLX
//!    forgets the group (a worker caught in a collective sees its peers go, and regroups);
//! 4. once every worker has joined again, the group forms anew and the next request loads the
//!    model on every rank.
//!
//! Other backends form once per process (MPI cannot initialise twice), so a group over them
//! stays lost until it is restarted.

use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mlx::distributed::{Backend, Group};

use crate::group::Parallel;
use crate::group::control::ToWorker;
use crate::group::forming;
use crate::group::hostfile::Hostfile;
use crate::group::links::{self, JoinWait, Links};
use crate::group::sever;

/// How often the re-forming thread looks at the group.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// How long the models split over a lost group may take to be let go before rank 0 is taken
/// to be stuck: their requests end within seconds, and an unload takes well under this.
const STUCK_AFTER: Duration = Duration::from_secs(30);

/// One forming of the group: the workers' control connections and MLX's group over them.
pub struct Formation {
    /// The workers' control connections.
    pub links: Links,
    /// Behind a lock: MLX's group handle is not shared between threads.
    group: Mutex<Group>,
}

impl Formation {
    /// Another handle on MLX's group, for a model split across it.
    pub fn group(&self) -> mlx::Result<Group> {
        self.group
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_clone()
    }
}

/// The group rank 0 serves models over, across its formings.
pub struct GroupLink {
    /// How models are split across it.
    pub parallel: Parallel,
    size: usize,
    state: Mutex<State>,
    /// What a lost group waits for: its workers to join again (ring), or a restart.
    remedy: &'static str,
}

enum State {
    Serving(Arc<Formation>),
    /// A worker left (why); the group waits for it to join again.
    Lost(String),
    /// A worker left (why), and rank 0's step is caught in a collective that cannot end.
    Stuck(String),
}

impl GroupLink {
    /// Waits up to `join_timeout` for every worker of `hostfile` (MLX pointed at it already,
    /// see [`forming::point_mlx_at`]), forms MLX's group over `backend` with them, and watches
    /// it, to re-form it after a worker leaves and joins again (ring only).
    pub fn form(
        hostfile: &Hostfile,
        backend: Backend,
        parallel: Parallel,
        join_timeout: Duration,
    ) -> Result<Arc<GroupLink>, String> {
        let listener = links::listen(hostfile)?;
        let links = Links::accept(&listener, hostfile, JoinWait::For(join_timeout))?;
        let group = forming::init(hostfile, backend)?;
        eprintln!(
            "mlxkit: a group of {} processes formed over `{backend}`; models split by {} \
             parallelism",
            links.size(),
            parallel.name()
        );
        let link = Arc::new(GroupLink {
            parallel,
            size: hostfile.size(),
            state: Mutex::new(State::Serving(Arc::new(Formation {
                links,
                group: Mutex::new(group),
            }))),
            remedy: if backend == Backend::Ring {
                "start that worker again and the group re-forms"
            } else {
                "a group over this backend forms once per process: restart every rank"
            },
        });
        if backend == Backend::Ring {
            let watched = Arc::downgrade(&link);
            let hostfile = hostfile.clone();
            std::thread::Builder::new()
                .name("mlxkit-group".into())
                .spawn(move || reform_when_rejoined(&watched, &listener, &hostfile, backend))
                .map_err(|e| format!("starting the group's watch: {e}"))?;
        }
        Ok(link)
    }

    /// How many processes the group holds.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The formation serving now; why the group cannot serve when it lost a worker.
    pub fn formation(&self) -> Result<Arc<Formation>, String> {
        match &*self.state() {
            State::Serving(formation) => match formation.links.lost() {
                None => Ok(Arc::clone(formation)),
                Some(why) => Err(format!("{why}; {}", self.remedy)),
            },
            State::Lost(why) => Err(format!("{why}; {}", self.remedy)),
            State::Stuck(why) => Err(format!(
                "{why}; this server's step is caught in a collective of MLX's ring that will \
                 not end (its peer's connection failed between two of its transfers): restart \
                 every rank"
            )),
        }
    }

    /// Why the group cannot serve, while it cannot.
    pub fn lost(&self) -> Option<String> {
        self.formation().err()
    }

    /// What `/health` and `/api/ps` say of the group: its ranks, how it splits models, and
    /// whether it serves or lost a rank (and why).
    pub fn state_json(&self) -> serde_json::Value {
        let lost = self.lost();
        let state = match (&*self.state(), &lost) {
            (State::Stuck(_), _) => "stuck",
            (_, Some(_)) => "lost",
            (_, None) => "serving",
        };
        serde_json::json!({
            "ranks": self.size,
            "parallel": self.parallel.name(),
            "state": state,
            "lost": lost,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The re-forming thread (see the module docs): runs while `link` lives.
fn reform_when_rejoined(
    link: &Weak<GroupLink>,
    listener: &TcpListener,
    hostfile: &Hostfile,
    backend: Backend,
) {
    let wanted = || link.strong_count() > 0;
    loop {
        std::thread::sleep(WATCH_EVERY);
        let Some(held) = link.upgrade() else {
            return;
        };
        let left = {
            let mut state = held.state();
            match &*state {
                State::Serving(formation) => match formation.links.lost() {
                    None => continue,
                    Some(why) => {
                        let formation = Arc::clone(formation);
                        *state = State::Lost(why.clone());
                        Some((formation, why))
                    }
                },
                State::Lost(_) | State::Stuck(_) => None,
            }
        };
        drop(held);
        if let Some((formation, why)) = left {
            eprintln!("mlxkit: {why}; the group re-forms once it joins again");
            // The step in flight may wait on a rank that waits too; this ends it, and theirs.
            sever::sever(hostfile, 0);
            // Every model split over the formation holds it: wait for them to be unloaded.
            let waiting = std::time::Instant::now();
            while Arc::strong_count(&formation) > 1 {
                if !wanted() {
                    return;
                }
                if waiting.elapsed() >= STUCK_AFTER {
                    // MLX's ring gives up on a peer's connection for good: a collective queued
                    // after that waits on it forever, and the step with it. Nothing in this
                    // process can end it.
                    if let Some(held) = link.upgrade() {
                        *held.state() = State::Stuck(why);
                    }
                    tracing::error!("rank 0's step did not end after the group lost a rank");
                    return;
                }
                std::thread::sleep(WATCH_EVERY);
            }
            formation.links.tell_each(&ToWorker::Regroup { why });
            drop(formation);
        }
        let formed = mlx::distributed::forget_groups()
            .map_err(|e| e.to_string())
            .and_then(|()| Links::accept(listener, hostfile, JoinWait::While(&wanted)))
            .and_then(|links| {
                forming::init(hostfile, backend).map(|group| Formation {
                    links,
                    group: Mutex::new(group),
                })
            });
        let Some(held) = link.upgrade() else {
            return;
        };
        let mut state = held.state();
        match formed {
            Ok(formation) => {
                *state = State::Serving(Arc::new(formation));
                eprintln!("mlxkit: the group of {} processes re-formed", held.size);
            }
            Err(e) => {
                tracing::error!("the group could not re-form: {e}");
                if let State::Lost(why) = &mut *state {
                    *why =
                        format!("the group could not re-form ({e}); waiting for its workers again");
                }
            }
        }
    }
}
