//! `Mamba2Mixer`: the Mamba-2 token mixer of Nemotron-H and Granite 4 hybrids (Dao and Gu,
//! "Transformers are SSMs", 2024), over each batch row's recurrent cache.
//!
//! The input is projected to a gate, the convolution's channels and per-head step sizes; a
//! short causal convolution (with bias) and SiLU feed the heads' inputs `x` and the groups'
//! `b` and `c`; the state space scan ([`crate::ssd`]) runs with `dt = clamp(softplus(dt +
//! dt_bias))`; its output is gated by `silu(gate)` and *then* normed per group (the reference's
//! `norm_before_gate = False`) before the output projection. Weights are named as transformers
//! saves them: `in_proj`, `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`.

use kvcache::{LayerCache, RecurrentConfig};
use mlx::{Array, Dtype};

use crate::config::dim;
use crate::gated_delta::softplus;
use crate::linear::Linear;
use crate::recurrent_rows::{conv_tails, recurrent_states, split_at_captures, store};
use crate::short_conv::ShortConv;
use crate::ssd::{SsdInputs, ssd};
use crate::weights::Weights;
use crate::{Error, Result};

/// The sizes and settings of a mixer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2Config {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Heads of the scan.
    pub heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Groups of `b` and `c`, each shared by `heads / groups` heads.
    pub groups: usize,
    /// Width of the state per head and feature.
    pub state_size: usize,
    /// Taps of the convolution.
    pub conv_kernel: usize,
    /// Whether the convolution has a bias.
    pub conv_bias: bool,
    /// Whether the input and output projections have biases.
    pub projection_bias: bool,
    /// Epsilon of the gated group norm.
    pub norm_eps: f32,
    /// The step sizes are clamped to this range.
    pub dt_limit: (f32, f32),
}

impl Mamba2Config {
    /// Width of the heads' inputs.
    pub fn inner(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels of the convolution: the heads' inputs, then `b` and `c`.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.groups * self.state_size
    }

    /// The shapes of the state a mixer keeps per sequence.
    pub fn recurrent(&self) -> RecurrentConfig {
        RecurrentConfig {
            conv_tail: self.conv_kernel - 1,
            conv_dim: self.conv_dim(),
            heads: self.heads,
            value_dim: self.head_dim,
            key_dim: self.state_size,
        }
    }

    /// Checks the sizes fit together.
    pub fn check(&self) -> Result<()> {
        if self.groups == 0 || !self.heads.is_multiple_of(self.groups) {
            return Err(Error::Config(format!(
                "{} Mamba heads cannot share {} groups",
                self.heads, self.groups
            )));
        }
        if self.conv_kernel < 2 {
            return Err(Error::Config(format!(
                "a Mamba convolution of {} taps leaves no convolution",
                self.conv_kernel
            )));
        }
        Ok(())
    }
}

/// A Mamba-2 mixer.
#[derive(Debug, Clone)]
pub struct Mamba2Mixer {
    in_proj: Linear,
    conv1d: ShortConv,
    /// Added to the step sizes before the softplus; f32, converted once at load.
    dt_bias: Array,
    /// `−exp(A_log)`, f32.
    a: Array,
    /// The skip weights `D`.
    d: Array,
    /// The gated norm's weight, applied per group.
    norm: Array,
    out_proj: Linear,
    heads: i32,
    head_dim: i32,
    groups: i32,
    state: i32,
    eps: f32,
    dt_limit: (f32, f32),
}

impl Mamba2Mixer {
    /// Builds the mixer from the weights under `p`.
    pub fn new(c: &Mamba2Config, weights: &mut Weights, p: &str) -> Result<Mamba2Mixer> {
        c.check()?;
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let heads = dim(c.heads, "Mamba heads")?;
        let inner = dim(c.inner(), "Mamba inner width")?;
        let conv_dim = dim(c.conv_dim(), "Mamba convolution channels")?;
        let kernel = dim(c.conv_kernel, "Mamba convolution taps")?;
        let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
            weights.projection(&format!("{p}.{name}"), out, inp, c.projection_bias)
        };
        let conv_bias = if c.conv_bias {
            Some(weights.dense(&format!("{p}.conv1d.bias"), &[conv_dim])?)
        } else {
            None
        };
        let conv_weight = weights.dense(&format!("{p}.conv1d.weight"), &[conv_dim, 1, kernel])?;
        Ok(Mamba2Mixer {
            in_proj: projection(weights, "in_proj", inner + conv_dim + heads, hidden)?,
            conv1d: ShortConv::from_torch(&conv_weight, conv_dim)?.with_bias(conv_bias),
            dt_bias: weights
                .dense(&format!("{p}.dt_bias"), &[heads])?
                .astype(Dtype::F32)?,
            a: weights
                .dense(&format!("{p}.A_log"), &[heads])?
                .astype(Dtype::F32)?
                .exp()?
                .negative()?,
            d: weights.dense(&format!("{p}.D"), &[heads])?,
            norm: weights.dense(&format!("{p}.norm.weight"), &[inner])?,
            out_proj: projection(weights, "out_proj", hidden, inner)?,
            heads,
            head_dim: dim(c.head_dim, "Mamba head width")?,
            groups: dim(c.groups, "Mamba groups")?,
            state: dim(c.state_size, "Mamba state width")?,
            eps: c.norm_eps,
            dt_limit: c.dt_limit,
        })
    }

    /// Appends every array to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.in_proj.collect_arrays(out);
        self.conv1d.collect_arrays(out);
        out.extend([
            self.dt_bias.clone(),
            self.a.clone(),
            self.d.clone(),
            self.norm.clone(),
        ]);
        self.out_proj.collect_arrays(out);
    }

    /// Mixes `x: [rows, tokens, hidden]`, row `r` continuing from the state in
    /// `caches[r][layer]`.
    pub fn forward(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
    ) -> Result<Array> {
        split_at_captures(x, caches, layer, |piece, caches| {
            self.forward_piece(piece, caches, layer)
        })
    }

    fn forward_piece(
        &self,
        x: &Array,
        caches: &mut [&mut [Option<LayerCache>]],
        layer: usize,
    ) -> Result<Array> {
        let shape = x.shape();
        let (rows, tokens) = (shape[0], shape[1]);
        let inner = self.heads * self.head_dim;
        let group_width = self.groups * self.state;
        let projected = self.in_proj.forward(x)?;
        let mut parts = projected
            .split_at(&[inner, inner + inner + 2 * group_width], -1)?
            .into_iter();
        let (Some(gate), Some(channels), Some(dt)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::InvalidInput(
                "Mamba mixer: the projection did not split".into(),
            ));
        };
        let tail = conv_tails(caches, layer, x.dtype())?;
        let state = recurrent_states(caches, layer)?;
        let (convolved, tail) = self.conv1d.forward(&channels, &tail)?;
        let convolved = convolved.silu()?;
        let mut streams = convolved
            .split_at(&[inner, inner + group_width], -1)?
            .into_iter();
        let (Some(heads_in), Some(b), Some(c)) = (streams.next(), streams.next(), streams.next())
        else {
            return Err(Error::InvalidInput(
                "Mamba mixer: the convolution output did not split".into(),
            ));
        };
        let (low, high) = self.dt_limit;
        let mut dt = softplus(&dt.astype(Dtype::F32)?.add(&self.dt_bias)?)?;
        if low > 0.0 {
            dt = dt.maximum(low)?;
        }
        if high.is_finite() {
            dt = dt.minimum(high)?;
        }
        let (y, state) = ssd(
            &SsdInputs {
                x: &heads_in.reshape(&[rows, tokens, self.heads, self.head_dim])?,
                dt: &dt,
                b: &b.reshape(&[rows, tokens, self.groups, self.state])?,
                c: &c.reshape(&[rows, tokens, self.groups, self.state])?,
            },
            &self.a,
            &self.d,
            &state,
        )?;
        store(caches, layer, &tail, Some(&state), tokens as usize)?;

        // Gate first, then norm each group: `norm(y · silu(gate))`.
        let gated = y.reshape(&[rows, tokens, inner])?.multiply(&gate.silu()?)?;
        let normed = mlx::fast::rms_norm(
            &gated.reshape(&[rows, tokens, self.groups, inner / self.groups])?,
            None,
            self.eps,
        )?
        .reshape(&[rows, tokens, inner])?
        .multiply(&self.norm)?;
        self.out_proj.forward(&normed)
    }
}
