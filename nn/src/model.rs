//! The model contract every architecture implements, and what a forward takes and gives.

use kvcache::LayerCache;
use mlx::Array;

use crate::config::TextConfig;
use crate::{Error, Result};

/// The tokens of one forward: `[rows, tokens]` int32 ids, and where each row starts.
///
/// Positions are per row so several sequences at different offsets can share a forward later
/// without changing any signature; today every row must start where its caches end.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids, `[rows, tokens]`, int32.
    pub tokens: Array,
    /// The position of each row's first token.
    pub positions: Vec<usize>,
}

impl Batch {
    /// One sequence of `ids` starting at `position`.
    pub fn single(ids: &[u32], position: usize) -> Result<Batch> {
        if ids.is_empty() {
            return Err(Error::InvalidInput(
                "a forward needs at least one token".into(),
            ));
        }
        let ids: Vec<i32> = ids
            .iter()
            .map(|&id| {
                i32::try_from(id)
                    .map_err(|_| Error::InvalidInput(format!("token id {id} is out of range")))
            })
            .collect::<Result<_>>()?;
        Ok(Batch {
            tokens: Array::from_slice(&ids, &[1, ids.len() as i32])?,
            positions: vec![position],
        })
    }
}

/// What a forward produces.
#[derive(Debug, Clone)]
pub struct Forward {
    /// Final hidden states, `[rows, tokens, hidden]`, before the output head.
    pub hidden: Array,
    /// Extra state a drafter head conditions on (pre-norm hidden states), when the model
    /// offers one.
    pub conditioning: Option<Array>,
}

/// A language model: embeds tokens, runs its layers over caches, and maps hidden states to
/// vocabulary logits.
pub trait Model {
    /// The hyperparameters it was built from.
    fn config(&self) -> &TextConfig;

    /// Fresh caches, one slot per layer (`None` for a layer that keeps no state).
    fn new_caches(&self) -> Result<Vec<Option<LayerCache>>>;

    /// Runs the layers over `batch`, appending to `caches`.
    fn forward(&self, batch: &Batch, caches: &mut [Option<LayerCache>]) -> Result<Forward>;

    /// Vocabulary logits of `hidden` (`[..., hidden]` → `[..., vocab]`).
    fn unembed(&self, hidden: &Array) -> Result<Array>;

    /// Every weight array, for evaluating folds once at load.
    fn parameters(&self) -> Vec<Array>;
}
