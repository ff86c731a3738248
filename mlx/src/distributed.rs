//! MLX's distributed groups: which backends this build has ([`available`]), the group of
//! processes a backend forms from the environment `mlx.launch` sets ([`Group::init`]), and the
//! collectives over it. The transport is MLX's own (ring over TCP, MPI, NCCL, JACCL over
//! Thunderbolt RDMA); mlxkit writes none.
//!
//! The ring backend reads `MLX_RANK` (this process's rank) and `MLX_HOSTFILE` (a JSON list,
//! in rank order, of each rank's `"ip:port"` addresses). Collectives are lazy arrays: they
//! communicate when evaluated, on the thread that evaluates them.

use std::fmt;

use mlx_sys::{UniquePtr, ffi};

use crate::{Array, Error, Result};

/// A communication backend MLX may be built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// TCP between neighbours in a ring (every build).
    Ring,
    /// MPI, where the build found it.
    Mpi,
    /// NVIDIA's NCCL (CUDA builds).
    Nccl,
    /// RDMA over Thunderbolt between Macs.
    Jaccl,
}

impl Backend {
    /// Every backend, in the order `mlxkit info` lists them.
    pub const ALL: [Backend; 4] = [Backend::Ring, Backend::Mpi, Backend::Nccl, Backend::Jaccl];

    /// The name MLX and `mlx.launch` give it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Ring => "ring",
            Backend::Mpi => "mpi",
            Backend::Nccl => "nccl",
            Backend::Jaccl => "jaccl",
        }
    }

    /// The backend called `name`, if there is one.
    pub fn parse(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether this MLX build can communicate over `backend`.
pub fn available(backend: Backend) -> Result<bool> {
    Ok(ffi::distributed_is_available(backend.name())?)
}

/// The backends this MLX build has, in [`Backend::ALL`]'s order.
pub fn available_backends() -> Result<Vec<Backend>> {
    let mut out = Vec::new();
    for backend in Backend::ALL {
        if available(backend)? {
            out.push(backend);
        }
    }
    Ok(out)
}

/// Forgets the groups [`Group::init`] formed, so that its next call forms a new one: how a
/// group re-forms after one of its processes left. A group lives on while a handle on it (or a
/// collective built over it) does; once the last is gone, its connections close.
pub fn forget_groups() -> Result<()> {
    Ok(ffi::distributed_forget_groups()?)
}

/// A group of processes that communicate: every rank a backend found.
pub struct Group {
    raw: UniquePtr<ffi::Group>,
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.rank().ok())
            .field("size", &self.size().ok())
            .finish()
    }
}

impl Group {
    /// Another handle on the same group.
    pub fn try_clone(&self) -> Result<Group> {
        Ok(Group {
            raw: ffi::group_clone(&self.raw)?,
        })
    }

    /// The group `backend` forms from the environment. Fails, naming why, when this build lacks
    /// the backend or the group cannot be formed; never falls back to a group of one.
    ///
    /// MLX forms one group per backend and process: a second call returns the first group,
    /// unless [`forget_groups`] came between.
    pub fn init(backend: Backend) -> Result<Group> {
        if !available(backend)? {
            return Err(Error::InvalidArgument(format!(
                "this MLX build has no `{backend}` distributed backend"
            )));
        }
        Ok(Group {
            raw: ffi::distributed_init(backend.name())?,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> Result<usize> {
        Ok(usize::try_from(ffi::group_rank(&self.raw)?).unwrap_or(0))
    }

    /// How many processes the group holds.
    pub fn size(&self) -> Result<usize> {
        Ok(usize::try_from(ffi::group_size(&self.raw)?).unwrap_or(0))
    }

    /// `x` summed over every rank (each rank passes its own `x` of the same shape).
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        Array::from_raw(ffi::distributed_all_sum(x.raw(), &self.raw)?)
    }

    /// Every rank's `x` stacked along the first axis, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        Array::from_raw(ffi::distributed_all_gather(x.raw(), &self.raw)?)
    }

    /// Sends `x` to rank `dst`; the returned array completes the send when evaluated.
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        Array::from_raw(ffi::distributed_send(x.raw(), rank(dst)?, &self.raw)?)
    }

    /// Receives from rank `src` an array shaped and typed as `like`.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        Array::from_raw(ffi::distributed_recv_like(
            like.raw(),
            rank(src)?,
            &self.raw,
        )?)
    }
}

fn rank(rank: usize) -> Result<i32> {
    i32::try_from(rank).map_err(|_| Error::InvalidArgument(format!("rank {rank} is too large")))
}
