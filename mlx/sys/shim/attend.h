// Attention of one new token per row over each row's own history (see attend.cc).
#pragma once

#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxkit {

// `softmax(q kᵀ · scale) v` for `queries: [rows, heads, 1, head_dim]`, row r attending
// `keys[r], values[r]: [1, kv_heads, len_r, head_dim]` (every column visible), with logits
// soft-capped as `cap · tanh(logit / cap)` when `softcap` is set. One primitive for all rows,
// whatever their history lengths. Nothing when it does not apply (a GPU default device, dtypes
// other than f32, shapes that do not match); the caller then attends row by row.
std::optional<mlx::core::array> decode_attention(const mlx::core::array& queries,
                                                 const std::vector<mlx::core::array>& keys,
                                                 const std::vector<mlx::core::array>& values,
                                                 float scale, std::optional<float> softcap);

}  // namespace mlxkit
