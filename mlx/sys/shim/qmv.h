// The CPU matrix-vector product over packed affine weights (see qmv.cc).
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mlxkit {

// What the packed kernel multiplies the weights by: the activations as they are, or quantized
// to 8 bits per block of 32 for integer dot products (qmv8.cc; faster, not exact).
enum class Activations : int { F32 = 0, Int8 = 1 };

// The precision new packed products use: `MLXKIT_ACTIVATIONS` (`f32`, `int8`) at start, f32
// when it is unset, or the last `set_packed_activations`.
Activations packed_activations();
void set_packed_activations(Activations activations);

// Whether the packed kernel handles weights of this group size and bit width.
bool packed_matvec_supports(int group, int bits);

// The most rows of `x` for which the packed kernel beats a dense f32 copy of the matrix.
int packed_matvec_max_rows();

// `x wᵀ` through the packed kernel (any number of rows), or nothing when it does not apply: a
// GPU default device, dtypes other than f32 activations/scales/biases, or a layout
// the kernel does not read. The caller then uses MLX's own quantized matmul. `activations`
// asks for the integer path; layouts it does not take (qmv8.h) stay in f32.
std::optional<mlx::core::array> packed_matvec(const mlx::core::array& x,
                                              const mlx::core::array& w,
                                              const mlx::core::array& scales,
                                              const std::optional<mlx::core::array>& biases,
                                              int group, int bits, Activations activations);

}  // namespace mlxkit
