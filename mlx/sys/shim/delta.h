// The gated delta rule's sequential scan on the CPU (see delta.cc).
#pragma once

#include <optional>
#include <utility>

#include "mlx/mlx.h"

namespace mlxkit {

// One gated delta rule scan over `T` tokens (Yang et al., "Gated Delta Networks", 2024):
// q, k `[B, T, Hk, Dk]` (already normalized and scaled), v `[B, T, Hv, Dv]`, g `[B, T, Hv]`
// (log decay, ≤ 0), beta `[B, T, Hv]`, state `[B, Hv, Dv, Dk]` → outputs `[B, T, Hv, Dv]` and
// the state after the last token. All f32. Nothing when it does not apply (a GPU default
// device, another dtype, inconsistent shapes); the caller then runs the recurrence in MLX ops.
std::optional<std::pair<mlx::core::array, mlx::core::array>> scan_gated_delta(
    const mlx::core::array& q, const mlx::core::array& k, const mlx::core::array& v,
    const mlx::core::array& g, const mlx::core::array& beta, const mlx::core::array& state);

}  // namespace mlxkit
