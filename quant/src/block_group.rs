//! The affine map every GGUF block format decodes a group of integers with, and the f16
//! reads the decoders share (`block_formats.rs` for the legacy formats, `kquants.rs` for the
//! k-quants).

use half::f16;

/// The affine map of one group: `w = scale · (q − zero) + min`.
///
/// Symmetric formats use `zero` (a power of two) and `min = 0`; formats with a stored minimum
/// use `min` and `zero = 0`. Keeping both lets [`Group::value`] repeat GGML's arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Group {
    pub scale: f32,
    pub zero: f32,
    pub min: f32,
}

impl Group {
    pub(crate) fn symmetric(scale: f32, zero: f32) -> Group {
        Group {
            scale,
            zero,
            min: 0.0,
        }
    }

    pub(crate) fn with_min(scale: f32, min: f32) -> Group {
        Group {
            scale,
            zero: 0.0,
            min,
        }
    }

    /// The real value of `q`, computed as GGML computes it.
    pub(crate) fn value(&self, q: u8) -> f32 {
        if self.zero != 0.0 {
            (f32::from(q) - self.zero) * self.scale
        } else {
            self.scale * f32::from(q) + self.min
        }
    }

    /// The bias of MLX's `w = scale · q + bias`; exact, since `zero` is a power of two or
    /// `min` is the only term.
    pub(crate) fn mlx_bias(&self) -> f32 {
        self.min - self.zero * self.scale
    }
}

/// The little-endian f16 at byte `at` of `bytes`, widened to f32.
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}
