// The Mamba-2 state space scan on the CPU (see ssd.cc).
#pragma once

#include <optional>
#include <utility>

#include "mlx/mlx.h"

namespace mlxkit {

// One selective state space scan over `T` tokens (Dao and Gu, "Transformers are SSMs", 2024):
// x `[B, T, H, P]`, dt `[B, T, H]` (step sizes, after softplus and clamping), a `[H]` (negative
// decay rates), b and c `[B, T, G, N]` (each group shared by `H / G` heads), state
// `[B, H, P, N]` → outputs `[B, T, H, P]` (without the `D` skip term) and the state after the
// last token. All f32. Nothing when it does not apply (a GPU default device, another dtype,
// inconsistent shapes); the caller then runs the recurrence in MLX ops.
std::optional<std::pair<mlx::core::array, mlx::core::array>> scan_ssd(
    const mlx::core::array& x, const mlx::core::array& dt, const mlx::core::array& a,
    const mlx::core::array& b, const mlx::core::array& c, const mlx::core::array& state);

}  // namespace mlxkit
