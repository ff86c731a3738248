//! `Array`: an owned handle to an MLX array, its constructors and typed readers.

use std::fmt;

use mlx_sys::UniquePtr;
use mlx_sys::ffi;

use crate::{Dtype, Element, Error, Result};

/// An n-dimensional MLX array.
///
/// The handle is owned: dropping it releases this reference, and MLX frees the buffer when the
/// last reference (including those held by lazy graphs) goes away. `Clone` is cheap: it copies
/// the reference, not the data. Operations are lazy until [`Array::eval`] or a typed read.
pub struct Array {
    pub(crate) raw: UniquePtr<ffi::Array>,
}

impl Array {
    pub(crate) fn from_raw(raw: UniquePtr<ffi::Array>) -> Result<Array> {
        if raw.is_null() {
            return Err(Error::Mlx("MLX returned no array".into()));
        }
        Ok(Array { raw })
    }

    /// `None` for a null handle: the shim's word for "this kernel does not apply".
    pub(crate) fn from_raw_optional(raw: UniquePtr<ffi::Array>) -> Result<Option<Array>> {
        if raw.is_null() {
            return Ok(None);
        }
        Array::from_raw(raw).map(Some)
    }

    pub(crate) fn raw(&self) -> &ffi::Array {
        // `from_raw` is the only constructor and rejects null handles.
        self.raw
            .as_ref()
            .unwrap_or_else(|| unreachable!("Array holds a null handle"))
    }

    /// Copies `data` into a new array of `shape`. The length must equal the shape's product.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        Self::from_bytes(bytemuck::cast_slice(data), shape, T::DTYPE)
    }

    /// Copies raw little-endian element bytes into a new array of `shape` and `dtype`.
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        let expected = element_count(shape)?;
        let size = dtype.size_of();
        if bytes.len() != expected.saturating_mul(size) {
            return Err(Error::ShapeMismatch {
                shape: shape.to_vec(),
                expected,
                len: bytes.len() / size,
            });
        }
        Array::from_raw(ffi::array_from_bytes(bytes, shape, dtype.code())?)
    }

    /// A new boolean array of `shape`.
    pub fn from_bools(data: &[bool], shape: &[i32]) -> Result<Array> {
        let bytes: Vec<u8> = data.iter().map(|&b| u8::from(b)).collect();
        Self::from_bytes(&bytes, shape, Dtype::Bool)
    }

    /// A 0-dimensional array holding `value` converted to `dtype`.
    pub fn scalar(value: f32, dtype: Dtype) -> Result<Array> {
        Array::from_raw(ffi::array_scalar_f32(value, dtype.code())?)
    }

    /// A 0-dimensional integer array holding `value` converted to `dtype`.
    pub fn scalar_int(value: i32, dtype: Dtype) -> Result<Array> {
        Array::from_raw(ffi::array_scalar_i32(value, dtype.code())?)
    }

    /// An array of zeros.
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        element_count(shape)?;
        Array::from_raw(ffi::zeros(shape, dtype.code())?)
    }

    /// An array of ones.
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        element_count(shape)?;
        Array::from_raw(ffi::ones(shape, dtype.code())?)
    }

    /// An array of `shape` with every element `value`.
    pub fn full(shape: &[i32], value: f32, dtype: Dtype) -> Result<Array> {
        element_count(shape)?;
        let value = Array::scalar(value, dtype)?;
        Array::from_raw(ffi::full(shape, value.raw(), dtype.code())?)
    }

    /// `start, start + step, …` up to but excluding `stop`.
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        Array::from_raw(ffi::arange(start, stop, step, dtype.code())?)
    }

    /// The dimensions.
    pub fn shape(&self) -> Vec<i32> {
        ffi::array_shape(self.raw()).unwrap_or_default()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The size of dimension `axis`; negative axes count from the end.
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let shape = self.shape();
        let index = normalize_axis(axis, shape.len())?;
        Ok(shape[index])
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        ffi::array_dtype(self.raw())
            .ok()
            .and_then(|code| Dtype::from_code(code).ok())
            .unwrap_or_else(|| unreachable!("MLX arrays always have a known dtype"))
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        ffi::array_size(self.raw()).unwrap_or(0)
    }

    /// Bytes the array's elements occupy (its logical size, not the buffer it may view).
    pub fn nbytes(&self) -> usize {
        ffi::array_nbytes(self.raw()).unwrap_or(0)
    }

    /// Evaluates the array (and the graph it depends on).
    pub fn eval(&self) -> Result<()> {
        crate::eval([self])
    }

    /// Evaluates and copies the elements out in row-major order, whatever the array's strides.
    /// `T` must match the dtype exactly.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let found = self.dtype();
        if found != T::DTYPE {
            return Err(Error::DtypeMismatch {
                expected: T::DTYPE,
                found,
            });
        }
        let mut out = vec![T::zeroed(); self.size()];
        ffi::array_read_bytes(self.raw(), bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Evaluates and copies the raw element bytes out in row-major order (native byte order),
    /// whatever the dtype: for writers of file formats (safetensors) that store any dtype,
    /// bf16 and f16 included, as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.nbytes()];
        ffi::array_read_bytes(self.raw(), &mut out)?;
        Ok(out)
    }

    /// Evaluates and copies a boolean array out in row-major order.
    pub fn to_bools(&self) -> Result<Vec<bool>> {
        let found = self.dtype();
        if found != Dtype::Bool {
            return Err(Error::DtypeMismatch {
                expected: Dtype::Bool,
                found,
            });
        }
        let mut out = vec![0u8; self.size()];
        ffi::array_read_bytes(self.raw(), &mut out)?;
        Ok(out.into_iter().map(|b| b != 0).collect())
    }

    /// Evaluates a one-element array and returns its value. `T` must match the dtype exactly.
    pub fn item<T: Element>(&self) -> Result<T> {
        let size = self.size();
        if size != 1 {
            return Err(Error::InvalidArgument(format!(
                "item() needs exactly one element, the array has {size}"
            )));
        }
        let values = self.to_vec::<T>()?;
        values
            .first()
            .copied()
            .ok_or_else(|| Error::Mlx("array read returned no element".into()))
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        match ffi::array_clone(self.raw()) {
            Ok(raw) if !raw.is_null() => Array { raw },
            // Copying a reference-counted handle cannot fail short of running out of memory.
            _ => std::alloc::handle_alloc_error(std::alloc::Layout::new::<usize>()),
        }
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Array({:?}, {:?})", self.shape(), self.dtype())
    }
}

impl fmt::Display for Array {
    /// Evaluates the array and prints its elements as MLX does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ffi::array_to_string(self.raw()) {
            Ok(s) => f.write_str(&s),
            Err(e) => write!(f, "<unprintable array: {}>", e.what()),
        }
    }
}

/// The number of elements of `shape`, checking that every dimension is non-negative and the
/// product fits.
pub(crate) fn element_count(shape: &[i32]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).map_err(|_| {
            Error::InvalidArgument(format!("negative dimension in shape {shape:?}"))
        })?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} is too large")))
    })
}

/// Maps a possibly negative axis onto `0..ndim`.
pub(crate) fn normalize_axis(axis: i32, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    let a = i64::from(axis);
    let index = if a < 0 { a + n } else { a };
    if (0..n).contains(&index) {
        Ok(index as usize)
    } else {
        Err(Error::InvalidArgument(format!(
            "axis {axis} is out of range for an array of {ndim} dimensions"
        )))
    }
}
