// The shim's helper threads: the CPU kernels split their work over the thread MLX runs them on
// and these, so a decode step uses every core rather than one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace mlxkit {

// Threads a kernel's work is spread over: the calling thread plus the helpers. The number of
// CPUs this process may run on, capped at 8, or `MLXKIT_THREADS` when it is set (1 turns the
// helpers off).
int pool_threads();

// Uses `threads` threads from now on (1 to 64), starting helpers if there are too few; returns
// the number in effect.
int set_pool_threads(int threads);

// Calls `part(i)` for every `i` in `[0, parts)`, on the calling thread and the helpers, and
// returns once every call has returned. The parts must be independent of each other and of
// which thread runs them; a kernel that splits its output into parts this way computes the
// same bits whatever the number of threads. A call made while another thread's call is
// running runs its parts on the calling thread alone.
void parallel_for(int parts, const std::function<void(int)>& part);

// For a product of `rows` × `in` activations by `out` weight rows: runs `range(n0, n1)` over
// consecutive ranges of the weight rows, spread over the threads when the product is large
// enough to pay for handing work over (a few microseconds).
template <typename Range>
inline void split_rows(int rows, int in, int out, const Range& range) {
  constexpr int64_t kMinMacsPerPart = 1 << 17;
  const int64_t macs = static_cast<int64_t>(rows) * in * out;
  const int parts = static_cast<int>(
      std::min<int64_t>({pool_threads() * 4LL, macs / kMinMacsPerPart, out / 8}));
  if (parts <= 1) {
    range(0, out);
    return;
  }
  // Ranges start on multiples of 8 weight rows, the widest tile.
  auto bound = [&](int p) { return p == parts ? out : (out / 8 * p / parts) * 8; };
  parallel_for(parts, [&](int p) { range(bound(p), bound(p + 1)); });
}

}  // namespace mlxkit
