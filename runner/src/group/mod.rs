//! One model served by a group of processes, on one machine or several (`mlxkit serve
//! --hostfile`, `mlxkit worker`): each process holds its part of the model (tensor parallel:
//! a slice of every layer; pipeline parallel: a range of layers), and MLX's own distributed
//! backend (ring over TCP, MPI, NCCL, JACCL) carries the tensors between them.
//!
//! Rank 0 runs the HTTP server, the scheduler and the step loop; its model is a
//! [`leader::Leader`], which tells every worker each forward before running its own part. A
//! worker ([`follower`]) runs those forwards over caches it keeps per sequence and samples
//! nothing. What goes over the [`control`] connections is which rows to run; the tokens and
//! every activation go over MLX's backend.
//!
//! - [`hostfile`]: the group's addresses, in `mlx.launch`'s formats;
//! - [`control`]: the messages between rank 0 and a worker;
//! - [`forming`]: pointing MLX at the hostfile and forming MLX's group;
//! - [`links`]: rank 0's connections to its workers, and noticing one leave;
//! - [`rank_0`]: rank 0's group across its formings, re-formed when a worker comes back;
//! - [`sever`]: ending the collectives in flight once a rank is gone;
//! - [`leader`] and [`follower`]: the two sides of a forward.

pub mod control;
pub mod follower;
pub mod forming;
pub mod hostfile;
pub mod leader;
pub mod links;
pub mod rank_0;
pub mod sever;

pub use control::Parallel;
