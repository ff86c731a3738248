//! Forming a group: checking the backend, pointing MLX's backend at the hostfile
//! ([`point_mlx_at`]), and rank 0's wait for every worker before the group forms
//! ([`form_as_rank_0`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mlx::distributed::{Backend, Group};

use crate::group::Parallel;
use crate::group::hostfile::Hostfile;
use crate::group::leader::GroupLink;
use crate::group::links::Links;

/// Refuses a backend this MLX build lacks, naming the ones it has.
pub fn check_backend(backend: Backend) -> Result<(), String> {
    let available = mlx::distributed::available_backends().map_err(|e| e.to_string())?;
    if available.contains(&backend) {
        return Ok(());
    }
    let names: Vec<&str> = available.iter().map(|b| b.name()).collect();
    Err(format!(
        "this MLX build has no `{backend}` distributed backend (it has: {})",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    ))
}

/// Forms MLX's group over `backend` from the environment [`point_mlx_at`] set, then removes
/// the ring's hostfile it wrote (read once, at forming).
pub fn init(backend: Backend) -> Result<Group, String> {
    let group = Group::init(backend).map_err(|e| format!("forming the group: {e}"));
    if let Some(path) = std::env::var_os("MLX_HOSTFILE").map(PathBuf::from)
        && path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("mlxkit-ring-"))
    {
        let _ = std::fs::remove_file(path);
    }
    group
}

/// Writes the ring's hostfile for `hostfile` and sets `MLX_RANK` and `MLX_HOSTFILE`, which MLX's
/// backends read when the group forms.
///
/// Must run before the process starts any thread: the environment is process-wide, and
/// changing it while another thread reads it is undefined behaviour.
#[allow(unsafe_code)] // setting the environment MLX's backends read
pub fn point_mlx_at(hostfile: &Hostfile, rank: usize) -> Result<PathBuf, String> {
    if rank >= hostfile.size() {
        return Err(format!(
            "rank {rank} is not in the hostfile, which names {} processes",
            hostfile.size()
        ));
    }
    let path = std::env::temp_dir().join(format!("mlxkit-ring-{}.json", std::process::id()));
    std::fs::write(&path, hostfile.ring_json())
        .map_err(|e| format!("writing the ring's hostfile {}: {e}", path.display()))?;
    // SAFETY: called while this process has one thread (see above).
    unsafe {
        std::env::set_var("MLX_RANK", rank.to_string());
        std::env::set_var("MLX_HOSTFILE", &path);
    }
    Ok(path)
}

/// Rank 0's side of forming the group: waits up to `join_timeout` for every worker of
/// `hostfile`, then forms MLX's group with them over `backend`.
pub fn form_as_rank_0(
    hostfile: &Hostfile,
    backend: Backend,
    parallel: Parallel,
    join_timeout: Duration,
) -> Result<Arc<GroupLink>, String> {
    let links = Links::accept(hostfile, join_timeout)?;
    let group = init(backend)?;
    eprintln!(
        "mlxkit: a group of {} processes formed over `{backend}`; models split by {} parallelism",
        links.size(),
        parallel.name()
    );
    Ok(Arc::new(GroupLink::new(links, group, parallel)))
}
