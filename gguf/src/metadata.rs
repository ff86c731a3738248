//! The header and the metadata pairs: magic, version, the two counts, then key → value.

use std::io::Read;

use crate::cursor::{Context, Cursor, Parsed};
use crate::error::{Counted, Problem};
use crate::magic::MAGIC;
use crate::value::{MetaValue, Metadata, min_encoded_size};

/// How deep arrays of arrays may nest. GGUF allows nesting, no model uses more than one level,
/// and the cap keeps a hostile file from recursing without bound.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// The header and metadata of a file, with the cursor left at the start of the tensor
/// directory.
pub(crate) struct Head {
    pub(crate) version: u32,
    /// As the file states it: unchecked until the tensor directory is read.
    pub(crate) tensor_count: u64,
    pub(crate) metadata: Metadata,
}

/// Reads the header and every metadata pair.
pub(crate) fn read_head<R: Read>(cursor: &mut Cursor<R>) -> Parsed<Head> {
    let magic: [u8; 4] = cursor.bytes(Context::Header)?;
    if &magic != MAGIC {
        return Err(cursor.malformed_at(0, Context::Header, Problem::NotGguf { magic }));
    }
    let version = cursor.u32(Context::Header)?;
    if !(2..=3).contains(&version) {
        return Err(cursor.malformed_at(4, Context::Header, Problem::UnsupportedVersion(version)));
    }
    let tensor_count = cursor.u64(Context::Header)?;
    let kv_count = cursor.u64(Context::Header)?;
    // The smallest pair: an empty key (8), the value type (4) and a one-byte value.
    cursor.ensure_fits(kv_count, 8 + 4 + 1, Context::Header, Counted::MetadataPairs)?;
    let mut metadata = Metadata::new();
    for index in 0..kv_count {
        let key_at = cursor.offset();
        let key = cursor.string(Context::Key(index))?;
        let value_type = cursor.u32(Context::Value(&key))?;
        let value = read_value(cursor, value_type, Context::Value(&key), 0)?;
        if metadata.contains_key(&key) {
            return Err(cursor.malformed_at(
                key_at,
                Context::Key(index),
                Problem::DuplicateKey(key),
            ));
        }
        metadata.insert(key, value);
    }
    Ok(Head {
        version,
        tensor_count,
        metadata,
    })
}

/// One value of type `value_type`; `depth` counts the arrays it sits in.
fn read_value<R: Read>(
    cursor: &mut Cursor<R>,
    value_type: u32,
    context: Context<'_>,
    depth: usize,
) -> Parsed<MetaValue> {
    Ok(match value_type {
        0 => MetaValue::U8(u8::from_le_bytes(cursor.bytes(context)?)),
        1 => MetaValue::I8(i8::from_le_bytes(cursor.bytes(context)?)),
        2 => MetaValue::U16(u16::from_le_bytes(cursor.bytes(context)?)),
        3 => MetaValue::I16(i16::from_le_bytes(cursor.bytes(context)?)),
        4 => MetaValue::U32(cursor.u32(context)?),
        5 => MetaValue::I32(i32::from_le_bytes(cursor.bytes(context)?)),
        6 => MetaValue::F32(f32::from_le_bytes(cursor.bytes(context)?)),
        7 => match cursor.bytes::<1>(context)?[0] {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            other => return Err(cursor.malformed(context, Problem::BadBool(other))),
        },
        8 => MetaValue::String(cursor.string(context)?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(cursor.malformed(context, Problem::NestedTooDeep));
            }
            let element_type = cursor.u32(context)?;
            let Some(min_size) = min_encoded_size(element_type) else {
                return Err(cursor.malformed(context, Problem::UnknownValueType(element_type)));
            };
            let count = cursor.u64(context)?;
            cursor.ensure_fits(count, min_size, context, Counted::ArrayElements)?;
            // `count` elements fit in the rest of the file, so this reserves at most
            // `size_of::<MetaValue>()` bytes per byte of file, once, and never grows.
            let mut items = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
            for _ in 0..count {
                items.push(read_value(cursor, element_type, context, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(cursor.u64(context)?),
        11 => MetaValue::I64(i64::from_le_bytes(cursor.bytes(context)?)),
        12 => MetaValue::F64(f64::from_le_bytes(cursor.bytes(context)?)),
        other => return Err(cursor.malformed(context, Problem::UnknownValueType(other))),
    })
}
