//! Gated activations `act(gate) · up`: mlxkit's vectorized CPU kernel, or MLX's ops compiled
//! once per thread into one fused kernel.

use std::cell::OnceCell;

use mlx::fast::Gate;
use mlx::{Array, Compiled};

use crate::{Error, Result};

/// The nonlinearity of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `x · sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU as Gemma uses it).
    GeluTanh,
    /// Exact GELU.
    Gelu,
    /// `x · sigmoid(1.702 x)`, the sigmoid approximation of GELU CLIP was trained with.
    QuickGelu,
    /// `max(x, 0)²` (Nemotron-H's ungated MLPs and experts).
    Relu2,
    /// gpt-oss's clamped SwiGLU: `(clip(up, ±limit) + 1) · g · sigmoid(alpha · g)` with
    /// `g = min(gate, limit)`.
    ClampedSwiglu {
        /// The sigmoid's sharpness (`swiglu_alpha`, 1.702).
        alpha: f32,
        /// The clamp (`swiglu_limit`, 7).
        limit: f32,
    },
}

impl Activation {
    /// Maps a transformers `hidden_act` name.
    pub fn from_name(name: &str) -> Result<Activation> {
        Ok(match name {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            "quick_gelu" => Activation::QuickGelu,
            "relu2" => Activation::Relu2,
            other => return Err(Error::Config(format!("unsupported activation `{other}`"))),
        })
    }

    /// The nonlinearity alone, for ungated blocks.
    pub fn apply(self, x: &Array) -> mlx::Result<Array> {
        match self {
            Activation::Silu => x.silu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Gelu => x.gelu(),
            Activation::QuickGelu => x.multiply(&x.multiply(1.702)?.sigmoid()?),
            Activation::Relu2 => x.maximum(0.0)?.square(),
            // Only ever applied gated, below.
            Activation::ClampedSwiglu { .. } => Ok(x.clone()),
        }
    }

    /// `act(gate) · up`, fused: mlxkit's CPU kernel where it applies, else MLX's ops compiled.
    pub fn gated(self, gate: &Array, up: &Array) -> Result<Array> {
        if let Activation::ClampedSwiglu { alpha, limit } = self {
            let gate = gate.minimum(limit)?;
            let up = up.clip(-limit, limit)?;
            let glu = gate.multiply(&gate.multiply(alpha)?.sigmoid()?)?;
            return Ok(up.add(1.0)?.multiply(&glu)?);
        }
        let kernel = match self {
            Activation::Silu => Some(Gate::Silu),
            Activation::GeluTanh => Some(Gate::GeluTanh),
            Activation::Gelu
            | Activation::QuickGelu
            | Activation::Relu2
            | Activation::ClampedSwiglu { .. } => None,
        };
        if let Some(kind) = kernel
            && let Some(out) = mlx::fast::gated_activation(kind, gate, up)?
        {
            return Ok(out);
        }
        thread_local! {
            // MLX graphs and compiled functions belong to the thread that built them.
            static COMPILED: [OnceCell<Option<Compiled>>; 5] = const {
                [
                    OnceCell::new(),
                    OnceCell::new(),
                    OnceCell::new(),
                    OnceCell::new(),
                    OnceCell::new(),
                ]
            };
        }
        let index = match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
            Activation::Gelu | Activation::ClampedSwiglu { .. } => 2,
            Activation::Relu2 => 3,
            Activation::QuickGelu => 4,
        };
        let inputs = [gate.clone(), up.clone()];
        let fused = COMPILED.with(|cells| {
            let compiled = cells[index].get_or_init(|| {
                mlx::compile(
                    move |xs: &[Array]| Ok(vec![self.apply(&xs[0])?.multiply(&xs[1])?]),
                    true,
                )
                .ok()
            });
            compiled.as_ref().map(|c| c.call(&inputs))
        });
        match fused {
            Some(Ok(mut out)) if out.len() == 1 => Ok(out.remove(0)),
            Some(Err(e)) => Err(e.into()),
            // Compilation unavailable: the same math unfused.
            _ => Ok(self.apply(gate)?.multiply(up)?),
        }
    }
}
