// How the shim's primitives take their inputs.
#pragma once

#include "mlx/mlx.h"

namespace mlxkit {

// `a` as a row-contiguous input of a primitive that reads raw rows. An evaluated array that is
// already row-contiguous (a weight, a cache) is taken as it is: wrapping it in `contiguous`
// anyway would add a graph node per use, and a decode step uses a few hundred weights.
inline mlx::core::array row_contiguous(const mlx::core::array& a) {
  if (a.is_available() && a.flags().row_contiguous) {
    return a;
  }
  return mlx::core::contiguous(a);
}

}  // namespace mlxkit
