//! What `create --quantize` can be asked for, and the layouts each choice writes.

use std::fmt;
use std::str::FromStr;

use mlx::quantized::{QuantMode, QuantSpec};

/// A quantization `create` writes: the base type of a model's projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Affine 4-bit, groups of 64, with a scale and bias per group.
    Int4,
    /// Affine 8-bit, groups of 64.
    Int8,
    /// OCP microscaling FP4: E2M1 values, a power-of-two scale per 32.
    Mxfp4,
    /// OCP microscaling FP8: E4M3 values, a power-of-two scale per 32.
    Mxfp8,
    /// NVIDIA FP4: E2M1 values, an E4M3 scale per 16.
    Nvfp4,
}

/// Group size of the affine targets: mlx-lm's default, and what its published models use.
const AFFINE_GROUP: i32 = 64;
/// A smaller affine group for matrices whose width 64 does not divide.
const AFFINE_FALLBACK_GROUP: i32 = 32;

impl Target {
    /// Every target, in the order `--help` lists them.
    pub const ALL: [Target; 5] = [
        Target::Int4,
        Target::Int8,
        Target::Mxfp4,
        Target::Mxfp8,
        Target::Nvfp4,
    ];

    /// The name Ollama's create takes (`int4`, …).
    pub fn name(self) -> &'static str {
        match self {
            Target::Int4 => "int4",
            Target::Int8 => "int8",
            Target::Mxfp4 => "mxfp4",
            Target::Mxfp8 => "mxfp8",
            Target::Nvfp4 => "nvfp4",
        }
    }

    /// The layout of the target's projections.
    pub fn base(self) -> QuantSpec {
        match self {
            Target::Int4 => QuantSpec::affine(AFFINE_GROUP, 4),
            Target::Int8 => QuantSpec::affine(AFFINE_GROUP, 8),
            Target::Mxfp4 => fp_spec(QuantMode::Mxfp4),
            Target::Mxfp8 => fp_spec(QuantMode::Mxfp8),
            Target::Nvfp4 => fp_spec(QuantMode::Nvfp4),
        }
    }

    /// The 8-bit type of the target's family: where the policy promotes a sensitive tensor
    /// (the output head; `k_proj`, `v_proj` and `down_proj` under int4), affine targets get
    /// int8 and the floating-point ones mxfp8.
    pub fn eight_bit(self) -> QuantSpec {
        match self {
            Target::Int4 | Target::Int8 => QuantSpec::affine(AFFINE_GROUP, 8),
            Target::Mxfp4 | Target::Mxfp8 | Target::Nvfp4 => fp_spec(QuantMode::Mxfp8),
        }
    }

    /// `spec`, or the nearest layout of the same kind whose groups divide a row of `width`
    /// elements; `None` when none does (the floating-point modes have one group size each).
    pub fn aligned(spec: QuantSpec, width: i64) -> Option<QuantSpec> {
        let fits = |s: QuantSpec| width > 0 && width % i64::from(s.group_size) == 0;
        if fits(spec) {
            return Some(spec);
        }
        let smaller = QuantSpec {
            group_size: AFFINE_FALLBACK_GROUP,
            ..spec
        };
        (spec.mode == QuantMode::Affine && fits(smaller)).then_some(smaller)
    }
}

/// The one layout MLX gives each floating-point mode.
fn fp_spec(mode: QuantMode) -> QuantSpec {
    let (group_size, bits) = match mode {
        QuantMode::Mxfp4 => (32, 4),
        QuantMode::Mxfp8 => (32, 8),
        QuantMode::Nvfp4 => (16, 4),
        QuantMode::Affine => (AFFINE_GROUP, 4),
    };
    QuantSpec {
        group_size,
        bits,
        mode,
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `--quantize` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quantization `{0}` (choose int4, int8, mxfp4, mxfp8 or nvfp4)")]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;

    /// Ollama's names, case-insensitively; `q4`/`q8` and `fp8` are accepted as the nearest
    /// MLX layouts (Ollama's GGUF names for 4- and 8-bit, and FP8).
    fn from_str(text: &str) -> Result<Target, UnknownTarget> {
        Ok(match text.to_ascii_lowercase().as_str() {
            "int4" | "q4" | "affine4" => Target::Int4,
            "int8" | "q8" | "affine8" => Target::Int8,
            "mxfp4" => Target::Mxfp4,
            "mxfp8" | "fp8" => Target::Mxfp8,
            "nvfp4" => Target::Nvfp4,
            _ => return Err(UnknownTarget(text.to_string())),
        })
    }
}

/// mlx-lm's name of a mode (`affine`, `mxfp4`, …).
pub fn mode_name(mode: QuantMode) -> &'static str {
    match mode {
        QuantMode::Affine => "affine",
        QuantMode::Mxfp4 => "mxfp4",
        QuantMode::Mxfp8 => "mxfp8",
        QuantMode::Nvfp4 => "nvfp4",
    }
}

/// A short label for a layout: `int4/64`, `mxfp8/32`.
pub fn spec_label(spec: QuantSpec) -> String {
    match spec.mode {
        QuantMode::Affine => format!("int{}/{}", spec.bits, spec.group_size),
        mode => format!("{}/{}", mode_name(mode), spec.group_size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for target in Target::ALL {
            assert_eq!(target.name().parse::<Target>(), Ok(target));
        }
        assert_eq!("INT4".parse::<Target>(), Ok(Target::Int4));
        let err = "q4_K_M".parse::<Target>().unwrap_err();
        assert!(err.to_string().contains("q4_K_M"), "{err}");
    }

    #[test]
    fn groups_fall_back_only_for_affine() {
        let int4 = Target::Int4.base();
        assert_eq!(Target::aligned(int4, 608), Some(QuantSpec::affine(32, 4)));
        assert_eq!(Target::aligned(int4, 1536), Some(int4));
        assert_eq!(Target::aligned(int4, 100), None);
        assert_eq!(Target::aligned(Target::Mxfp4.base(), 48), None);
        assert_eq!(
            Target::aligned(Target::Nvfp4.base(), 48),
            Some(Target::Nvfp4.base())
        );
    }
}
