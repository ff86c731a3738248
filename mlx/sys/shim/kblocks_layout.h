// The byte layout of a k-block matrix (kblocks.cc), shared by its f32 and 8-bit-activation
// products (kblocks_int8.cc).
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

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "half.h"
#include "kblocks.h"

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

}  // namespace mlxkit::kblock
