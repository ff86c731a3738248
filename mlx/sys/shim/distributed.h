// MLX's distributed groups (`mlx::core::distributed`): which backends this build has, a group
// of processes from the environment `mlx.launch` sets, and the collectives over it. The
// transport is MLX's own (ring over TCP, MPI, NCCL, JACCL); nothing here moves bytes itself.
#pragma once

#include <memory>

#include "mlx/distributed/distributed.h"
#include "mlx/distributed/ops.h"
#include "rust/cxx.h"

namespace mlxkit {

using Array = mlx::core::array;

// A group of processes, as MLX's init returned it.
struct Group {
  mlx::core::distributed::Group group;
};

// Whether this MLX build can communicate over `backend` (`ring`, `mpi`, `nccl`, `jaccl`).
bool distributed_is_available(rust::Str backend);
// The group of every process `backend` finds from the environment (`MLX_RANK`,
// `MLX_HOSTFILE`, ...); throws when it cannot be formed.
std::unique_ptr<Group> distributed_init(rust::Str backend);
// Forgets the groups init formed: MLX keeps the first group per backend and init returns it
// again, so a group re-formed after a rank left needs this first. Handles still held keep
// their group alive.
void distributed_forget_groups();
std::unique_ptr<Group> group_clone(const Group& group);
int32_t group_rank(const Group& group);
int32_t group_size(const Group& group);

// Collectives: lazy arrays, evaluated like any other.
std::unique_ptr<Array> distributed_all_sum(const Array& x, const Group& group);
std::unique_ptr<Array> distributed_all_gather(const Array& x, const Group& group);
std::unique_ptr<Array> distributed_send(const Array& x, int32_t dst, const Group& group);
std::unique_ptr<Array> distributed_recv_like(const Array& x, int32_t src, const Group& group);

}  // namespace mlxkit
