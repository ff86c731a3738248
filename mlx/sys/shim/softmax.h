// Softmax over the last axis on the CPU (see softmax.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// `softmax(x)` over the last axis of an f32 array, through vectorized `exp`, rows spread over
// the pool's threads. Nothing when it does not apply (a GPU default device, another dtype, no
// elements); the caller then uses MLX's softmax.
std::optional<mlx::core::array> last_axis_softmax(const mlx::core::array& x);

}  // namespace mlxkit
