//! Rotary position embedding with the scalings checkpoints ask for.

use std::f64::consts::PI;

use mlx::fast::{RopeFrequencies, RopeOffset};
use mlx::{Array, Dtype, SliceSpec};

use crate::{Error, Result};

/// How positions or frequencies are rescaled for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain `base^(-2i/d)` frequencies.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The position divisor.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// How much low frequencies are stretched.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
    },
    /// YaRN: interpolate low frequencies, keep high ones, ramp between, and rescale attention.
    Yarn {
        /// The context extension factor.
        factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
        /// Rotations above which frequencies are kept.
        beta_fast: f64,
        /// Rotations below which frequencies are interpolated.
        beta_slow: f64,
        /// Attention temperature multiplier.
        mscale: f64,
        /// Attention temperature divisor applied to all dimensions.
        mscale_all_dim: f64,
        /// Whether the ramp's ends are rounded to whole dimensions (transformers' default;
        /// gpt-oss turns it off).
        truncate: bool,
    },
    /// Explicit per-frequency divisors (one per rotated pair): GGUF files carry Llama 3's
    /// scaling and Gemma 4's proportional rope as a `rope_freqs` tensor of them (llama.cpp
    /// stops a frequency with a divisor of 1e30).
    Factors(Vec<f64>),
    /// Gemma 4's "proportional" rope: only the first `rotated_fraction` of the frequencies
    /// turn, each at the rate a full-width rotation gives it (`base^(-2i/dims)`, divided by
    /// `factor`); the features of the others stay where they are.
    Proportional {
        /// The share of frequency pairs that turn (`partial_rotary_factor`).
        rotated_fraction: f64,
        /// Frequencies are divided by it.
        factor: f64,
    },
}

/// Everything that defines one rotary embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Frequency base θ.
    pub base: f64,
    /// Rotated features (≤ head_dim; fewer for partial rotary embeddings).
    pub dims: i32,
    /// Rotate adjacent pairs instead of halves (GGUF llama weights before un-permuting).
    pub traditional: bool,
    /// Long-context scaling.
    pub scaling: RopeScaling,
}

/// A rotary embedding ready to apply.
#[derive(Debug, Clone)]
pub struct Rope {
    dims: i32,
    traditional: bool,
    base: f32,
    position_scale: f32,
    /// Explicit periods (MLX's `freqs`: angle = position / period) when scaled.
    periods: Option<Array>,
    /// Multiplier of the rotated features (YaRN's attention temperature).
    feature_scale: f32,
}

impl Rope {
    /// Precomputes frequencies for `config`.
    pub fn new(config: &RopeConfig) -> Result<Rope> {
        if config.dims <= 0 || config.dims % 2 != 0 {
            return Err(Error::Config(format!(
                "rotary dims must be a positive even number, got {}",
                config.dims
            )));
        }
        if !(config.base.is_finite() && config.base > 1.0) {
            return Err(Error::Config(format!(
                "rope base must be > 1, got {}",
                config.base
            )));
        }
        let mut rope = Rope {
            dims: config.dims,
            traditional: config.traditional,
            base: config.base as f32,
            position_scale: 1.0,
            periods: None,
            feature_scale: 1.0,
        };
        let half = (config.dims / 2) as usize;
        let dims = f64::from(config.dims);
        let base_periods: Vec<f64> = (0..half)
            .map(|i| config.base.powf(2.0 * i as f64 / dims))
            .collect();
        match config.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => {
                positive("linear rope factor", factor)?;
                rope.position_scale = (1.0 / factor) as f32;
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original,
            } => {
                positive("llama3 rope factor", factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::Config(
                        "llama3 rope needs high_freq_factor > low_freq_factor".into(),
                    ));
                }
                let low_wavelen = original / low_freq_factor;
                let high_wavelen = original / high_freq_factor;
                let periods = base_periods
                    .iter()
                    .map(|&p| {
                        let wavelen = 2.0 * PI * p;
                        if wavelen > low_wavelen {
                            p * factor
                        } else if wavelen > high_wavelen {
                            let smooth = (original / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            p / ((1.0 - smooth) / factor + smooth)
                        } else {
                            p
                        }
                    })
                    .collect::<Vec<_>>();
                rope.periods = Some(periods_array(&periods)?);
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                positive("yarn rope factor", factor)?;
                let correction_dim = |rotations: f64| {
                    dims * (original / (rotations * 2.0 * PI)).ln() / (2.0 * config.base.ln())
                };
                let (low, high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                let (low, high) = if truncate {
                    (low.floor(), high.ceil())
                } else {
                    (low, high)
                };
                let low = low.max(0.0);
                let mut high = high.min(dims - 1.0);
                if high == low {
                    high += 0.001;
                }
                let periods = base_periods
                    .iter()
                    .enumerate()
                    .map(|(i, &extra)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        let inter = factor * extra;
                        inter * extra / (inter * keep + extra * (1.0 - keep))
                    })
                    .collect::<Vec<_>>();
                rope.periods = Some(periods_array(&periods)?);
                let attention_scale = |m: f64| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                rope.feature_scale =
                    (attention_scale(mscale) / attention_scale(mscale_all_dim)) as f32;
            }
            RopeScaling::Factors(ref factors) => {
                if factors.len() != half {
                    return Err(Error::Config(format!(
                        "{} rope frequency factors for {half} rotated pairs",
                        factors.len()
                    )));
                }
                if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                    return Err(Error::Config(format!(
                        "rope frequency factors must be positive, got {bad}"
                    )));
                }
                let periods = base_periods
                    .iter()
                    .zip(factors)
                    .map(|(p, f)| p * f)
                    .collect::<Vec<_>>();
                rope.periods = Some(periods_array(&periods)?);
            }
            RopeScaling::Proportional {
                rotated_fraction,
                factor,
            } => {
                positive("proportional rope factor", factor)?;
                if !(0.0..=1.0).contains(&rotated_fraction) {
                    return Err(Error::Config(format!(
                        "partial_rotary_factor must be between 0 and 1, got {rotated_fraction}"
                    )));
                }
                // As the reference rounds: whole pairs, down.
                let turning = (rotated_fraction * dims / 2.0).floor() as usize;
                // An infinite period is an angle of zero at every position: no rotation.
                let periods = base_periods
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        if i < turning {
                            p * factor
                        } else {
                            f64::INFINITY
                        }
                    })
                    .collect::<Vec<_>>();
                rope.periods = Some(periods_array(&periods)?);
            }
        }
        Ok(rope)
    }

    /// Rotates `x: [batch, heads, seq, head_dim]` for positions starting at `offset`.
    pub fn forward(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Array> {
        let x = if self.feature_scale != 1.0 {
            let shape = x.shape();
            let mut stop = shape.clone();
            if let Some(last) = stop.last_mut() {
                *last = self.dims;
            }
            let rotated = x
                .slice(&SliceSpec::new(&vec![0; shape.len()], &stop))?
                .multiply(self.feature_scale)?;
            x.slice_update(&rotated, &SliceSpec::new(&vec![0; shape.len()], &stop))?
        } else {
            x.clone()
        };
        let frequencies = match &self.periods {
            Some(periods) => RopeFrequencies::Custom(periods),
            None => RopeFrequencies::Base(self.base),
        };
        Ok(mlx::fast::rope(
            &x,
            self.dims,
            self.traditional,
            frequencies,
            self.position_scale,
            offset,
        )?)
    }
}

fn positive(what: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{what} must be positive, got {value}"
        )))
    }
}

fn periods_array(periods: &[f64]) -> Result<Array> {
    let values: Vec<f32> = periods.iter().map(|&p| p as f32).collect();
    Ok(Array::from_slice(&values, &[values.len() as i32])?.astype(Dtype::F32)?)
}

/// Rotary embedding from explicit positions, each rotary frequency turning at the position of
/// one of several axes: Qwen2-VL's and Qwen2.5-VL's multimodal rope ("M-RoPE"), whose
/// frequencies are split into consecutive sections for time, height and width, and the 2-D
/// rope of their vision towers (height and width). Rotates the two halves of the first
/// `2 · frequencies` features, as [`Rope`] does untraditionally; where every axis gives the
/// same position it equals [`Rope`] at that position with the same base.
///
/// Positions come as an array rather than an offset because an image's tokens do not sit at
/// consecutive positions. Angles are computed in `f32` as `position · inverse frequency`, the
/// way transformers computes them, then their cosines and sines.
#[derive(Debug, Clone)]
pub struct AxialRope {
    /// `base^(-2i/dims)` for each rotated pair, `[frequencies]`, f32.
    inverse_frequencies: Array,
    /// The axis each frequency reads its position from, `[frequencies]`, int32.
    axis_of_frequency: Array,
    axes: usize,
}

impl AxialRope {
    /// M-RoPE: frequencies `base^(-2i/dims)` for `i < dims / 2`; the first `sections[0]` turn
    /// with axis 0's position, the next `sections[1]` with axis 1's, and so on (the sections
    /// sum to `dims / 2`).
    pub fn sectioned(base: f64, dims: i32, sections: &[usize]) -> Result<AxialRope> {
        let half = usize::try_from(dims / 2).unwrap_or(0);
        if dims <= 0 || dims % 2 != 0 || sections.iter().sum::<usize>() != half {
            return Err(Error::Config(format!(
                "rope sections {sections:?} do not split the {half} frequencies of {dims} \
                 rotated features"
            )));
        }
        let inverse = inverse_frequencies(base, dims)?;
        let axis = sections
            .iter()
            .enumerate()
            .flat_map(|(axis, &n)| std::iter::repeat_n(axis as i32, n))
            .collect();
        AxialRope::from_parts(inverse, axis, sections.len())
    }

    /// Each of `axes` axes turning its own `base^(-2i/axis_dims)` for `i < axis_dims / 2`, one
    /// after the other: a vision tower's 2-D rope (`axes` 2, `axis_dims` half the head).
    pub fn per_axis(base: f64, axis_dims: i32, axes: usize) -> Result<AxialRope> {
        if axis_dims <= 0 || axis_dims % 2 != 0 || axes == 0 {
            return Err(Error::Config(format!(
                "{axes} rope axes of {axis_dims} features each"
            )));
        }
        let ladder = inverse_frequencies(base, axis_dims)?;
        let inverse = (0..axes).flat_map(|_| ladder.iter().copied()).collect();
        let axis = (0..axes)
            .flat_map(|a| std::iter::repeat_n(a as i32, ladder.len()))
            .collect();
        AxialRope::from_parts(inverse, axis, axes)
    }

    fn from_parts(inverse: Vec<f32>, axis: Vec<i32>, axes: usize) -> Result<AxialRope> {
        let n = inverse.len() as i32;
        Ok(AxialRope {
            inverse_frequencies: Array::from_slice(&inverse, &[n])?,
            axis_of_frequency: Array::from_slice(&axis, &[n])?,
            axes,
        })
    }

    /// The cosines and sines of `positions` (`[..., axes]`, any integer or float dtype):
    /// `[..., dims]` each, the frequencies' angles repeated for the two halves.
    pub fn cos_sin(&self, positions: &Array) -> Result<(Array, Array)> {
        let shape = positions.shape();
        if shape.last().copied() != i32::try_from(self.axes).ok() {
            return Err(Error::InvalidInput(format!(
                "rope positions of shape {shape:?}, expected {} axes last",
                self.axes
            )));
        }
        let last = shape.len() as i32 - 1;
        let angles = positions
            .astype(Dtype::F32)?
            .take(&self.axis_of_frequency, last)?
            .multiply(&self.inverse_frequencies)?;
        let both = mlx::concatenate(&[angles.clone(), angles], -1)?;
        Ok((both.cos()?, both.sin()?))
    }

    /// Rotates `x` (`[..., dims]`) by `cos` and `sin` of [`AxialRope::cos_sin`], broadcast
    /// against it: `x · cos + rotate_half(x) · sin`.
    pub fn rotate(x: &Array, cos: &Array, sin: &Array) -> Result<Array> {
        let half = x.dim(-1)? / 2;
        let mut halves = x.split_at(&[half], -1)?.into_iter();
        let (Some(x1), Some(x2)) = (halves.next(), halves.next()) else {
            return Err(Error::InvalidInput("rope: features did not split".into()));
        };
        let rotated = mlx::concatenate(&[x2.negative()?, x1], -1)?;
        Ok(x.multiply(cos)?.add(&rotated.multiply(sin)?)?)
    }
}

/// `base^(-2i/dims)` for `i < dims / 2`, in f32 as transformers keeps them.
fn inverse_frequencies(base: f64, dims: i32) -> Result<Vec<f32>> {
    if !(base.is_finite() && base > 1.0) {
        return Err(Error::Config(format!("rope base must be > 1, got {base}")));
    }
    Ok((0..dims / 2)
        .map(|i| (1.0 / base.powf(2.0 * f64::from(i) / f64::from(dims))) as f32)
        .collect())
}
