//! GGML tensor types: which ones GGUF files carry, and their block layouts.

use std::fmt;

/// The storage type of a GGUF tensor, numbered as in GGML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// 32 × 4-bit, `w = d·(q − 8)`.
    Q4_0,
    /// 32 × 4-bit, `w = d·q + m`.
    Q4_1,
    /// 32 × 5-bit, `w = d·(q − 16)`.
    Q5_0,
    /// 32 × 5-bit, `w = d·q + m`.
    Q5_1,
    /// 32 × 8-bit signed, `w = d·q`.
    Q8_0,
    /// 256 × 2-bit in 16 groups of 16 with 4-bit scales and mins.
    Q2K,
    /// 256 × 3-bit in 16 groups of 16 with 6-bit scales.
    Q3K,
    /// 256 × 4-bit in 8 groups of 32 with 6-bit scales and mins.
    Q4K,
    /// 256 × 5-bit in 8 groups of 32 with 6-bit scales and mins.
    Q5K,
    /// 256 × 6-bit in 16 groups of 16 with 8-bit scales.
    Q6K,
    /// Signed 8-bit integers.
    I8,
    /// Signed 16-bit integers.
    I16,
    /// Signed 32-bit integers.
    I32,
    /// Signed 64-bit integers.
    I64,
    /// IEEE double precision.
    F64,
    /// Brain floating point.
    Bf16,
    /// A type GGML knows that this crate cannot size (the id is kept for the message).
    Other(u32),
}

impl GgmlType {
    /// The type with GGML id `id`.
    pub fn from_id(id: u32) -> GgmlType {
        use GgmlType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => Bf16,
            other => Other(other),
        }
    }

    /// GGML's id for this type.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            Bf16 => 30,
            Other(id) => id,
        }
    }

    /// `(elements per block, bytes per block)`, or `None` for types this crate cannot size.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        use GgmlType::*;
        Some(match self {
            F32 | I32 => (1, 4),
            F16 | Bf16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Other(_) => return None,
        })
    }

    /// Whether values are stored in blocks with shared scales (as opposed to plain elements).
    pub fn is_block_quantized(self) -> bool {
        self.block_layout()
            .is_some_and(|(elements, _)| elements > 1)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgmlType::*;
        let name = match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            Bf16 => "BF16",
            Other(id) => return write!(f, "GGML type {id}"),
        };
        f.write_str(name)
    }
}
