// See distributed.h.
#include "distributed.h"

#include <string>

namespace mlxkit {

namespace dist = mlx::core::distributed;

bool distributed_is_available(rust::Str backend) {
  return dist::is_available(std::string(backend));
}

std::unique_ptr<Group> distributed_init(rust::Str backend) {
  // Strict: a group that cannot form is an error, never a silent group of one.
  return std::make_unique<Group>(Group{dist::init(true, std::string(backend))});
}

void distributed_forget_groups() { dist::clear_backends(); }

std::unique_ptr<Group> group_clone(const Group& group) {
  return std::make_unique<Group>(Group{group.group});
}

int32_t group_rank(const Group& group) { return group.group.rank(); }

int32_t group_size(const Group& group) { return group.group.size(); }

std::unique_ptr<Array> distributed_all_sum(const Array& x, const Group& group) {
  return std::make_unique<Array>(dist::all_sum(x, group.group));
}

std::unique_ptr<Array> distributed_all_gather(const Array& x, const Group& group) {
  return std::make_unique<Array>(dist::all_gather(x, group.group));
}

std::unique_ptr<Array> distributed_send(const Array& x, int32_t dst, const Group& group) {
  return std::make_unique<Array>(dist::send(x, dst, group.group));
}

std::unique_ptr<Array> distributed_recv_like(const Array& x, int32_t src, const Group& group) {
  return std::make_unique<Array>(dist::recv_like(x, src, group.group));
}

}  // namespace mlxkit
