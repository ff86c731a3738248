//! `Attention`: multi-head attention with grouped key/value heads, optional q/k norms, rotary
//! positions, soft-capped logits, over the history a cache hands back.

use mlx::Array;
use mlx::fast::{AttentionMask, RopeOffset, RowHistory};

use crate::Result;
use crate::linear::Linear;
use crate::rms_norm::RmsNorm;
use crate::rope::Rope;
use crate::sdpa::ScaledDotProduct;
use crate::weights::Weights;

/// Queries, keys and values of one forward, `[batch, heads, tokens, head_dim]`, with rotary
/// positions applied to queries and keys.
pub struct Projected {
    /// Queries.
    pub queries: Array,
    /// New keys, to append to the cache.
    pub keys: Array,
    /// New values, to append to the cache.
    pub values: Array,
    /// The output gate `[batch, tokens, heads · head_dim]`, for gated attention.
    pub gate: Option<Array>,
}

/// The attention block of one layer.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    rope: Option<Rope>,
    num_heads: i32,
    num_kv_heads: i32,
    head_dim: i32,
    kernel: ScaledDotProduct,
    output_gate: bool,
    qk_norm_across_heads: bool,
}

/// The parts of an [`Attention`] block.
pub struct AttentionParts {
    /// Query projection `[heads · head_dim, dim]`.
    pub q_proj: Linear,
    /// Key projection `[kv_heads · head_dim, dim]`.
    pub k_proj: Linear,
    /// Value projection `[kv_heads · head_dim, dim]`.
    pub v_proj: Linear,
    /// Output projection `[dim, heads · head_dim]`.
    pub o_proj: Linear,
    /// Per-head norm of queries before rotation (Qwen3, Gemma 3).
    pub q_norm: Option<RmsNorm>,
    /// Per-head norm of keys before rotation.
    pub k_norm: Option<RmsNorm>,
    /// The rotary embedding; `None` for attention without positions (Nemotron-H).
    pub rope: Option<Rope>,
    /// Query heads.
    pub num_heads: i32,
    /// Key/value heads.
    pub num_kv_heads: i32,
    /// Features per head.
    pub head_dim: i32,
    /// Multiplier of `q · k` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// `tanh` soft cap of attention logits (Gemma 2).
    pub logit_softcap: Option<f32>,
    /// Gated attention (Qwen3-Next, Qwen3.5): `q_proj` yields, per head, the query and then an
    /// output gate of the same width (`[heads · 2 · head_dim, dim]`), and the attended heads
    /// are multiplied by `sigmoid(gate)` before the output projection.
    pub output_gate: bool,
    /// Per-head attention sink logits `[heads]` (gpt-oss).
    pub sinks: Option<Array>,
    /// The q/k norms span all heads' features at once (OLMo 2: `[heads · head_dim]` weights)
    /// rather than each head's.
    pub qk_norm_across_heads: bool,
}

impl AttentionParts {
    /// `q_proj`, `k_proj`, `v_proj` and `o_proj` under `p` (each with its bias where the
    /// checkpoint has one) for `heads` query and `kv_heads` key/value heads of `head_dim` over
    /// `hidden`: when `weights` load a tensor-parallel slice, this rank's heads and key/value
    /// heads (queries, keys and values column-parallel, the output row-parallel).
    pub fn load(
        weights: &mut Weights,
        p: &str,
        hidden: i32,
        (heads, kv_heads, head_dim): (i32, i32, i32),
    ) -> Result<AttentionParts> {
        let (heads, kv_heads) = match weights.tensor_parallel() {
            None => (heads, kv_heads),
            Some(parallel) => (
                parallel.part(heads as usize, "attention heads")? as i32,
                parallel.part(kv_heads as usize, "key/value heads")? as i32,
            ),
        };
        let size = weights.tensor_parallel().map_or(1, |t| t.size() as i32);
        Ok(AttentionParts::new(
            weights.column_parallel(
                &format!("{p}.q_proj"),
                size * heads * head_dim,
                hidden,
                true,
            )?,
            weights.column_parallel(
                &format!("{p}.k_proj"),
                size * kv_heads * head_dim,
                hidden,
                true,
            )?,
            weights.column_parallel(
                &format!("{p}.v_proj"),
                size * kv_heads * head_dim,
                hidden,
                true,
            )?,
            weights.row_parallel(
                &format!("{p}.o_proj"),
                hidden,
                size * heads * head_dim,
                true,
            )?,
            heads,
            kv_heads,
            head_dim,
        ))
    }

    /// Plain grouped-query attention: `num_heads` query heads over `num_kv_heads` key/value
    /// heads of `head_dim` features, logits scaled by `head_dim^-0.5`, with no norms, no
    /// rotary embedding, no soft cap, no output gate and no sinks. The `with_*` methods add
    /// what a family has beyond that; [`AttentionParts::build`] makes the block.
    pub fn new(
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        o_proj: Linear,
        num_heads: i32,
        num_kv_heads: i32,
        head_dim: i32,
    ) -> AttentionParts {
        AttentionParts {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            q_norm: None,
            k_norm: None,
            rope: None,
            num_heads,
            num_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            logit_softcap: None,
            output_gate: false,
            sinks: None,
            qk_norm_across_heads: false,
        }
    }

    /// Rotates queries and keys by `rope` (`None` keeps attention without positions).
    pub fn with_rope(mut self, rope: impl Into<Option<Rope>>) -> AttentionParts {
        self.rope = rope.into();
        self
    }

    /// Norms each head's queries and keys before rotation.
    pub fn with_qk_norms(
        mut self,
        q_norm: impl Into<Option<RmsNorm>>,
        k_norm: impl Into<Option<RmsNorm>>,
    ) -> AttentionParts {
        self.q_norm = q_norm.into();
        self.k_norm = k_norm.into();
        self
    }

    /// Norms queries and keys across all heads' features at once (OLMo 2), before rotation.
    pub fn with_qk_norms_across_heads(self, q_norm: RmsNorm, k_norm: RmsNorm) -> AttentionParts {
        AttentionParts {
            qk_norm_across_heads: true,
            ..self.with_qk_norms(q_norm, k_norm)
        }
    }

    /// Scales `q · k` by `scale` instead of `head_dim^-0.5`.
    pub fn with_scale(mut self, scale: f32) -> AttentionParts {
        self.scale = scale;
        self
    }

    /// Soft-caps attention logits with `tanh` at `cap`, when there is one (Gemma 2).
    pub fn with_logit_softcap(mut self, cap: Option<f32>) -> AttentionParts {
        self.logit_softcap = cap;
        self
    }

    /// Gates the attended heads by the second half of `q_proj`'s output
    /// ([`AttentionParts::output_gate`]).
    pub fn with_output_gate(mut self) -> AttentionParts {
        self.output_gate = true;
        self
    }

    /// Adds per-head sink logits `[heads]` (gpt-oss).
    pub fn with_sinks(mut self, sinks: Array) -> AttentionParts {
        self.sinks = Some(sinks);
        self
    }

    /// The block.
    pub fn build(self) -> Attention {
        Attention::new(self)
    }
}

impl Attention {
    /// Assembles the block.
    pub fn new(parts: AttentionParts) -> Attention {
        Attention {
            q_proj: parts.q_proj,
            k_proj: parts.k_proj,
            v_proj: parts.v_proj,
            o_proj: parts.o_proj,
            q_norm: parts.q_norm,
            k_norm: parts.k_norm,
            rope: parts.rope,
            num_heads: parts.num_heads,
            num_kv_heads: parts.num_kv_heads,
            head_dim: parts.head_dim,
            kernel: ScaledDotProduct {
                scale: parts.scale,
                logit_softcap: parts.logit_softcap,
                sinks: parts.sinks,
            },
            output_gate: parts.output_gate,
            qk_norm_across_heads: parts.qk_norm_across_heads,
        }
    }

    /// Appends every array of the block to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        for proj in [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj] {
            proj.collect_arrays(out);
        }
        for norm in [&self.q_norm, &self.k_norm].into_iter().flatten() {
            norm.collect_arrays(out);
        }
        out.extend(self.kernel.sinks.iter().cloned());
    }

    /// Projects `x: [batch, tokens, dim]` into rotated queries, keys and values.
    pub fn project(&self, x: &Array, offset: RopeOffset<'_>) -> Result<Projected> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let heads = |proj: &Linear, n: i32, norm: Option<&RmsNorm>| -> Result<Array> {
            let y = proj.forward(x)?;
            let y = match norm {
                Some(norm) if self.qk_norm_across_heads => {
                    norm.forward(&y)?.reshape(&[b, l, n, self.head_dim])?
                }
                Some(norm) => norm.forward(&y.reshape(&[b, l, n, self.head_dim])?)?,
                None => y.reshape(&[b, l, n, self.head_dim])?,
            };
            Ok(y.transpose(&[0, 2, 1, 3])?)
        };
        let (queries, gate) = if self.output_gate {
            let both =
                self.q_proj
                    .forward(x)?
                    .reshape(&[b, l, self.num_heads, 2 * self.head_dim])?;
            let mut halves = both.split_at(&[self.head_dim], -1)?.into_iter();
            let (Some(q), Some(gate)) = (halves.next(), halves.next()) else {
                return Err(crate::Error::InvalidInput(
                    "gated attention: the query projection did not split".into(),
                ));
            };
            let q = match &self.q_norm {
                Some(norm) => norm.forward(&q)?,
                None => q,
            };
            let gate = gate.reshape(&[b, l, self.num_heads * self.head_dim])?;
            (q.transpose(&[0, 2, 1, 3])?, Some(gate))
        } else {
            (
                heads(&self.q_proj, self.num_heads, self.q_norm.as_ref())?,
                None,
            )
        };
        let keys = heads(&self.k_proj, self.num_kv_heads, self.k_norm.as_ref())?;
        let values = heads(&self.v_proj, self.num_kv_heads, None)?;
        let (queries, keys) = match &self.rope {
            Some(rope) => (
                rope.forward(&queries, offset)?,
                rope.forward(&keys, offset)?,
            ),
            None => (queries, keys),
        };
        Ok(Projected {
            queries,
            keys,
            values,
            gate,
        })
    }

    /// Attends `queries` over the cached `keys`/`values` (`[batch, kv_heads, history, head_dim]`)
    /// and projects back to `[batch, tokens, dim]`, through the output gate when the block has
    /// one.
    pub fn attend(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: AttentionMask<'_>,
        gate: Option<&Array>,
    ) -> Result<Array> {
        self.output(&self.attend_heads(queries, keys, values, mask)?, gate)
    }

    /// The attention itself, per head: `[batch, heads, tokens, head_dim]`, before the output
    /// projection. Rows of a batch with different histories attend one call each and share
    /// [`Attention::output`].
    pub fn attend_heads(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: AttentionMask<'_>,
    ) -> Result<Array> {
        self.kernel.attend(queries, keys, values, mask)
    }

    /// Each row's queries over its own history, in one op: `queries` is
    /// `[rows, heads, tokens, head_dim]`, `history[r]` row r's keys and values and whether its
    /// queries see them causally. Each row's result is the same alone as in a batch. `None`
    /// where the kernel does not apply (a GPU, other dtypes); then attend each row with
    /// [`Attention::attend_heads`].
    pub fn attend_rows(
        &self,
        queries: &Array,
        history: &[RowHistory<'_>],
    ) -> Result<Option<Array>> {
        self.kernel.attend_rows(queries, history)
    }

    /// The scaled dot product it attends with.
    pub fn kernel(&self) -> &ScaledDotProduct {
        &self.kernel
    }

    /// Merges the heads of [`Attention::attend_heads`], applies the output gate of
    /// [`Projected::gate`] when there is one, and projects to `[batch, tokens, dim]`.
    pub fn output(&self, out: &Array, gate: Option<&Array>) -> Result<Array> {
        let shape = out.shape();
        let (b, l) = (shape[0], shape[2]);
        let out = out
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[b, l, self.num_heads * self.head_dim])?;
        let out = match gate {
            Some(gate) => out.multiply(&gate.sigmoid()?)?,
            None => out,
        };
        self.o_proj.forward(&out)
    }
}
