// Where the shim's custom CPU primitives run (see primitives.h).

#include "primitives.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "mlx/mlx.h"
#include "x86.h"

namespace mlxkit {

namespace mx = mlx::core;

namespace {

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> enabled([] {
    const char* env = std::getenv("MLXKIT_CPU_PRIMITIVES");
    return env == nullptr || std::strcmp(env, "off") != 0;
  }());
  return enabled;
}

const PrimitiveInfo& info(Primitive primitive) {
  return kPrimitives[static_cast<int>(primitive)];
}

// Whether this CPU runs the primitive's kernel as it was written to be fast.
bool kernel_suits_this_cpu(Primitive primitive) {
#if defined(__x86_64__)
  (void)primitive;
  return true;
#else
  return !info(primitive).x86_vector_kernel;
#endif
}

}  // namespace

bool cpu_primitives_enabled() {
  return enabled_flag().load(std::memory_order_relaxed);
}

bool set_cpu_primitives(bool enabled) {
  enabled_flag().store(enabled, std::memory_order_relaxed);
  return enabled;
}

bool primitive_runs(Primitive primitive) {
  return mx::default_device() == mx::Device::cpu && cpu_primitives_enabled() &&
         kernel_suits_this_cpu(primitive);
}

const char* primitive_path(Primitive primitive) {
  if (mx::default_device() != mx::Device::cpu) {
    return "MLX's op (the default device is a GPU)";
  }
  if (!cpu_primitives_enabled()) {
    return "MLX's op (the GPU's path, MLXKIT_CPU_PRIMITIVES=off)";
  }
  if (!kernel_suits_this_cpu(primitive)) {
    return "MLX's op (this kernel is vectorised for x86-64 only; no NEON kernel yet)";
  }
  if (!info(primitive).x86_vector_kernel) {
    return "compiled loop (vectorised by the compiler for this CPU)";
  }
  switch (kernel_level()) {
    case kAvx512: return "AVX-512 kernel";
    case kAvx2: return "AVX2 kernel";
    default: return "portable scalar loop (capped by MLXKIT_CPU_KERNELS)";
  }
}

}  // namespace mlxkit
