//! Forming a group: checking the backend, pointing MLX's backend at the hostfile
//! ([`point_mlx_at`]) and forming MLX's group ([`init`]), again after a rank left.

use std::path::PathBuf;

use mlx::distributed::{Backend, Group};

use crate::group::hostfile::Hostfile;

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

/// Forms MLX's group over `backend` from the environment [`point_mlx_at`] set: writes the
/// ring's hostfile it names, forms the group, and removes the file again (the ring reads it
/// once, at forming). After [`mlx::distributed::forget_groups`], forms a new group: how a
/// group re-forms after a rank left.
pub fn init(hostfile: &Hostfile, backend: Backend) -> Result<Group, String> {
    let ours = our_ring_file();
    if let Some(path) = &ours {
        std::fs::write(path, hostfile.ring_json())
            .map_err(|e| format!("writing the ring's hostfile {}: {e}", path.display()))?;
    }
    let group = Group::init(backend).map_err(|e| format!("forming the group: {e}"));
    if let Some(path) = ours {
        let _ = std::fs::remove_file(path);
    }
    group
}

/// The ring's hostfile `MLX_HOSTFILE` names, when [`point_mlx_at`] chose it (not when
/// `mlx.launch` wrote it).
fn our_ring_file() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os("MLX_HOSTFILE")?);
    let ours = path
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with(RING_FILE_PREFIX));
    ours.then_some(path)
}

/// How the ring's hostfiles [`point_mlx_at`] names begin.
const RING_FILE_PREFIX: &str = "mlxkit-ring-";

/// Sets `MLX_RANK` and `MLX_HOSTFILE` (a file in the temporary folder, which [`init`] writes
/// from `hostfile`), which MLX's backends read when the group forms.
///
/// Must run before the process starts any thread: the environment is process-wide, and
/// changing it while another thread reads it is undefined behaviour.
#[allow(unsafe_code)] // setting the environment MLX's backends read
pub fn point_mlx_at(hostfile: &Hostfile, rank: usize) -> Result<(), String> {
    if rank >= hostfile.size() {
        return Err(format!(
            "rank {rank} is not in the hostfile, which names {} processes",
            hostfile.size()
        ));
    }
    let path = std::env::temp_dir().join(format!("{RING_FILE_PREFIX}{}.json", std::process::id()));
    // SAFETY: called while this process has one thread (see above).
    unsafe {
        std::env::set_var("MLX_RANK", rank.to_string());
        std::env::set_var("MLX_HOSTFILE", &path);
    }
    Ok(())
}
