//! Nemotron-H (NVIDIA): a hybrid of Mamba-2 mixers, attention and MLP blocks.
//!
//! Every block is one pre-norm sublayer added to the residual stream: a **Mamba-2 mixer** (most
//! blocks; see [`crate::mamba2`]), grouped-query **attention without positional embeddings** (a
//! few), or a **squared-ReLU MLP** (`down(relu(up(x))²)`, no gate). The kinds come from
//! `layers_block_type` (transformers 5) or NVIDIA's `hybrid_override_pattern` string (`M`
//! Mamba, `*` attention, `-` MLP, `E` experts).
//!
//! References: transformers' `models/nemotron_h/modeling_nemotron_h.py` (5.24); NVIDIA,
//! "Nemotron-H: A Family of Accurate and Efficient Hybrid Mamba-Transformer Models" (2025).
//! Nemotron 3's mixture-of-experts blocks (`E`) route each token, DeepSeek-style (sigmoid
//! scores with a correction bias, the best groups, a routed scale), to ungated squared-ReLU
//! experts that work in a narrower latent space (`fc1_latent_proj` in, `fc2_latent_proj` out,
//! when `moe_latent_size` is set), beside shared experts that see the block's input itself.

use kvcache::{LayerCache, LogicalMask};
use mlx::Array;
use serde_json::Value;

use crate::activation::Activation;
use crate::attention::{Attention, AttentionParts};
use crate::cached_attention::{BatchPositions, attend_cached, check_cache_sets};
use crate::config::{Fields, dim, limits, missing};
use crate::embedding::Embedding;
use crate::linear::{Linear, Tensor};
use crate::mamba2::{Mamba2Config, Mamba2Mixer};
use crate::model::{Batch, Forward, LayerState, Model, ModelSpec, check_depth};
use crate::moe::{Moe, RouterOptions, RouterScoring, StackedExperts};
use crate::rms_norm::RmsNorm;
use crate::weights::{Weights, check_matrix};
use crate::{Error, Result};

/// What a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// A Mamba-2 mixer.
    Mamba,
    /// Attention.
    Attention,
    /// A squared-ReLU MLP.
    Mlp,
    /// A mixture of squared-ReLU experts.
    Moe,
}

/// The hyperparameters of a Nemotron-H model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `model_type`.
    pub model_type: String,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `layer_norm_epsilon`.
    pub layer_norm_epsilon: f32,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `tie_word_embeddings`; `None` when silent (no `lm_head` then means tied).
    pub tie_word_embeddings: Option<bool>,
    /// The kind of each block.
    pub blocks: Vec<Block>,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads`.
    pub num_key_value_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `attention_bias`.
    pub attention_bias: bool,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `mlp_bias`.
    pub mlp_bias: bool,
    /// `mamba_num_heads`.
    pub mamba_num_heads: usize,
    /// `mamba_head_dim`.
    pub mamba_head_dim: usize,
    /// `ssm_state_size`.
    pub ssm_state_size: usize,
    /// `n_groups`.
    pub n_groups: usize,
    /// `conv_kernel`.
    pub conv_kernel: usize,
    /// `use_conv_bias`.
    pub use_conv_bias: bool,
    /// `use_bias`: biases on the mixer's projections.
    pub use_bias: bool,
    /// `time_step_min`: the smallest step size.
    pub time_step_min: f32,
    /// The experts of `E` blocks, when there are any.
    pub experts: Option<Experts>,
}

/// The mixture-of-experts hyperparameters of `E` blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    /// `n_routed_experts`.
    pub n_routed_experts: usize,
    /// `num_experts_per_tok`.
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size`.
    pub moe_intermediate_size: usize,
    /// `moe_shared_expert_intermediate_size` (0: no shared expert).
    pub shared_intermediate_size: usize,
    /// `moe_latent_size`: the experts' input and output width, when narrower than the model's.
    pub moe_latent_size: Option<usize>,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f32,
    /// `n_group` and `topk_group`.
    pub groups: (usize, usize),
    /// `norm_topk_prob`.
    pub norm_topk_prob: bool,
}

impl Config {
    /// Reads the config.
    pub fn from_json(config: &Value) -> Result<Config> {
        let f = Fields::text_section(config);
        let model_type = f
            .str("model_type")
            .ok_or_else(|| missing("model_type"))?
            .to_string();
        let blocks = read_blocks(&f)?;
        let (heads, kv_heads) = f.attention_heads()?;
        let mamba_heads = f.required_bounded("mamba_num_heads", limits::HEADS)?;
        let groups = match f.bounded("n_groups", limits::HEADS)? {
            Some(groups) => groups,
            None => f.required_bounded("mamba_n_groups", limits::HEADS)?,
        };
        let conv_kernel = match f.bounded("conv_kernel", 64)? {
            Some(kernel) => kernel,
            None => f.required_bounded("mamba_d_conv", 64)?,
        };
        let experts = if blocks.contains(&Block::Moe) {
            let count = f
                .bounded("n_routed_experts", limits::EXPERTS)?
                .ok_or_else(|| missing("n_routed_experts"))?;
            let top_k = f.required_usize("num_experts_per_tok")?;
            if count == 0 || top_k == 0 || top_k > count {
                return Err(Error::Config(format!(
                    "`num_experts_per_tok` = {top_k} must be between 1 and the {count} experts"
                )));
            }
            Some(Experts {
                n_routed_experts: count,
                num_experts_per_tok: top_k,
                moe_intermediate_size: f
                    .required_bounded("moe_intermediate_size", limits::INTERMEDIATE)?,
                shared_intermediate_size: f
                    .bounded("moe_shared_expert_intermediate_size", limits::INTERMEDIATE)?
                    .unwrap_or(0),
                moe_latent_size: f.bounded("moe_latent_size", limits::HIDDEN)?,
                routed_scaling_factor: f.f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
                groups: (
                    f.bounded("n_group", limits::EXPERTS)?.unwrap_or(1),
                    f.bounded("topk_group", limits::EXPERTS)?.unwrap_or(1),
                ),
                norm_topk_prob: f.bool("norm_topk_prob")?.unwrap_or(true),
            })
        } else {
            None
        };
        let config = Config {
            model_type,
            hidden_size: f.required_bounded("hidden_size", limits::HIDDEN)?,
            vocab_size: f.required_bounded("vocab_size", limits::VOCAB)?,
            layer_norm_epsilon: f
                .f64("layer_norm_epsilon")?
                .ok_or_else(|| missing("layer_norm_epsilon"))?
                as f32,
            max_position_embeddings: f
                .bounded("max_position_embeddings", limits::POSITIONS)?
                .ok_or_else(|| missing("max_position_embeddings"))?,
            tie_word_embeddings: f.bool("tie_word_embeddings")?,
            blocks,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim: f.required_bounded("head_dim", limits::HIDDEN)?,
            attention_bias: f.bool("attention_bias")?.unwrap_or(false),
            intermediate_size: f.required_bounded("intermediate_size", limits::INTERMEDIATE)?,
            mlp_bias: f.bool("mlp_bias")?.unwrap_or(false),
            mamba_num_heads: mamba_heads,
            mamba_head_dim: f.required_bounded("mamba_head_dim", limits::HIDDEN)?,
            ssm_state_size: f.required_bounded("ssm_state_size", limits::HIDDEN)?,
            n_groups: groups,
            conv_kernel,
            use_conv_bias: match f.bool("use_conv_bias")? {
                Some(bias) => bias,
                None => f.bool("mamba_conv_bias")?.unwrap_or(true),
            },
            use_bias: f.bool("use_bias")?.unwrap_or(false),
            time_step_min: match f.f64("time_step_min")? {
                Some(min) => min,
                None => f.f64("mamba_dt_min")?.unwrap_or(0.001),
            } as f32,
            experts,
        };
        config.mamba().check()?;
        Ok(config)
    }

    /// The Mamba-2 mixers' sizes and settings.
    pub fn mamba(&self) -> Mamba2Config {
        Mamba2Config {
            hidden_size: self.hidden_size,
            heads: self.mamba_num_heads,
            head_dim: self.mamba_head_dim,
            groups: self.n_groups,
            state_size: self.ssm_state_size,
            conv_kernel: self.conv_kernel,
            conv_bias: self.use_conv_bias,
            projection_bias: self.use_bias,
            norm_eps: self.layer_norm_epsilon,
            // The reference clamps below only, at `time_step_min`.
            dt_limit: (self.time_step_min, f32::INFINITY),
        }
    }

    /// What the engine needs to know of the model.
    pub fn spec(&self) -> ModelSpec {
        let recurrent = self.mamba().recurrent();
        ModelSpec {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            context_length: self.max_position_embeddings,
            layers: self
                .blocks
                .iter()
                .map(|block| match block {
                    Block::Mamba => LayerState::Recurrent { state: recurrent },
                    Block::Attention => LayerState::Attention {
                        kv_heads: self.num_key_value_heads,
                        head_dim: self.head_dim,
                        window: None,
                    },
                    Block::Mlp | Block::Moe => LayerState::Stateless,
                })
                .collect(),
        }
    }
}

/// The block kinds: `layers_block_type` / `layer_types` (either naming), else
/// `hybrid_override_pattern`.
fn read_blocks(f: &Fields<'_>) -> Result<Vec<Block>> {
    let kind = |name: &str| -> Result<Block> {
        match name {
            "linear_attention" | "mamba" | "M" => Ok(Block::Mamba),
            "full_attention" | "attention" | "*" => Ok(Block::Attention),
            "mlp" | "-" => Ok(Block::Mlp),
            "moe" | "E" => Ok(Block::Moe),
            other => Err(Error::Config(format!(
                "unsupported Nemotron-H block `{other}`"
            ))),
        }
    };
    let blocks = match f.get("layers_block_type").or_else(|| f.get("layer_types")) {
        Some(list) => list
            .as_array()
            .ok_or_else(|| Error::Config("`layers_block_type` must be a list".into()))?
            .iter()
            .map(|t| kind(t.as_str().unwrap_or_default()))
            .collect::<Result<Vec<_>>>()?,
        None => {
            let pattern = f
                .str("hybrid_override_pattern")
                .ok_or_else(|| missing("layers_block_type"))?;
            let mut letter = [0u8; 4];
            pattern
                .chars()
                .map(|c| kind(c.encode_utf8(&mut letter)))
                .collect::<Result<Vec<_>>>()?
        }
    };
    if blocks.is_empty() || blocks.len() > limits::LAYERS {
        return Err(Error::Config(format!(
            "`layers_block_type` lists {} blocks",
            blocks.len()
        )));
    }
    Ok(blocks)
}

/// The squared-ReLU MLP of a `-` block.
struct Relu2Mlp {
    up_proj: Linear,
    down_proj: Linear,
}

impl Relu2Mlp {
    fn new(weights: &mut Weights, p: &str, inter: i32, hidden: i32, bias: bool) -> Result<Self> {
        Ok(Relu2Mlp {
            up_proj: weights.projection(&format!("{p}.up_proj"), inter, hidden, bias)?,
            down_proj: weights.projection(&format!("{p}.down_proj"), hidden, inter, bias)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let up = self.up_proj.forward(x)?.maximum(0.0)?;
        self.down_proj.forward(&up.square()?)
    }
}

/// The sublayer of an `E` block: routed experts in the latent space beside shared experts.
struct ExpertBlock {
    /// Router `gate` (with its correction bias) and the ungated experts.
    experts: Moe,
    /// `fc1_latent_proj` and `fc2_latent_proj`, when the experts work in a narrower space.
    latent: Option<(Linear, Linear)>,
    /// `shared_experts`, fed the block's input itself.
    shared_experts: Option<Relu2Mlp>,
}

impl ExpertBlock {
    fn new(c: &Config, weights: &mut Weights, p: &str) -> Result<ExpertBlock> {
        let e = c
            .experts
            .as_ref()
            .ok_or_else(|| Error::Config("an `E` block needs `n_routed_experts`".into()))?;
        let hidden = dim(c.hidden_size, "hidden_size")?;
        let count = dim(e.n_routed_experts, "n_routed_experts")?;
        let inter = dim(e.moe_intermediate_size, "moe_intermediate_size")?;
        let inner = dim(
            e.moe_latent_size.unwrap_or(c.hidden_size),
            "moe_latent_size",
        )?;
        let stacked = |weights: &mut Weights, which: &str, out: i32, inp: i32| {
            let fused = format!("{p}.experts.{which}");
            if weights.contains(&fused) {
                return Ok(StackedExperts::new(Tensor::Dense(
                    weights.dense(&fused, &[count, out, inp])?,
                )));
            }
            StackedExperts::load(
                weights,
                &format!("{p}.experts"),
                which,
                e.n_routed_experts,
                out,
                inp,
            )
        };
        let correction_bias =
            match weights.optional(&format!("{p}.gate.e_score_correction_bias"))? {
                Some(Tensor::Dense(bias)) => Some(bias),
                Some(Tensor::Quantized(_) | Tensor::KBlocks(_)) => {
                    return Err(Error::Weights(format!(
                        "`{p}.gate.e_score_correction_bias` is quantized"
                    )));
                }
                None => None,
            };
        let experts = Moe::ungated(
            weights.matrix(&format!("{p}.gate"), count, hidden)?,
            stacked(weights, "up_proj", inter, inner)?,
            stacked(weights, "down_proj", inner, inter)?,
            e.num_experts_per_tok,
            e.norm_topk_prob,
            RouterScoring::Sigmoid,
            Activation::Relu2,
        )?
        .with_routing(RouterOptions {
            correction_bias,
            groups: Some(e.groups),
            scale: e.routed_scaling_factor,
        })?;
        let latent = match e.moe_latent_size {
            Some(_) => Some((
                weights.projection(&format!("{p}.fc1_latent_proj"), inner, hidden, c.mlp_bias)?,
                weights.projection(&format!("{p}.fc2_latent_proj"), hidden, inner, c.mlp_bias)?,
            )),
            None => None,
        };
        let shared_experts = match e.shared_intermediate_size {
            0 => None,
            width => Some(Relu2Mlp::new(
                weights,
                &format!("{p}.shared_experts"),
                dim(width, "moe_shared_expert_intermediate_size")?,
                hidden,
                c.mlp_bias,
            )?),
        };
        Ok(ExpertBlock {
            experts,
            latent,
            shared_experts,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        let routed = match &self.latent {
            Some((fc1, fc2)) => {
                fc2.forward(&self.experts.forward_routed_by(&fc1.forward(x)?, x)?)?
            }
            None => self.experts.forward(x)?,
        };
        match &self.shared_experts {
            Some(shared) => Ok(routed.add(&shared.forward(x)?)?),
            None => Ok(routed),
        }
    }

    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.experts.collect_arrays(out);
        if let Some((fc1, fc2)) = &self.latent {
            fc1.collect_arrays(out);
            fc2.collect_arrays(out);
        }
        if let Some(shared) = &self.shared_experts {
            shared.up_proj.collect_arrays(out);
            shared.down_proj.collect_arrays(out);
        }
    }
}

/// A block's sublayer.
enum Mixer {
    Mamba(Box<Mamba2Mixer>),
    Attention(Box<Attention>),
    Mlp(Box<Relu2Mlp>),
    Moe(Box<ExpertBlock>),
}

/// One block: `norm` → mixer, added to the residual stream.
struct NemotronHBlock {
    norm: RmsNorm,
    mixer: Mixer,
}

/// A Nemotron-H model.
pub struct NemotronH {
    spec: ModelSpec,
    embeddings: Embedding,
    layers: Vec<NemotronHBlock>,
    norm_f: RmsNorm,
    lm_head: Linear,
}

impl NemotronH {
    /// Builds the model from its weights (`backbone.layers.N.mixer.…`, as NVIDIA and
    /// transformers save them).
    pub fn new(config: Config, weights: &mut Weights) -> Result<NemotronH> {
        let hidden = dim(config.hidden_size, "hidden_size")?;
        let vocab = dim(config.vocab_size, "vocab_size")?;
        let eps = config.layer_norm_epsilon;
        let norm = |weights: &mut Weights, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(weights.dense(name, &[hidden])?, eps))
        };
        let embed_name = "backbone.embeddings.weight";
        let embed_weight = weights.table(embed_name)?;
        check_matrix(embed_name, &embed_weight, vocab, hidden)?;
        let embeddings = Embedding::new(embed_weight).with_packed(weights.packed(embed_name)?);

        let mut layers = Vec::with_capacity(config.blocks.len());
        for (i, block) in config.blocks.iter().enumerate() {
            let p = format!("backbone.layers.{i}");
            let mixer = match block {
                Block::Mamba => Mixer::Mamba(Box::new(Mamba2Mixer::new(
                    &config.mamba(),
                    weights,
                    &format!("{p}.mixer"),
                )?)),
                Block::Attention => Mixer::Attention(Box::new(attention(
                    &config,
                    weights,
                    &format!("{p}.mixer"),
                )?)),
                Block::Mlp => {
                    let inter = dim(config.intermediate_size, "intermediate_size")?;
                    Mixer::Mlp(Box::new(Relu2Mlp::new(
                        weights,
                        &format!("{p}.mixer"),
                        inter,
                        hidden,
                        config.mlp_bias,
                    )?))
                }
                Block::Moe => Mixer::Moe(Box::new(ExpertBlock::new(
                    &config,
                    weights,
                    &format!("{p}.mixer"),
                )?)),
            };
            layers.push(NemotronHBlock {
                norm: norm(weights, &format!("{p}.norm.weight"))?,
                mixer,
            });
        }
        let norm_f = norm(weights, "backbone.norm_f.weight")?;
        let lm_head = embeddings.output_head(
            weights,
            config.tie_word_embeddings,
            "lm_head",
            vocab,
            hidden,
        )?;
        Ok(NemotronH {
            spec: config.spec(),
            embeddings,
            layers,
            norm_f,
            lm_head,
        })
    }
}

/// The attention of a `*` block: grouped-query, no positional embedding.
fn attention(c: &Config, weights: &mut Weights, p: &str) -> Result<Attention> {
    let hidden = dim(c.hidden_size, "hidden_size")?;
    let heads = dim(c.num_attention_heads, "num_attention_heads")?;
    let kv_heads = dim(c.num_key_value_heads, "num_key_value_heads")?;
    let head_dim = dim(c.head_dim, "head_dim")?;
    let projection = |weights: &mut Weights, name: &str, out: i32, inp: i32| {
        weights.projection(&format!("{p}.{name}"), out, inp, c.attention_bias)
    };
    Ok(AttentionParts::new(
        projection(weights, "q_proj", heads * head_dim, hidden)?,
        projection(weights, "k_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "v_proj", kv_heads * head_dim, hidden)?,
        projection(weights, "o_proj", hidden, heads * head_dim)?,
        heads,
        kv_heads,
        head_dim,
    )
    .build())
}

impl Model for NemotronH {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// A Mamba layer's state cannot rewind past a forward; `slack` only concerns sliding
    /// windows, which this family has none of. MLP blocks keep nothing.
    fn forward_rows(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
    ) -> Result<Forward> {
        self.forward_rows_through(batch, caches, self.layers.len())
    }

    fn forward_rows_through(
        &self,
        batch: &Batch,
        caches: &mut [&mut [Option<LayerCache>]],
        layers: usize,
    ) -> Result<Forward> {
        check_depth(layers, self.layers.len())?;
        check_cache_sets(batch, caches, self.layers.len())?;
        let positions = BatchPositions::new(batch)?;
        let mut h = self.embeddings.forward(&batch.tokens)?;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let x = layer.norm.forward(&h)?;
            let mixed = match &layer.mixer {
                Mixer::Mamba(mixer) => mixer.forward(&x, caches, i)?,
                Mixer::Attention(attention) => {
                    let projected = attention.project(&x, positions.rope())?;
                    attend_cached(
                        attention,
                        &projected,
                        caches,
                        i,
                        &batch.positions,
                        LogicalMask::Causal,
                    )?
                }
                Mixer::Mlp(mlp) => mlp.forward(&x)?,
                Mixer::Moe(experts) => experts.forward(&x)?,
            };
            h = h.add(&mixed)?;
        }
        Ok(Forward {
            hidden: self.norm_f.forward(&h)?,
            conditioning: None,
        })
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.lm_head.forward(hidden)
    }

    fn parameters(&self) -> Vec<Array> {
        let mut out = Vec::new();
        self.embeddings.collect_arrays(&mut out);
        for layer in &self.layers {
            layer.norm.collect_arrays(&mut out);
            match &layer.mixer {
                Mixer::Mamba(mixer) => mixer.collect_arrays(&mut out),
                Mixer::Attention(attention) => attention.collect_arrays(&mut out),
                Mixer::Mlp(mlp) => {
                    mlp.up_proj.collect_arrays(&mut out);
                    mlp.down_proj.collect_arrays(&mut out);
                }
                Mixer::Moe(experts) => experts.collect_arrays(&mut out),
            }
        }
        self.norm_f.collect_arrays(&mut out);
        self.lm_head.collect_arrays(&mut out);
        out
    }
}
