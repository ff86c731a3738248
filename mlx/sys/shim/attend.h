// Attention of each row's queries over the row's own history (see attend.cc).
#pragma once

#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxkit {

// `softmax(q kᵀ · scale) v` for `queries: [rows, heads, length, head_dim]`, row r attending
// `keys[r], values[r]: [1, kv_heads, len_r, head_dim]`: every column when `causal[r]` is false,
// and when it is true, query i the columns up to `len_r - length + i` (the queries are the
// last `length` positions of the history, MLX's causal alignment). Logits are soft-capped as
// `cap · tanh(logit / cap)` when `softcap` is set. One primitive for all rows, whatever their
// history lengths. Nothing when it does not apply (a GPU default device, dtypes other than f32,
// shapes that do not match); the caller then attends row by row.
std::optional<mlx::core::array> rows_attention(const mlx::core::array& queries,
                                               const std::vector<mlx::core::array>& keys,
                                               const std::vector<mlx::core::array>& values,
                                               const std::vector<bool>& causal, float scale,
                                               std::optional<float> softcap);

}  // namespace mlxkit
