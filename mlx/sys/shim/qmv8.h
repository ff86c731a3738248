// The packed matrix-vector product over 8-bit activations (see qmv8.cc).
#pragma once

#include <cstdint>

namespace mlxkit {

// Whether the integer kernel takes `in`-wide rows of weights of this group size and width:
// 4-bit groups a multiple of 32, 8-bit groups a multiple of 16, rows a multiple of 32.
bool int8_matvec_supports(int in, int group, int bits);

// `y = x wᵀ` for `rows` rows of `x` (`rows × in`, f32) over the packed affine matrix `w`
// (`out` rows of `in` elements, `bits` each, one f32 scale and bias per `group`), with `x`
// quantized to 8 bits per block of 32. `y` is `rows × out`.
void int8_matvec(const float* x, int rows, int in, const uint8_t* w, const float* scales,
                 const float* biases, int group, int bits, int out, float* y);

}  // namespace mlxkit
