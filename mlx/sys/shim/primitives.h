// Where the shim's custom CPU primitives run, and where they stand aside for MLX's own ops.
//
// Every primitive is a graph node with a CPU evaluation only. Each one asks `primitive_runs`
// before it builds its node and, when told no, declines (returns nothing) so the caller
// composes MLX's ops instead: that composition is the code path Metal and CUDA take. It stands
// aside when
//   - the default device is not the CPU (a GPU build), so no custom node ever reaches a GPU
//     stream, where it would have no kernel;
//   - the GPU path is asked for on a CPU (`MLXKIT_CPU_PRIMITIVES=off` at start, or
//     `set_cpu_primitives(false)`), which is how the tests run the GPU's code on this machine;
//   - its speed comes from x86-64 vector code and the CPU is not x86-64 (an arm64 machine): a
//     scalar loop in place of MLX's vectorised op is a slowdown no one measured. Primitives
//     written as plain loops the compiler vectorises for any target run everywhere.
#pragma once

#include <array>

namespace mlxkit {

enum class Primitive : int {
  PackedMatvec,
  RowsAttention,
  AppendRows,
  GatedActivation,
  RmsNorm,
  Rope,
  Softmax,
  GatedDeltaScan,
  SsdScan,
};

inline constexpr int kPrimitiveCount = 9;

// Why a primitive runs or stands aside: the text `mlxkit info` prints per primitive.
struct PrimitiveInfo {
  const char* name;
  // True when the kernel's speed comes from AVX2/AVX-512 code, with a scalar loop elsewhere.
  bool x86_vector_kernel;
};

inline constexpr std::array<PrimitiveInfo, kPrimitiveCount> kPrimitives{{
    {"packed_matvec", true},
    {"rows_attention", true},
    {"append_rows", false},
    {"gated_activation", true},
    {"rms_norm", false},
    {"rope", false},
    {"softmax_last_axis", true},
    {"gated_delta_scan", false},
    {"ssd_scan", false},
}};

// Whether `primitive` builds its node now (see the file comment), for f32 inputs on the
// default stream.
bool primitive_runs(Primitive primitive);

// Whether custom primitives may run at all on a CPU: false on the GPU path. Returns the
// setting in effect after the call.
bool cpu_primitives_enabled();
bool set_cpu_primitives(bool enabled);

// What `primitive` does on this machine now, in words ("AVX-512 kernel", "MLX's op: no NEON
// kernel", ...).
const char* primitive_path(Primitive primitive);

}  // namespace mlxkit
