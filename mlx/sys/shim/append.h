// Every row's new keys and values written into that row's cache buffers, for a batch, in one
// graph node (see append.cc).
#pragma once

#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxkit {

// What `append_rows` returns, one entry per row in each list: the rows' buffers after the
// write (each takes over its input's memory when nothing else holds it) and views of each
// buffer's first `lengths[r]` slots, the history the row's attention reads.
struct AppendedRows {
  std::vector<mlx::core::array> key_buffers;
  std::vector<mlx::core::array> value_buffers;
  std::vector<mlx::core::array> key_history;
  std::vector<mlx::core::array> value_history;
};

// Writes row r of `keys` `[rows, heads, tokens, key_dim]` and `values` `[.., value_dim]` into
// slots `offsets[r]..offsets[r] + tokens` of `key_buffers[r]` `[1, heads, capacity, key_dim]`
// and `value_buffers[r]`, any dtype (floats or an 8-bit cache's byte rows) as long as the new
// rows and the buffers agree, and views each row's first `lengths[r]` slots (a full cache's
// `offset + tokens`, a sliding window's used slots). Nothing when it does not apply (a GPU
// default device, shapes or dtypes that do not match, a write or a view past a buffer's end);
// write row by row with slice updates then.
std::optional<AppendedRows> append_rows(const mlx::core::array& keys,
                                        const mlx::core::array& values,
                                        const std::vector<mlx::core::array>& key_buffers,
                                        const std::vector<mlx::core::array>& value_buffers,
                                        const std::vector<int>& offsets,
                                        const std::vector<int>& lengths);

}  // namespace mlxkit
