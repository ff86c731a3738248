//! Metadata values: the thirteen GGUF value types, and reading them as the widths callers want.

use std::collections::BTreeMap;
use std::fmt;

/// A file's metadata: key → value, in key order.
pub type Metadata = BTreeMap<String, MetaValue>;

/// One metadata value; the variants are GGUF's value types, in the order of their type ids.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// Type 0, `uint8`.
    U8(u8),
    /// Type 1, `int8`.
    I8(i8),
    /// Type 2, `uint16`.
    U16(u16),
    /// Type 3, `int16`.
    I16(i16),
    /// Type 4, `uint32`.
    U32(u32),
    /// Type 5, `int32`.
    I32(i32),
    /// Type 6, `float32`.
    F32(f32),
    /// Type 7, `bool` (one byte, 0 or 1).
    Bool(bool),
    /// Type 8, a UTF-8 string.
    String(String),
    /// Type 9: an array whose elements all have one type.
    Array(Vec<MetaValue>),
    /// Type 10, `uint64`.
    U64(u64),
    /// Type 11, `int64`.
    I64(i64),
    /// Type 12, `float64`.
    F64(f64),
}

impl MetaValue {
    /// GGUF's id for this value's type (0 to 12).
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float, if it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            // Scores are sometimes written as integers; precision lost past 2^53 does not matter.
            _ => (self.as_i64().map(|v| v as f64)).or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as text, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, if the value is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Numbers and strings as written; arrays by their length, since a vocabulary's would fill a
/// screen in an error message.
impl fmt::Display for MetaValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::Array(items) => write!(f, "an array of {} values", items.len()),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
        }
    }
}

/// The fewest bytes one value of GGUF type `type_id` occupies in a file, or `None` for a type
/// GGUF does not define: what bounds an array's count before its elements are read.
pub(crate) fn min_encoded_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        // A string's length field, an array's element type and count.
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}
