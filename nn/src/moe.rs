//! `Moe`: a routed mixture of gated experts, run through MLX's gathered matmuls.

use mlx::quantized::{Quantized, gather_mm};
use mlx::{Array, Device, Dtype};

use crate::activation::Activation;
use crate::linear::{Linear, Tensor};
use crate::mlp::Mlp;
use crate::weights::Weights;
use crate::{Error, Result};

/// How router logits become expert weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScoring {
    /// Softmax over all experts, then top-k (Qwen3-MoE, Mixtral).
    Softmax,
    /// Independent sigmoids, then top-k (DeepSeek-V3 style).
    Sigmoid,
    /// Top-k of the raw logits, then a softmax over those k (gpt-oss).
    SoftmaxOverTopK,
}

/// Experts stacked along a leading axis: `[experts, out, in]`.
#[derive(Debug, Clone)]
pub struct StackedExperts {
    weight: Tensor,
}

impl StackedExperts {
    /// Wraps a stacked `[experts, out, in]` weight.
    pub fn new(weight: Tensor) -> StackedExperts {
        StackedExperts { weight }
    }

    /// One projection (`which`, such as `gate_proj` or `w1`) of the `count` experts under
    /// `experts` (the module path ending in `.experts`), checked to be `[count, out, in]`.
    /// Either stored stacked, as `{experts}.{which}.weight` (GGUF, mlx-lm conversions, and
    /// what `mlxkit create` writes, so loading copies nothing), or one matrix per expert,
    /// `{experts}.{e}.{which}.weight` (transformers), stacked here.
    pub fn load(
        weights: &mut Weights,
        experts: &str,
        which: &str,
        count: usize,
        out: i32,
        inp: i32,
    ) -> Result<StackedExperts> {
        let stacked = format!("{experts}.{which}.weight");
        if weights.contains(&stacked) {
            let weight = weights.weight(&stacked)?;
            let count = i32::try_from(count)
                .map_err(|_| Error::Weights(format!("{count} experts is too many")))?;
            let shape = weight.shape();
            if shape != [count, out, inp] {
                return Err(Error::Weights(format!(
                    "tensor `{stacked}` is {shape:?}, expected [{count}, {out}, {inp}]"
                )));
            }
            return Ok(StackedExperts::new(weight));
        }
        let each = (0..count)
            .map(|e| {
                let name = format!("{experts}.{e}.{which}");
                Ok(weights.matrix(&name, out, inp)?.into_weight())
            })
            .collect::<Result<Vec<_>>>()?;
        StackedExperts::stack(&format!("{experts}.{which}"), each)
    }

    /// Stacks per-expert `[out, in]` weights of one kind, called `name` in errors.
    pub fn stack(name: &str, weights: Vec<Tensor>) -> Result<StackedExperts> {
        Ok(StackedExperts::new(Tensor::stack(name, weights)?))
    }

    /// `x: [tokens, 1, 1, in]` through expert `indices[t, j]` → `[tokens, k, 1, out]`.
    fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        Ok(match &self.weight {
            Tensor::Dense(w) => gather_dense(x, &w.swap_axes(-1, -2)?, indices)?,
            Tensor::Quantized(q) => q.gather_matmul(x, None, Some(indices), true, false)?,
            Tensor::KBlocks(_) => {
                return Err(crate::Error::Weights(
                    "stacked experts never take the k-block form".into(),
                ));
            }
        })
    }

    fn rows(&self) -> Result<i32> {
        Ok(match &self.weight {
            Tensor::Dense(w) => w.dim(1)?,
            Tensor::Quantized(q) => q.weights.dim(1)?,
            Tensor::KBlocks(k) => k.shape()[0] as i32,
        })
    }
}

/// `x @ w[indices]` for dense experts. MLX's CPU `gather_mm` takes only f32 (0.32.4), while its
/// GPU kernels take bf16 and f16 too: on a CPU, other dtypes are multiplied in f32 and the
/// product is rounded back, so a bf16 model runs there as well (the tests run the GPU's path
/// in bf16 on a CPU that way).
fn gather_dense(x: &Array, w: &Array, indices: &Array) -> Result<Array> {
    let dtype = x.dtype();
    if dtype == Dtype::F32 || Device::default_device()? != Device::Cpu {
        return Ok(gather_mm(x, w, None, Some(indices), false)?);
    }
    let product = gather_mm(
        &x.astype(Dtype::F32)?,
        &w.astype(Dtype::F32)?,
        None,
        Some(indices),
        false,
    )?;
    Ok(product.astype(dtype)?)
}

/// DeepSeek-V3's refinements of routing: a per-expert bias added to the scores only to choose
/// experts (the weights come from the unbiased scores), a choice restricted to the best groups
/// of experts (a group scored by the sum of its two best), and a scale on the chosen weights.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// `e_score_correction_bias` `[experts]`.
    pub correction_bias: Option<Array>,
    /// `n_group` and `topk_group`: experts split into this many groups, choices only from
    /// this many best.
    pub groups: Option<(usize, usize)>,
    /// `routed_scaling_factor`.
    pub scale: f32,
}

/// An expert every token goes through beside the routed ones (Qwen3-Next, Qwen3.5-MoE,
/// DeepSeek-V3), optionally scaled per token by `sigmoid(gate · x)`.
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// The expert.
    pub mlp: Mlp,
    /// `[1, dim]`: the per-token gate, when the family has one.
    pub gate: Option<Linear>,
}

/// A mixture-of-experts feed-forward block.
#[derive(Debug, Clone)]
pub struct Moe {
    router: Linear,
    gate_up: StackedExperts,
    hidden: i32,
    down: StackedExperts,
    top_k: i32,
    normalize_top_k: bool,
    scoring: RouterScoring,
    activation: Activation,
    shared: Option<Box<SharedExpert>>,
    routing: Option<Box<RouterOptions>>,
    /// Per-expert biases of the fused gate/up projection (`[experts, 2 · hidden]`, gate rows
    /// first) and of the down projection (`[experts, dim]`).
    expert_biases: Option<Box<(Array, Array)>>,
    /// Routing weights scale each expert's input instead of its output (Llama 4).
    scale_inputs: bool,
    /// A factor per expert on its routing weight (Gemma 4).
    expert_scales: Option<Array>,
    /// The experts are ungated: `gate_up` holds only their up projections and the hidden
    /// state is `act(up · x)` (Nemotron-H).
    ungated: bool,
}

impl Moe {
    /// Builds the block; gate and up experts are fused along their output rows once, here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        router: Linear,
        gate: StackedExperts,
        up: StackedExperts,
        down: StackedExperts,
        top_k: usize,
        normalize_top_k: bool,
        scoring: RouterScoring,
        activation: Activation,
    ) -> Result<Moe> {
        if gate.rows()? != up.rows()? {
            return Err(Error::Weights(
                "gate and up experts have different widths".into(),
            ));
        }
        let gate_up = match (gate.weight, up.weight) {
            (Tensor::Dense(g), Tensor::Dense(u)) => Tensor::Dense(mlx::concatenate(&[g, u], 1)?),
            (Tensor::Quantized(g), Tensor::Quantized(u)) if g.spec == u.spec => {
                let biases = match (g.biases, u.biases) {
                    (Some(a), Some(b)) => Some(mlx::concatenate(&[a, b], 1)?),
                    (None, None) => None,
                    _ => {
                        return Err(Error::Weights(
                            "gate and up experts disagree on biases".into(),
                        ));
                    }
                };
                Tensor::Quantized(Quantized {
                    weights: mlx::concatenate(&[g.weights, u.weights], 1)?,
                    scales: mlx::concatenate(&[g.scales, u.scales], 1)?,
                    biases,
                    spec: g.spec,
                })
            }
            _ => {
                return Err(Error::Weights(
                    "gate and up experts are stored differently".into(),
                ));
            }
        };
        Moe::from_fused(
            router,
            StackedExperts::new(gate_up),
            down,
            top_k,
            normalize_top_k,
            scoring,
            activation,
        )
    }

    /// Builds the block from gate and up experts already fused along their output rows
    /// (`[experts, 2 · hidden, dim]`, gate first: transformers 5's `experts.gate_up_proj`).
    #[allow(clippy::too_many_arguments)]
    pub fn from_fused(
        router: Linear,
        gate_up: StackedExperts,
        down: StackedExperts,
        top_k: usize,
        normalize_top_k: bool,
        scoring: RouterScoring,
        activation: Activation,
    ) -> Result<Moe> {
        let rows = gate_up.rows()?;
        if rows % 2 != 0 {
            return Err(Error::Weights(format!(
                "fused gate/up experts have {rows} rows, not two halves"
            )));
        }
        let mut moe = Moe::assemble(
            router,
            gate_up,
            rows / 2,
            down,
            top_k,
            normalize_top_k,
            scoring,
        )?;
        moe.activation = activation;
        Ok(moe)
    }

    /// The block with experts `gate_up` of `hidden` units each (a gated expert's rows are
    /// two halves of that), SiLU until a constructor says otherwise, and no extras.
    fn assemble(
        router: Linear,
        gate_up: StackedExperts,
        hidden: i32,
        down: StackedExperts,
        top_k: usize,
        normalize_top_k: bool,
        scoring: RouterScoring,
    ) -> Result<Moe> {
        let top_k = i32::try_from(top_k)
            .map_err(|_| Error::Config("experts_per_token is too large".into()))?;
        if top_k < 1 {
            return Err(Error::Config("experts_per_token must be at least 1".into()));
        }
        Ok(Moe {
            router,
            gate_up,
            hidden,
            down,
            top_k,
            normalize_top_k,
            scoring,
            activation: Activation::Silu,
            shared: None,
            routing: None,
            expert_biases: None,
            scale_inputs: false,
            expert_scales: None,
            ungated: false,
        })
    }

    /// Routes with DeepSeek-V3's refinements.
    pub fn with_routing(mut self, routing: RouterOptions) -> Result<Moe> {
        if let Some((groups, best)) = routing.groups {
            let experts = self.router.out_features()? as usize;
            if groups == 0 || best == 0 || best > groups || !experts.is_multiple_of(groups) {
                return Err(Error::Config(format!(
                    "{experts} experts cannot be routed through the best {best} of {groups} groups"
                )));
            }
            if (experts / groups) < 2 {
                return Err(Error::Config(
                    "expert groups need at least two experts each".into(),
                ));
            }
        }
        self.routing = Some(Box::new(routing));
        Ok(self)
    }

    /// Adds per-expert biases to the gate/up (`[experts, 2 · hidden]`, gate first) and down
    /// (`[experts, dim]`) projections.
    pub fn with_expert_biases(mut self, gate_up: Array, down: Array) -> Moe {
        self.expert_biases = Some(Box::new((gate_up, down)));
        self
    }

    /// A block of ungated experts: `down(act(up · x))`, with `up` `[experts, hidden, dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn ungated(
        router: Linear,
        up: StackedExperts,
        down: StackedExperts,
        top_k: usize,
        normalize_top_k: bool,
        scoring: RouterScoring,
        activation: Activation,
    ) -> Result<Moe> {
        let hidden = up.rows()?;
        let mut moe = Moe::assemble(router, up, hidden, down, top_k, normalize_top_k, scoring)?;
        moe.activation = activation;
        moe.ungated = true;
        Ok(moe)
    }

    /// Multiplies each chosen expert's routing weight by its own learned factor (`[experts]`),
    /// after the top-k weights are normalized (Gemma 4's `per_expert_scale`). They are
    /// widened to the routing weights' f32 once, here.
    pub fn with_expert_scales(mut self, scales: Array) -> Result<Moe> {
        self.expert_scales = Some(scales.astype(Dtype::F32)?);
        Ok(self)
    }

    /// Scales each expert's input by its routing weight instead of its output (Llama 4: the
    /// experts are nonlinear, so the two differ).
    pub fn with_scaled_inputs(mut self) -> Moe {
        self.scale_inputs = true;
        self
    }

    /// Adds an expert every token goes through.
    pub fn with_shared(mut self, shared: SharedExpert) -> Moe {
        self.shared = Some(Box::new(shared));
        self
    }

    /// Appends every array of the block to `out`.
    pub fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.router.collect_arrays(out);
        crate::linear::tensor_arrays(&self.gate_up.weight, out);
        crate::linear::tensor_arrays(&self.down.weight, out);
        if let Some(bias) = self
            .routing
            .as_ref()
            .and_then(|r| r.correction_bias.as_ref())
        {
            out.push(bias.clone());
        }
        out.extend(self.expert_scales.iter().cloned());
        if let Some(shared) = &self.shared {
            shared.mlp.collect_arrays(out);
            if let Some(gate) = &shared.gate {
                gate.collect_arrays(out);
            }
        }
    }

    /// The scores experts are chosen by under `routing`: biased, and outside the best groups
    /// `-inf`.
    fn refined_choice(&self, scores: &Array, routing: &RouterOptions) -> Result<Array> {
        let mut choice = match &routing.correction_bias {
            Some(bias) => scores.add(&bias.astype(Dtype::F32)?)?,
            None => scores.clone(),
        };
        if let Some((groups, best)) = routing.groups
            && best < groups
        {
            let (tokens, experts) = (choice.dim(0)?, choice.dim(1)?);
            let (groups, best) = (groups as i32, best as i32);
            let grouped = choice.reshape(&[tokens, groups, experts / groups])?;
            let group_scores = grouped.topk(2, -1)?.sum(&[-1], false)?;
            // The `best`-th largest group score, per token: groups below it are out.
            let threshold =
                group_scores
                    .sort(-1)?
                    .slice_axis(-1, groups - best, groups - best + 1)?;
            let kept = group_scores.greater_equal(&threshold)?.expand_dims(&[-1])?;
            choice = kept
                .select(&grouped, f32::NEG_INFINITY)?
                .reshape(&[tokens, experts])?;
        }
        Ok(choice)
    }

    /// Routes each token of `x: [..., dim]` to its top-k experts and mixes their outputs.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_routed_by(x, x)
    }

    /// Like [`Moe::forward`], with the router reading `route` (`[..., router dim]`, one per token
    /// of `x`) while the experts read `x`: Nemotron 3 routes on the hidden state and runs its
    /// experts in a narrower latent space.
    pub fn forward_routed_by(&self, x: &Array, route: &Array) -> Result<Array> {
        let shape = x.shape();
        let dim = *shape
            .last()
            .ok_or_else(|| Error::InvalidInput("MoE input is a scalar".into()))?;
        let tokens = x.reshape(&[-1, dim])?;
        let route_dim = route.dim(-1)?;
        let logits = self.router.forward(&route.reshape(&[-1, route_dim])?)?;
        let scores = match self.scoring {
            RouterScoring::Softmax => logits.astype(Dtype::F32)?.softmax(&[-1], true)?,
            RouterScoring::Sigmoid => logits.astype(Dtype::F32)?.sigmoid()?,
            // Ranked by the logits themselves; the softmax over the chosen comes below.
            RouterScoring::SoftmaxOverTopK => logits.astype(Dtype::F32)?,
        };
        let experts = scores.dim(-1)?;
        let k = self.top_k.min(experts);
        let choice = match &self.routing {
            Some(routing) => self.refined_choice(&scores, routing)?,
            None => scores.clone(),
        };
        // The k largest scores: partition the negated scores around position k − 1.
        let indices = choice
            .negative()?
            .argpartition(k - 1, -1)?
            .slice_axis(-1, 0, k)?;
        let mut weights = scores.take_along_axis(&indices, -1)?;
        if self.scoring == RouterScoring::SoftmaxOverTopK {
            weights = weights.softmax(&[-1], true)?;
        }
        if self.normalize_top_k {
            // The epsilon keeps sigmoid scores that all underflow from dividing by zero.
            weights = weights.divide(&weights.sum(&[-1], true)?.add(1e-20)?)?;
        }
        if let Some(routing) = &self.routing {
            weights = weights.multiply(routing.scale)?;
        }
        if let Some(scales) = &self.expert_scales {
            weights = weights.multiply(&scales.take(&indices, 0)?)?;
        }
        let weights = weights.astype(x.dtype())?;

        let expanded = if self.scale_inputs {
            // One input per chosen expert: [tokens, k, 1, dim].
            tokens
                .expand_dims(&[1, 2])?
                .multiply(&weights.expand_dims(&[2, 3])?)?
        } else {
            tokens.expand_dims(&[-2, -3])?
        };
        let mut both = self.gate_up.forward(&expanded, &indices)?;
        if let Some(biases) = &self.expert_biases {
            both = both.add(&biases.0.take(&indices, 0)?.expand_dims(&[-2])?)?;
        }
        let hidden = if self.ungated {
            self.activation.apply(&both)?
        } else {
            let parts = both.split_at(&[self.hidden], -1)?;
            let [gate, up] = <[Array; 2]>::try_from(parts)
                .map_err(|_| Error::Weights("gate/up split did not give two parts".into()))?;
            self.activation.gated(&gate, &up)?
        };
        let mut out = self.down.forward(&hidden, &indices)?.squeeze(&[-2])?;
        if let Some(biases) = &self.expert_biases {
            out = out.add(&biases.1.take(&indices, 0)?)?;
        }
        let mut mixed = if self.scale_inputs {
            out.sum(&[-2], false)?
        } else {
            out.multiply(&weights.expand_dims(&[-1])?)?
                .sum(&[-2], false)?
        };
        if let Some(shared) = &self.shared {
            let mut always = shared.mlp.forward(&tokens)?;
            if let Some(gate) = &shared.gate {
                always = always.multiply(&gate.forward(&tokens)?.sigmoid()?)?;
            }
            mixed = mixed.add(&always)?;
        }
        Ok(mixed.reshape(&shape)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(name: &str, shape: &[i32]) -> Weights {
        let array = Array::zeros(shape, Dtype::F32).unwrap();
        Weights::new([(name.to_string(), Tensor::Dense(array))], Dtype::F32)
    }

    #[test]
    fn a_stack_is_taken_when_its_shape_is_the_experts_and_refused_otherwise() {
        let name = "m.experts.gate_proj.weight";
        let mut weights = stored(name, &[4, 3, 8]);
        let stack = StackedExperts::load(&mut weights, "m.experts", "gate_proj", 4, 3, 8).unwrap();
        assert_eq!(stack.rows().unwrap(), 3);
        assert!(weights.unused().is_empty());

        let mut lying = stored(name, &[4, 3, 8]);
        let error = StackedExperts::load(&mut lying, "m.experts", "gate_proj", 5, 3, 8)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(name) && error.contains("[5, 3, 8]"),
            "{error}"
        );
    }
}
