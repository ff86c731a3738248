// Attention of each row's queries over the row's own history (see attend.cc).
#pragma once

#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxkit {

// `softmax(q kᵀ · scale) v` for `queries: [rows, heads, length, head_dim]`, row r attending
// `keys[r], values[r]: [1, kv_heads, len_r, head_dim]`: every column when `causal[r]` is false,
// and when it is true, query i the columns up to `len_r - length + i` (the queries are the
// last `length` positions of the history, MLX's causal alignment); where `masks[r]` is given
// (boolean `[length, len_r]`), query i also sees only the columns it marks true, and a query
// that sees none gets zeros. Logits are soft-capped as
// `cap · tanh(logit / cap)` when `softcap` is set. One primitive for all rows, whatever their
// history lengths. Nothing when it does not apply (a GPU default device, dtypes other than f32,
// shapes that do not match); the caller then attends row by row.
std::optional<mlx::core::array> rows_attention(const mlx::core::array& queries,
                                               const std::vector<mlx::core::array>& keys,
                                               const std::vector<mlx::core::array>& values,
                                               const std::vector<bool>& causal,
                                               const std::vector<std::optional<mlx::core::array>>& masks,
                                               float scale,
                                               std::optional<float> softcap);

}  // namespace mlxkit
