// How the shim's primitives take their inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"

namespace mlxkit {

// Where each row of `a` (every axis but the last) starts, in elements from `a.data()`, in
// row-major order of the leading axes. For a primitive that reads its input's rows through
// their strides instead of asking for a contiguous copy.
std::vector<int64_t> row_starts(const mlx::core::array& a);

// `a` as a row-contiguous array, for a primitive's `eval_cpu` that reads raw rows: `a` itself
// when its layout already is (weights, caches, most activations), else a copy that a task
// queued on `encoder` before the caller's fills, held until the caller's task is done. Taking
// inputs this way at evaluation, rather than wrapping them in `contiguous` when the graph is
// built, saves a graph node per input, and a decode step's primitives take some 250.
mlx::core::array ensure_row_contiguous(const mlx::core::array& a,
                                       mlx::core::cpu::CommandEncoder& encoder);

}  // namespace mlxkit
