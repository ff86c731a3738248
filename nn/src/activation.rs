//! Gated activations `act(gate) · up`: mlxkit's vectorized CPU kernel, or MLX's ops compiled
//! once per thread into one fused kernel.

use std::cell::OnceCell;

use mlx::fast::Gate;
use mlx::{Array, Compiled};

use crate::{Error, Result};

/// The nonlinearity of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU with the tanh approximation (GeGLU as Gemma uses it).
    GeluTanh,
    /// Exact GELU.
    Gelu,
}

impl Activation {
    /// Maps a transformers `hidden_act` name.
    pub fn from_name(name: &str) -> Result<Activation> {
        Ok(match name {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            other => return Err(Error::Config(format!("unsupported activation `{other}`"))),
        })
    }

    fn apply(self, x: &Array) -> mlx::Result<Array> {
        match self {
            Activation::Silu => x.silu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Gelu => x.gelu(),
        }
    }

    /// `act(gate) · up`, fused: mlxkit's CPU kernel where it applies, else MLX's ops compiled.
    pub fn gated(self, gate: &Array, up: &Array) -> Result<Array> {
        let kernel = match self {
            Activation::Silu => Some(Gate::Silu),
            Activation::GeluTanh => Some(Gate::GeluTanh),
            Activation::Gelu => None,
        };
        if let Some(kind) = kernel
            && let Some(out) = mlx::fast::gated_activation(kind, gate, up)?
        {
            return Ok(out);
        }
        thread_local! {
            // MLX graphs and compiled functions belong to the thread that built them.
            static COMPILED: [OnceCell<Option<Compiled>>; 3] = const { [OnceCell::new(), OnceCell::new(), OnceCell::new()] };
        }
        let index = self as usize;
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
