// The byte layout of a k-block matrix (kblocks.cc), and the order its products walk it in,
// shared by the f32 and 8-bit-activation products (kblocks_int8.cc).
//
// A `[out, in]` matrix is `out / 8` bands; a band is `in / 256` band super-blocks, one after
// another, each holding everything the band's 8 rows need for 256 columns:
//
//   Q4_K (1,184 bytes): d[8] f16 at 0, dmin[8] f16 at 16, sc[8 groups][8 rows] at 32,
//   m[8][8] at 96 (both 0..63), then at 160 each row's 128 bytes of nibbles (byte 32c + l:
//   element 64c + l low, 64c + 32 + l high).
//
//   Q6_K (2,192 bytes): d[8] f16 at 0, signed sc[16 groups][8 rows] at 16, then at 144 each
//   row's 256 values `q - 32` as signed bytes, in column order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "half.h"
#include "kblocks.h"
#include "pool.h"

namespace mlxkit::kblock {

constexpr int kBand = 8;
constexpr int kSuper = 256;
constexpr int kQ4 = static_cast<int>(KBlockType::Q4K);
constexpr int kQ6 = static_cast<int>(KBlockType::Q6K);

// Offsets within a band super-block.
constexpr size_t kQ4Mins = 16;     // dmin[8]
constexpr size_t kQ4Scales = 32;   // sc[8][8]
constexpr size_t kQ4Offsets = 96;  // m[8][8]
constexpr size_t kQ4Values = 160;  // 8 × 128 bytes
constexpr size_t kQ6Scales = 16;   // sc[16][8]
constexpr size_t kQ6Values = 144;  // 8 × 256 bytes

constexpr bool known(int type) {
  return type == kQ4 || type == kQ6;
}

// Bytes of one band super-block.
constexpr size_t band_block(int type) {
  return type == kQ4 ? kQ4Values + kBand * 128 : kQ6Values + kBand * 256;
}

// The f16 at `p`, widened.
inline float f16(const uint8_t* p) {
  Half h;
  std::memcpy(&h.bits, p, 2);
  return widen(h);
}

// Rows of `x` one pass carries, and bands per pass over many rows (128 weight rows: a Q4_K
// band range of ~150 KB at 2,048 columns stays in L2 while each block of rows reads it).
constexpr int kBlockRows = 8;
constexpr int kBandsPerPass = 16;

// Splits `x wᵀ` (`rows` rows of `x`, `out` weight rows) over the thread pool and calls
// `pass(m0, m, b0, b1)` for rows `[m0, m0 + m)` of `x` (at most `kBlockRows`) against bands
// `[b0, b1)`: every band at once for a few rows (a decode step), else `kBandsPerPass` bands at
// a time, each read by every block of rows while it is in cache.
template <typename Pass>
void for_each_pass(int rows, int64_t in, int64_t out, const Pass& pass) {
  const int bands = static_cast<int>(out / kBand);
  const int per_pass = rows <= kBlockRows ? bands : kBandsPerPass;
  split_rows(rows, static_cast<int>(in), static_cast<int>(out), [&](int n0, int n1) {
    for (int b0 = n0 / kBand; b0 < n1 / kBand; b0 += per_pass) {
      const int b1 = std::min(n1 / kBand, b0 + per_pass);
      for (int m0 = 0; m0 < rows; m0 += kBlockRows) {
        pass(m0, std::min(kBlockRows, rows - m0), b0, b1);
      }
    }
  });
}

}  // namespace mlxkit::kblock
