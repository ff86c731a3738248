// Every row's new keys and values written into its own cache, in one node for the whole batch.
//
// A batched decode step writes each row's keys and values into that row's buffers: with MLX
// ops that is, per row and layer, two slices picking the row, two slice updates and two slices
// cutting the history back out, six graph nodes. At eight rows of SmolLM2 that is 1,440 nodes
// a step, about 5 ms of MLX's per-node cost (building, scheduling, allocating) on a 2-core
// machine, paid for copying a few kilobytes. This primitive does the same in one node per
// layer: each output buffer takes over its input's memory when nothing else holds it (as a
// slice update does) and gets the row's new tokens copied in, and each history is a view of
// its buffer's first slots (as many as the caller says: a ring's are not the last written),
// with no node of its own.

#include "append.h"
#include "primitives.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#include "inputs.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

// Row-major flags for a view of `shape` through `strides` over `data_size` elements; axes of
// one element say nothing about the layout.
mx::array::Flags view_flags(const mx::Shape& shape, const mx::Strides& strides,
                            size_t data_size) {
  size_t elements = 1;
  for (auto d : shape) {
    elements *= static_cast<size_t>(d);
  }
  bool row = true;
  int64_t expected = 1;
  for (int axis = static_cast<int>(shape.size()) - 1; axis >= 0; --axis) {
    if (shape[axis] == 1) {
      continue;
    }
    if (strides[axis] != expected) {
      row = false;
      break;
    }
    expected *= shape[axis];
  }
  mx::array::Flags flags;
  flags.contiguous = elements == data_size;
  flags.row_contiguous = row && flags.contiguous;
  flags.col_contiguous = false;
  return flags;
}

// Copies row `r` of `from` (`[rows, heads, tokens, width]`, read through its strides) into
// slots `at..at + tokens` of `to` (`[1, heads, capacity, width]`, row-contiguous).
void write_row(const mx::array& from, const std::vector<int64_t>& starts, int r, int at,
               mx::array& to) {
  const int64_t heads = from.shape(1);
  const int64_t tokens = from.shape(2);
  const int64_t width = from.shape(3);
  const int64_t capacity = to.shape(2);
  const int64_t stride = from.strides(3);
  const size_t item = from.itemsize();
  const auto* src = static_cast<const char*>(from.data<void>());
  auto* dst = static_cast<char*>(to.data<void>());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t t = 0; t < tokens; ++t) {
      const char* row = src + starts[(r * heads + h) * tokens + t] * static_cast<int64_t>(item);
      char* slot = dst + ((h * capacity + at + t) * width) * static_cast<int64_t>(item);
      if (stride == 1) {
        std::memcpy(slot, row, width * item);
      } else {
        for (int64_t i = 0; i < width; ++i) {
          std::memcpy(slot + i * item, row + i * stride * static_cast<int64_t>(item), item);
        }
      }
    }
  }
}

class AppendRows : public mx::Primitive {
 public:
  AppendRows(mx::Stream stream, std::vector<int> offsets)
      : mx::Primitive(stream), offsets_(std::move(offsets)) {}

  // Inputs: keys, values, then every row's key buffer, then every row's value buffer.
  // Outputs: the rows' key buffers, value buffers, key histories, value histories.
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    const int rows = static_cast<int>(offsets_.size());
    const auto& keys = inputs[0];
    const auto& values = inputs[1];
    // Every output of a multi-output node holds its own copy of the inputs, so no input
    // would ever look unshared. The siblings' copies are cleared here, as MLX's `detach`
    // clears them right after this evaluation anyway; the array being evaluated keeps
    // `inputs`. Not under a transform (a tracer), which may still need the siblings' inputs.
    const bool traced = std::any_of(outputs.begin(), outputs.end(),
                                    [](const mx::array& o) { return o.is_tracer(); });
    if (!traced) {
      for (auto& o : outputs) {
        if (&o.inputs() != &inputs) {
          o.inputs().clear();
        }
      }
    }
    for (int i = 0; i < 2 * rows; ++i) {
      const auto& in = inputs[2 + i];
      auto& out = outputs[i];
      if (in.flags().row_contiguous && in.is_donatable()) {
        out.copy_shared_buffer(in);
        continue;
      }
      // Someone else still reads the old buffer (a history kept alive, a snapshot's view):
      // the row gets a copy, as a slice update would.
      const auto whole = ensure_row_contiguous(in, encoder);
      out.set_data(mx::allocator::malloc(out.nbytes()));
      encoder.set_input_array(whole);
      encoder.set_output_array(out);
      encoder.dispatch([whole = mx::array::unsafe_weak_copy(whole),
                        out = mx::array::unsafe_weak_copy(out)]() mutable {
        std::memcpy(out.data<void>(), whole.data<void>(), out.nbytes());
      });
    }
    for (int i = 0; i < 2 * rows; ++i) {
      const auto& buffer = outputs[i];
      auto& view = outputs[2 * rows + i];
      const auto& strides = buffer.strides();
      const size_t data_size =
          static_cast<size_t>((view.shape(1) - 1) * strides[1] + view.shape(2) * strides[2]);
      view.copy_shared_buffer(buffer, strides, view_flags(view.shape(), strides, data_size),
                              data_size);
    }
    encoder.set_input_array(keys);
    encoder.set_input_array(values);
    std::vector<mx::array> buffers;
    buffers.reserve(2 * rows);
    for (int i = 0; i < 2 * rows; ++i) {
      encoder.set_output_array(outputs[i]);
      buffers.push_back(mx::array::unsafe_weak_copy(outputs[i]));
    }
    encoder.dispatch([keys = mx::array::unsafe_weak_copy(keys),
                      values = mx::array::unsafe_weak_copy(values), key_starts = row_starts(keys),
                      value_starts = row_starts(values), buffers = std::move(buffers),
                      offsets = offsets_]() mutable {
      const int rows = static_cast<int>(offsets.size());
      for (int r = 0; r < rows; ++r) {
        write_row(keys, key_starts, r, offsets[r], buffers[r]);
        write_row(values, value_starts, r, offsets[r], buffers[rows + r]);
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("the batched cache append runs on the CPU only");
  }

  const char* name() const override {
    return "AppendRows";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const AppendRows*>(&other);
    return o != nullptr && offsets_ == o->offsets_;
  }

 private:
  std::vector<int> offsets_;
};

}  // namespace

std::optional<AppendedRows> append_rows(const mx::array& keys, const mx::array& values,
                                        const std::vector<mx::array>& key_buffers,
                                        const std::vector<mx::array>& value_buffers,
                                        const std::vector<int>& offsets,
                                        const std::vector<int>& lengths) {
  const size_t rows = offsets.size();
  if (!primitive_runs(Primitive::AppendRows) || rows == 0 || key_buffers.size() != rows ||
      value_buffers.size() != rows || lengths.size() != rows || keys.ndim() != 4 || values.ndim() != 4 ||
      keys.dtype() != values.dtype() || keys.shape(0) != static_cast<int>(rows) ||
      values.shape(0) != keys.shape(0) || values.shape(1) != keys.shape(1) ||
      values.shape(2) != keys.shape(2) || keys.shape(2) == 0) {
    return std::nullopt;
  }
  const int heads = keys.shape(1);
  const int tokens = keys.shape(2);
  std::vector<mx::Shape> shapes;
  std::vector<mx::Dtype> dtypes;
  std::vector<mx::array> inputs{keys, values};
  const auto fits = [&](const mx::array& buffer, const mx::array& update, size_t r) {
    return buffer.ndim() == 4 && buffer.shape(0) == 1 && buffer.shape(1) == heads &&
           buffer.shape(3) == update.shape(3) && buffer.dtype() == update.dtype() &&
           offsets[r] >= 0 && static_cast<int64_t>(offsets[r]) + tokens <= buffer.shape(2) &&
           lengths[r] >= 1 && lengths[r] <= buffer.shape(2);
  };
  for (size_t r = 0; r < rows; ++r) {
    if (!fits(key_buffers[r], keys, r) || !fits(value_buffers[r], values, r)) {
      return std::nullopt;
    }
  }
  for (const auto* list : {&key_buffers, &value_buffers}) {
    for (const auto& buffer : *list) {
      inputs.push_back(buffer);
      shapes.push_back(buffer.shape());
      dtypes.push_back(buffer.dtype());
    }
  }
  for (const auto* list : {&key_buffers, &value_buffers}) {
    for (size_t r = 0; r < rows; ++r) {
      const auto& buffer = (*list)[r];
      shapes.push_back({1, heads, lengths[r], buffer.shape(3)});
      dtypes.push_back(buffer.dtype());
    }
  }
  const auto stream = mx::default_stream(mx::Device::cpu);
  auto outputs = mx::array::make_arrays(std::move(shapes), dtypes,
                                        std::make_shared<AppendRows>(stream, offsets),
                                        std::move(inputs));
  AppendedRows appended;
  for (size_t r = 0; r < rows; ++r) {
    appended.key_buffers.push_back(outputs[r]);
    appended.value_buffers.push_back(outputs[rows + r]);
    appended.key_history.push_back(outputs[2 * rows + r]);
    appended.value_history.push_back(outputs[3 * rows + r]);
  }
  return appended;
}

}  // namespace mlxkit
