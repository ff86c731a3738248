//! The tensor directory: each tensor's name, shape, type and where its bytes lie, checked
//! against the file before anyone reads them.

use std::collections::BTreeMap;
use std::io::Read;

use crate::cursor::{Context, Cursor, Parsed};
use crate::error::{Counted, Problem};
use crate::ggml_type::GgmlType;
use crate::value::Metadata;

/// Where the data section starts when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// The largest dimension accepted: GGML counts elements in `int64_t`, and the kernels that
/// consume tensors (MLX, Metal, most of llama.cpp's) index a dimension with 32 bits. No
/// published model comes near it.
pub const MAX_DIMENSION: u64 = i32::MAX as u64;

/// Where one tensor lives in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The llama.cpp tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions outermost first, as row-major libraries order them (GGUF stores them
    /// innermost first). Each is at most [`MAX_DIMENSION`].
    pub shape: Vec<i32>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data; `offset + size` is inside the file.
    pub size: u64,
}

/// The tensor directory and where the data section starts.
pub(crate) struct Directory {
    pub(crate) alignment: u64,
    pub(crate) data_start: u64,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) by_name: BTreeMap<String, usize>,
}

/// One entry as the file states it, before its extent is known.
struct RawEntry {
    at: u64,
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
}

/// The smallest directory entry: name length, dimension count, one dimension, type, offset.
const MIN_ENTRY_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Reads `tensor_count` entries at the cursor and checks each tensor's bytes against a file of
/// `cursor.len()` bytes.
pub(crate) fn read_directory<R: Read>(
    cursor: &mut Cursor<R>,
    tensor_count: u64,
    metadata: &Metadata,
) -> Parsed<Directory> {
    cursor.ensure_fits(
        tensor_count,
        MIN_ENTRY_BYTES,
        Context::Header,
        Counted::TensorEntries,
    )?;
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(value) => match value.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => {
                return Err(cursor.malformed(
                    Context::Value("general.alignment"),
                    Problem::BadAlignment(value.to_string()),
                ));
            }
        },
    };

    let mut raw = Vec::with_capacity(usize::try_from(tensor_count).unwrap_or(0));
    for index in 0..tensor_count {
        let at = cursor.offset();
        let name = cursor.string(Context::TensorName(index))?;
        let context = Context::Tensor(&name);
        let n_dims = cursor.u32(context)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(cursor.malformed(context, Problem::BadDimensionCount(n_dims)));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(cursor.u64(context)?);
        }
        let ggml_type = GgmlType::from_id(cursor.u32(context)?);
        let offset = cursor.u64(context)?;
        raw.push(RawEntry {
            at,
            name,
            dims,
            ggml_type,
            offset,
        });
    }

    let file_len = cursor.len();
    let data_start = cursor.offset().div_ceil(alignment) * alignment;
    if data_start > file_len && tensor_count > 0 {
        return Err(cursor.malformed(
            Context::Directory,
            Problem::DataStartPastEnd {
                data_start,
                file_len,
            },
        ));
    }
    let data_len = file_len.saturating_sub(data_start);

    let mut tensors = Vec::with_capacity(raw.len());
    let mut by_name = BTreeMap::new();
    for entry in raw {
        let at = entry.at;
        let info = locate(entry, alignment, data_start, data_len)
            .map_err(|(name, problem)| cursor.malformed_at(at, Context::Tensor(&name), problem))?;
        if by_name.contains_key(&info.name) {
            return Err(cursor.malformed_at(
                at,
                Context::Directory,
                Problem::DuplicateTensor(info.name),
            ));
        }
        by_name.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }
    if let Some((first, second)) = first_overlap(&tensors) {
        let problem = Problem::Overlap(first.name.clone());
        return Err(cursor.malformed(Context::Tensor(&second.name), problem));
    }
    Ok(Directory {
        alignment,
        data_start,
        tensors,
        by_name,
    })
}

/// The entry's shape and byte extent, checked: whole blocks, aligned, inside the data section.
fn locate(
    entry: RawEntry,
    alignment: u64,
    data_start: u64,
    data_len: u64,
) -> Result<TensorInfo, (String, Problem)> {
    let RawEntry {
        name,
        dims,
        ggml_type,
        offset,
        ..
    } = entry;
    let fail = |name: String, problem| Err((name, problem));
    let mut elements: u64 = 1;
    let mut shape = Vec::with_capacity(dims.len());
    for &d in dims.iter().rev() {
        let Some(d32) = i32::try_from(d).ok().filter(|_| d <= MAX_DIMENSION) else {
            return fail(name, Problem::DimensionTooLarge(d));
        };
        let Some(product) = elements.checked_mul(d) else {
            return fail(name, Problem::ElementCountOverflows);
        };
        elements = product;
        shape.push(d32);
    }
    let Some((block, block_bytes)) = ggml_type.block_layout() else {
        return fail(name, Problem::UnsupportedType(ggml_type));
    };
    // `dims` has 1 to MAX_DIMS entries: the reader refused any other count.
    let row = dims[0];
    if !row.is_multiple_of(block) {
        return fail(
            name,
            Problem::PartialBlock {
                row,
                ggml_type,
                block,
            },
        );
    }
    let Some(size) = (elements / block).checked_mul(block_bytes) else {
        return fail(name, Problem::ByteSizeOverflows);
    };
    if !offset.is_multiple_of(alignment) {
        return fail(name, Problem::Misaligned { offset, alignment });
    }
    let end = offset.saturating_add(size);
    if end > data_len {
        return fail(
            name,
            Problem::OutOfBounds {
                start: offset,
                end,
                data_len,
            },
        );
    }
    Ok(TensorInfo {
        name,
        shape,
        ggml_type,
        offset: data_start + offset,
        size,
    })
}

/// The first pair of tensors whose bytes overlap, if any, in file offset order.
fn first_overlap(tensors: &[TensorInfo]) -> Option<(&TensorInfo, &TensorInfo)> {
    let mut spans: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    spans.sort_by_key(|t| (t.offset, t.size));
    spans.windows(2).find_map(|pair| {
        // Both extents were checked to end inside the file, so the sum cannot overflow.
        (pair[1].offset < pair[0].offset + pair[0].size).then(|| (pair[0], pair[1]))
    })
}
