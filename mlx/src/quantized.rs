//! Quantized weights: quantize, dequantize and the matmuls that read them directly.

use mlx_sys::ffi;

use crate::list::from_owned_list;
use crate::{Array, Dtype, Error, Result};

/// How a matrix is quantized along its last axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// `w ≈ scale · q + bias` per group, 2–8 bits, any group size MLX supports.
    Affine,
    /// OCP microscaling FP4 (E2M1 values, shared E8M0 scale per 32).
    Mxfp4,
    /// OCP microscaling FP8 (E4M3 values, shared E8M0 scale per 32).
    Mxfp8,
    /// NVIDIA FP4 (E2M1 values, E4M3 scale per 16).
    Nvfp4,
}

impl QuantMode {
    fn raw(self) -> ffi::QuantMode {
        match self {
            QuantMode::Affine => ffi::QuantMode::Affine,
            QuantMode::Mxfp4 => ffi::QuantMode::Mxfp4,
            QuantMode::Mxfp8 => ffi::QuantMode::Mxfp8,
            QuantMode::Nvfp4 => ffi::QuantMode::Nvfp4,
        }
    }

    /// Whether the mode stores a bias per group (only affine does).
    pub fn has_biases(self) -> bool {
        self == QuantMode::Affine
    }
}

/// The layout parameters shared by every op on one quantized matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    /// Elements per group sharing a scale.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
    /// The quantization mode.
    pub mode: QuantMode,
}

impl QuantSpec {
    /// Affine quantization with `bits` per element and `group_size` per scale.
    pub fn affine(group_size: i32, bits: i32) -> QuantSpec {
        QuantSpec {
            group_size,
            bits,
            mode: QuantMode::Affine,
        }
    }

    /// Whether [`Quantized::matmul`] has a fast path for single decode rows on the CPU with
    /// this layout: affine, 4 or 8 bits, groups a multiple of 16, f32 scales and activations.
    /// MLX's own CPU kernel is a scalar loop, so without it dequantized weights are faster.
    pub fn has_packed_cpu_matvec(self) -> bool {
        self.mode == QuantMode::Affine && ffi::packed_matvec_available(self.group_size, self.bits)
    }
}

/// What the packed CPU kernel multiplies a matrix's weights by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activations {
    /// The activations as they are: the same products a dense f32 matrix gives, summed in
    /// another order.
    F32,
    /// The activations quantized to 8 bits per block of 32 (one f32 scale each) and multiplied
    /// with integer dot products, as llama.cpp does. Layouts the integer kernel does not take
    /// (4-bit groups not a multiple of 32, rows not a multiple of 32) stay in f32.
    ///
    /// Experimental: not exact, and on real models not close enough to be a default. Each
    /// activation moves by up to half its block's step, and a block holding one of a layer's
    /// outlier channels rounds its other 31 values coarsely. Measured with
    /// `nn/examples/fast_path_error.rs` (32 teacher-forced greedy steps against f32): SmolLM2
    /// 135M logits move by up to 1.7 and its argmax changes at 2 steps; Gemma 3 270M, whose
    /// activations are far more uneven, moves by up to 13 and changes at 7. One decode row
    /// runs 1.2× (4-bit MLP) to 2× (8-bit head) faster; batches of 8 gain nothing on AVX2.
    ///
    /// GGUF k-quants in the k-block form ([`crate::k_blocks::KBlocks::matmul_with`]) round per
    /// 256 columns, as llama.cpp's CPU product of the same file does; with them Gemma 3 270M's
    /// greedy text leaves transformers' at its second token (`nn`'s `real_models`
    /// left-quantized test, which passes in f32).
    Int8,
}

impl Activations {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Activations::F32 => 0,
            Activations::Int8 => 1,
        }
    }
}

/// The precision [`Quantized::matmul`] uses in the packed CPU kernel: `MLXKIT_ACTIVATIONS`
/// (`f32`, `int8`) at start, f32 when unset, or the last [`set_packed_activations`].
pub fn packed_activations() -> Activations {
    match ffi::packed_matvec_activations() {
        1 => Activations::Int8,
        _ => Activations::F32,
    }
}

/// Sets the precision of packed products built from now on; products already in a graph keep
/// theirs.
pub fn set_packed_activations(activations: Activations) {
    ffi::set_packed_matvec_activations(activations.raw());
}

/// The most rows of `x` for which [`Quantized::matmul`]'s packed CPU kernel (see
/// [`QuantSpec::has_packed_cpu_matvec`]) beats a dense f32 copy of the matrix through BLAS: a
/// layer holding both forms picks by this. The kernel itself takes any number of rows, and
/// far faster than MLX's own quantized matmul on a CPU (17 rows of a 1536×576 4-bit matrix:
/// 0.6 ms against 17).
pub fn packed_cpu_matvec_max_rows() -> usize {
    ffi::packed_matvec_rows() as usize
}

/// A quantized matrix: packed elements, scales and (affine only) biases.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Packed values (u32 words).
    pub weights: Array,
    /// One scale per group.
    pub scales: Array,
    /// One bias per group, for affine quantization.
    pub biases: Option<Array>,
    /// How the values were packed.
    pub spec: QuantSpec,
}

/// Quantizes `w` along its last axis.
pub fn quantize(w: &Array, spec: QuantSpec) -> Result<Quantized> {
    let mut parts = from_owned_list(ffi::quantize(
        w.raw(),
        spec.group_size,
        spec.bits,
        spec.mode.raw(),
    )?)?
    .into_iter();
    let weights = parts
        .next()
        .ok_or_else(|| Error::Mlx("quantize returned no weights".into()))?;
    let scales = parts
        .next()
        .ok_or_else(|| Error::Mlx("quantize returned no scales".into()))?;
    let biases = parts.next();
    Ok(Quantized {
        weights,
        scales,
        biases,
        spec,
    })
}

impl Quantized {
    fn biases_raw<'a>(&'a self, fallback: &'a Array) -> (bool, &'a Array) {
        match &self.biases {
            Some(b) => (true, b),
            None => (false, fallback),
        }
    }

    /// The matrix in floating point; `dtype` defaults to the scales' dtype.
    pub fn dequantize(&self, dtype: Option<Dtype>) -> Result<Array> {
        let (has_biases, biases) = self.biases_raw(&self.scales);
        Array::from_raw(ffi::dequantize(
            self.weights.raw(),
            self.scales.raw(),
            has_biases,
            biases.raw(),
            self.spec.group_size,
            self.spec.bits,
            self.spec.mode.raw(),
            dtype.is_some(),
            dtype.unwrap_or(Dtype::F32).code(),
        )?)
    }

    /// `x @ wᵀ` (when `transpose`) or `x @ w` without dequantizing `w`. On the CPU, `x @ wᵀ`
    /// with a layout [`QuantSpec::has_packed_cpu_matvec`] accepts goes through
    /// mlxkit's own vectorised kernel instead of MLX's, in the precision
    /// [`packed_activations`] names.
    pub fn matmul(&self, x: &Array, transpose: bool) -> Result<Array> {
        self.matmul_raw(x, transpose, -1)
    }

    /// [`Quantized::matmul`] with the packed kernel's precision chosen here rather than by
    /// [`packed_activations`].
    pub fn matmul_with(
        &self,
        x: &Array,
        transpose: bool,
        activations: Activations,
    ) -> Result<Array> {
        self.matmul_raw(x, transpose, activations.raw())
    }

    fn matmul_raw(&self, x: &Array, transpose: bool, activations: i32) -> Result<Array> {
        let (has_biases, biases) = self.biases_raw(&self.scales);
        Array::from_raw(ffi::quantized_matmul(
            x.raw(),
            self.weights.raw(),
            self.scales.raw(),
            has_biases,
            biases.raw(),
            transpose,
            self.spec.group_size,
            self.spec.bits,
            self.spec.mode.raw(),
            activations,
        )?)
    }

    /// Per-row expert matmul over stacked quantized experts `w: [E, out, in]`: row `i` of `x`
    /// (batch-indexed by `lhs_indices`) multiplies expert `rhs_indices[i]`. `sorted` promises
    /// `rhs_indices` is sorted, which lets MLX batch rows of one expert.
    pub fn gather_matmul(
        &self,
        x: &Array,
        lhs_indices: Option<&Array>,
        rhs_indices: Option<&Array>,
        transpose: bool,
        sorted: bool,
    ) -> Result<Array> {
        let (has_biases, biases) = self.biases_raw(&self.scales);
        Array::from_raw(ffi::gather_qmm(
            x.raw(),
            self.weights.raw(),
            self.scales.raw(),
            has_biases,
            biases.raw(),
            lhs_indices.is_some(),
            lhs_indices.unwrap_or(x).raw(),
            rhs_indices.is_some(),
            rhs_indices.unwrap_or(x).raw(),
            transpose,
            self.spec.group_size,
            self.spec.bits,
            self.spec.mode.raw(),
            sorted,
        )?)
    }
}

/// Matmul with matrix-level gather on dense operands: batch `i` of the result is
/// `a[lhs_indices[i]] @ b[rhs_indices[i]]`.
pub fn gather_mm(
    a: &Array,
    b: &Array,
    lhs_indices: Option<&Array>,
    rhs_indices: Option<&Array>,
    sorted: bool,
) -> Result<Array> {
    Array::from_raw(ffi::gather_mm(
        a.raw(),
        b.raw(),
        lhs_indices.is_some(),
        lhs_indices.unwrap_or(a).raw(),
        rhs_indices.is_some(),
        rhs_indices.unwrap_or(a).raw(),
        sorted,
    )?)
}
