// How the shim's primitives take their inputs (see inputs.h).

#include "inputs.h"

#include <algorithm>
#include <cstring>

#include "mlx/allocator.h"

namespace mlxkit {

namespace mx = mlx::core;

std::vector<int64_t> row_starts(const mx::array& a) {
  const int leading = static_cast<int>(a.ndim()) - 1;
  int64_t rows = 1;
  for (int axis = 0; axis < leading; ++axis) {
    rows *= a.shape(axis);
  }
  std::vector<int64_t> starts;
  starts.reserve(static_cast<size_t>(rows));
  std::vector<int32_t> index(static_cast<size_t>(std::max(leading, 0)), 0);
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r) {
    starts.push_back(at);
    // Advance the odometer over the leading axes, the last of them fastest.
    for (int axis = leading - 1; axis >= 0; --axis) {
      at += a.strides(axis);
      if (++index[axis] < a.shape(axis)) {
        break;
      }
      at -= static_cast<int64_t>(a.shape(axis)) * a.strides(axis);
      index[axis] = 0;
    }
  }
  return starts;
}

mx::array ensure_row_contiguous(const mx::array& a, mx::cpu::CommandEncoder& encoder) {
  if (a.flags().row_contiguous) {
    return a;
  }
  mx::array copy(a.shape(), a.dtype(), nullptr, {});
  copy.set_data(mx::allocator::malloc(copy.nbytes()));
  encoder.set_input_array(a);
  encoder.set_output_array(copy);
  encoder.dispatch([a = mx::array::unsafe_weak_copy(a), copy = mx::array::unsafe_weak_copy(copy),
                    starts = row_starts(a)]() mutable {
    const size_t item = a.itemsize();
    const int64_t n = a.ndim() == 0 ? 1 : a.shape(-1);
    const int64_t stride = a.ndim() == 0 ? 0 : a.strides(a.ndim() - 1);
    const auto* from = static_cast<const char*>(a.data<void>());
    auto* to = static_cast<char*>(copy.data<void>());
    for (int64_t start : starts) {
      const char* row = from + start * static_cast<int64_t>(item);
      if (stride == 1) {
        std::memcpy(to, row, n * item);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          std::memcpy(to + i * item, row + i * stride * static_cast<int64_t>(item), item);
        }
      }
      to += n * item;
    }
  });
  encoder.add_temporary(copy);
  return copy;
}

}  // namespace mlxkit
