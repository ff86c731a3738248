//! GGUF k-quant matrices in a CPU layout of their own (`shim/kblocks.cc`).
//!
//! In MLX's affine layout a Q4_K matrix carries an f32 scale and bias per 32 weights (6 bits
//! per weight against Q4_K's 4.5) and a Q6_K one, widened to bytes, a scale and bias per 16
//! (12 bits against 6.56). A [`KBlocks`] keeps the k-quant's own small scales (an f16 per 256
//! weights and a 6- or 8-bit integer per group) in bands of 8 weight rows, each band's bytes
//! in one run: 4.63 bits per Q4_K weight and 8.56 per Q6_K one, read in one stream.
//!
//! It is made from the affine form when, and only when, that form's scales and biases factor
//! exactly as a k-quant's ([`KBlocks::from_affine`]), so every weight keeps its value; a
//! product differs from the affine one only in the order of its f32 sums, unless its
//! activations are asked to be rounded to bytes ([`KBlocks::matmul_with`]). It exists on a CPU
//! with mlxkit's packed kernels ([`crate::quantized::QuantSpec::has_packed_cpu_matvec`]) and
//! nowhere else: no MLX op reads it.

use mlx_sys::ffi;

use crate::quantized::{Activations, Quantized, packed_activations};
use crate::{Array, Result};

/// Which k-quant a [`KBlocks`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KQuant {
    /// 4-bit values, a 6-bit scale and min per 32, an f16 scale and min per 256.
    Q4K,
    /// 6-bit values (held as bytes), an 8-bit signed scale per 16, an f16 scale per 256.
    Q6K,
}

impl KQuant {
    /// GGML's id for the type.
    fn ggml_type(self) -> i32 {
        match self {
            KQuant::Q4K => 12,
            KQuant::Q6K => 14,
        }
    }

    /// The affine layout this k-quant loads as: (group size, bits).
    fn affine_layout(self) -> (i32, i32) {
        match self {
            KQuant::Q4K => (32, 4),
            KQuant::Q6K => (16, 8),
        }
    }
}

/// A `[out, in]` k-quant matrix in bands of 8 rows (see the module docs).
#[derive(Debug, Clone)]
pub struct KBlocks {
    data: Array,
    kind: KQuant,
    out: i64,
    in_: i64,
}

impl KBlocks {
    /// `q` in the k-block form, when its layout and values are a k-quant's and the form runs
    /// here; `None` otherwise (keep `q`). Evaluates `q`.
    pub fn from_affine(q: &Quantized) -> Result<Option<KBlocks>> {
        let Some(biases) = &q.biases else {
            return Ok(None);
        };
        if !q.spec.has_packed_cpu_matvec() || q.weights.ndim() != 2 {
            return Ok(None);
        }
        let kind = match (q.spec.group_size, q.spec.bits) {
            (32, 4) => KQuant::Q4K,
            (16, 8) => KQuant::Q6K,
            _ => return Ok(None),
        };
        let out = i64::from(q.weights.dim(0)?);
        let in_ = i64::from(q.weights.dim(1)?) * 32 / i64::from(q.spec.bits);
        if !ffi::k_blocks_available(kind.ggml_type(), out, in_) {
            return Ok(None);
        }
        let (group, bits) = kind.affine_layout();
        let data = Array::from_raw_optional(ffi::k_blocks_from_affine(
            q.weights.raw(),
            q.scales.raw(),
            biases.raw(),
            group,
            bits,
        )?)?;
        Ok(data.map(|data| KBlocks {
            data,
            kind,
            out,
            in_,
        }))
    }

    /// Which k-quant it holds.
    pub fn kind(&self) -> KQuant {
        self.kind
    }

    /// The shape of the matrix it stands for, `[out, in]`.
    pub fn shape(&self) -> [i64; 2] {
        [self.out, self.in_]
    }

    /// The bytes it holds (one array).
    pub fn array(&self) -> &Array {
        &self.data
    }

    /// `x wᵀ`: `x` f32 `[..., in]` to f32 `[..., out]`, any number of rows, in the precision
    /// [`packed_activations`] names when the product is built.
    pub fn matmul(&self, x: &Array) -> Result<Array> {
        self.matmul_with(x, packed_activations())
    }

    /// [`KBlocks::matmul`] in a chosen precision. [`Activations::Int8`] rounds each row of `x`
    /// to signed bytes per 256 columns (`step` = the block's largest `|x|` over 127) and sums
    /// byte products exactly, as llama.cpp's CPU product of a k-quant does: faster, and within
    /// `Σ |w| · step / 2` of the f32 product per super-block, plus f32 rounding.
    pub fn matmul_with(&self, x: &Array, activations: Activations) -> Result<Array> {
        Array::from_raw(ffi::k_blocks_matmul(
            x.raw(),
            self.data.raw(),
            self.kind.ggml_type(),
            self.out,
            self.in_,
            activations.raw(),
        )?)
    }

    /// Rows `ids` (integers, any shape) dequantized to f32: `[ids..., in]`. An id outside the
    /// matrix reads as a row of zeros.
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        Array::from_raw(ffi::k_blocks_rows(
            self.data.raw(),
            ids.raw(),
            self.kind.ggml_type(),
            self.out,
            self.in_,
        )?)
    }

    /// This matrix's rows followed by `other`'s, as one matrix; `None` when the two hold
    /// different k-quants or widths. Bands hold whole rows, so no block is split.
    pub fn concat_rows(&self, other: &KBlocks) -> Result<Option<KBlocks>> {
        if self.kind != other.kind || self.in_ != other.in_ {
            return Ok(None);
        }
        Ok(Some(KBlocks {
            data: crate::concatenate(&[self.data.clone(), other.data.clone()], 0)?,
            kind: self.kind,
            out: self.out + other.out,
            in_: self.in_,
        }))
    }

    /// The whole matrix in f32.
    pub fn dequantize(&self) -> Result<Array> {
        self.rows(&Array::arange(
            0.0,
            self.out as f64,
            1.0,
            crate::Dtype::I32,
        )?)
    }
}
