//! `Taps`: the layers whose outputs a model offers a block drafter ([`crate::Model::tap_layers`],
//! read by `arch::dflash`), and their collection during a forward. A family holds one and
//! records each layer's output as its forward goes; a forward that stops short of a tapped
//! layer (a layer-skip draft) offers none.

use mlx::Array;

use crate::{Error, Result};

/// The layers tapped, in the order the drafter names them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Taps {
    layers: Vec<usize>,
}

impl Taps {
    /// Taps `layers` of a model of `count` layers; a layer past the last is refused by name.
    pub(crate) fn set(&mut self, layers: &[usize], count: usize) -> Result<()> {
        if let Some(layer) = layers.iter().find(|&&l| l >= count) {
            return Err(Error::InvalidInput(format!(
                "layer {layer} cannot be tapped: the model has {count} layers"
            )));
        }
        self.layers = layers.to_vec();
        Ok(())
    }

    /// A fresh collection for one forward.
    pub(crate) fn record(&self) -> Tapped<'_> {
        Tapped {
            layers: &self.layers,
            outputs: vec![None; self.layers.len()],
        }
    }
}

/// One forward's tapped outputs so far.
pub(crate) struct Tapped<'a> {
    layers: &'a [usize],
    outputs: Vec<Option<Array>>,
}

impl Tapped<'_> {
    /// Keeps `h`, layer `layer`'s output, when it is tapped.
    pub(crate) fn layer(&mut self, layer: usize, h: &Array) {
        for (tapped, slot) in self.layers.iter().zip(self.outputs.iter_mut()) {
            if *tapped == layer {
                *slot = Some(h.clone());
            }
        }
    }

    /// The tapped outputs side by side along the features, in the drafter's order; `None`
    /// when nothing is tapped or the forward stopped short of a tapped layer.
    pub(crate) fn conditioning(self) -> Result<Option<Array>> {
        if self.layers.is_empty() {
            return Ok(None);
        }
        let Some(outputs) = self.outputs.into_iter().collect::<Option<Vec<Array>>>() else {
            return Ok(None);
        };
        Ok(Some(mlx::concatenate(&outputs, -1)?))
    }
}
