// Gated activations `act(gate) · up` on the CPU (see gated.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// The nonlinearities `gated_activation` computes.
enum class Gate { Silu, GeluTanh };

// `act(gate) · up` elementwise, through vectorized `exp`. Nothing when it does not apply (a GPU
// default device, dtypes other than f32, shapes that differ); the caller then uses MLX's ops.
std::optional<mlx::core::array> gated_activation(Gate gate_kind, const mlx::core::array& gate,
                                                 const mlx::core::array& up);

}  // namespace mlxkit
