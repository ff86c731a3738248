//! Element types of arrays, and the Rust types that map onto them.

use crate::{Error, Result};

/// The element type of an array. Discriminants are the codes the shim shares with MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// Booleans, one byte each.
    Bool = 0,
    /// Unsigned 8-bit integers.
    U8 = 1,
    /// Unsigned 16-bit integers.
    U16 = 2,
    /// Unsigned 32-bit integers.
    U32 = 3,
    /// Unsigned 64-bit integers.
    U64 = 4,
    /// Signed 8-bit integers.
    I8 = 5,
    /// Signed 16-bit integers.
    I16 = 6,
    /// Signed 32-bit integers.
    I32 = 7,
    /// Signed 64-bit integers.
    I64 = 8,
    /// IEEE half precision.
    F16 = 9,
    /// IEEE single precision.
    F32 = 10,
    /// IEEE double precision (CPU only in MLX).
    F64 = 11,
    /// Brain floating point.
    Bf16 = 12,
    /// Complex numbers of two f32.
    Complex64 = 13,
}

impl Dtype {
    pub(crate) fn from_code(code: u8) -> Result<Dtype> {
        use Dtype::*;
        Ok(match code {
            0 => Bool,
            1 => U8,
            2 => U16,
            3 => U32,
            4 => U64,
            5 => I8,
            6 => I16,
            7 => I32,
            8 => I64,
            9 => F16,
            10 => F32,
            11 => F64,
            12 => Bf16,
            13 => Complex64,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown dtype code {other}"
                )));
            }
        })
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    /// Bytes per element.
    pub fn size_of(self) -> usize {
        use Dtype::*;
        match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | Bf16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | Complex64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64 | Dtype::Bf16)
    }
}

/// A Rust type whose values can be copied into and out of an array of [`Element::DTYPE`].
pub trait Element: bytemuck::Pod {
    /// The array dtype this type maps to.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })*
    };
}

element! {
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => Bf16,
}
