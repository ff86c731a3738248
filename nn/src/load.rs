//! Opening a checkpoint (a safetensors directory or a GGUF file) into a ready model.

use std::path::Path;
use std::time::{Duration, Instant};

use mlx::Dtype;
use quant::{Checkpoint, Format};

use crate::arch::dflash::DFlash;
use crate::arch::gemma4_assistant::Gemma4Assistant;
use crate::config::limits;
use crate::context_extension::{Extension, extend_context};
use crate::model::{Assistant, LayerState, Model};
use crate::pipeline_parallel::PipelineStage;
use crate::registry::{build_model, default_dtype, describe};
use crate::tensor_parallel::TensorParallel;
use crate::weights::Weights;
use crate::weights::packed_kernel_form;
use crate::{Error, Result};

/// The default of [`LoadSettings::dequantize_below_bytes`]: 2 GiB, so SmolLM2-135M (0.5 GB
/// dense in f32) and Gemma 3 270M (1.1 GB) are dequantized on a CPU, Qwen3-0.6B (2.4 GB) is not.
pub const DEQUANTIZE_BELOW_BYTES: u64 = 2 << 30;

/// How [`load_with`] builds a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadSettings {
    /// The dtype the model computes in; the device default ([`default_dtype`]) when `None`.
    pub dtype: Option<Dtype>,
    /// On a machine without a GPU, a quantized checkpoint whose dense weights (its
    /// [`Loaded::parameters`] in the compute dtype) take at most this many bytes is dequantized
    /// at load ([`Weights::dequantized`]): MLX's CPU matrix products are faster dense, and a
    /// small model's dense copy fits. Ignored on a GPU.
    pub dequantize_below_bytes: u64,
    /// The context to serve, where it is longer than the one the model was trained for: the
    /// rotary embedding is stretched to it ([`extend_context`]). `None`: as trained.
    pub context: Option<usize>,
}

impl Default for LoadSettings {
    fn default() -> LoadSettings {
        LoadSettings {
            dtype: None,
            dequantize_below_bytes: DEQUANTIZE_BELOW_BYTES,
            context: None,
        }
    }
}

/// Whether dequantized models keep packed copies for decode steps ([`Weights::with_packed_copies`]).
/// `MLXKIT_PACKED_DECODE=0` turns them off, so a benchmark can measure the engine on exactly
/// the dense f32 weights another engine reads.
fn packed_decode_enabled() -> bool {
    std::env::var("MLXKIT_PACKED_DECODE").map_or(true, |v| v != "0")
}

/// Whether models that stay quantized on a CPU keep their k-quant matrices in the k-block form
/// ([`Weights::with_k_blocks`]). `MLXKIT_K_BLOCKS=0` keeps MLX's affine layout, so a benchmark
/// can measure one against the other on the same file.
fn k_blocks_enabled() -> bool {
    std::env::var("MLXKIT_K_BLOCKS").map_or(true, |v| v != "0")
}

/// A model built from a checkpoint, with what it was built from.
pub struct Loaded {
    /// The model, weights evaluated.
    pub model: Box<dyn Model>,
    /// The raw config (for a GGUF file, its metadata translated to transformers' names).
    pub config_json: serde_json::Value,
    /// How the rotary embedding was stretched for [`LoadSettings::context`].
    pub extension: Extension,
    /// The checkpoint's format.
    pub format: Format,
    /// The dtype the model computes in.
    pub dtype: Dtype,
    /// Parameters the checkpoint holds ([`Checkpoint::parameters`]: every tensor's elements,
    /// quantized ones counted unpacked); load refuses a tensor the model does not use, so these
    /// are the model's.
    pub parameters: u64,
    /// Wall time of the whole load.
    pub duration: Duration,
}

/// Loads the checkpoint at `path` computing in `dtype` (the device default when `None`), with
/// the other [`LoadSettings`] at their defaults.
pub fn load(path: &Path, dtype: Option<Dtype>) -> Result<Loaded> {
    load_with(
        path,
        LoadSettings {
            dtype,
            ..LoadSettings::default()
        },
    )
}

/// Loads the checkpoint at `path` as `settings` say. Every tensor the checkpoint holds must be
/// used by the architecture; a leftover tensor means a misread checkpoint and is an error
/// naming it.
pub fn load_with(path: &Path, settings: LoadSettings) -> Result<Loaded> {
    load_with_head(path, None, settings)
}

/// Which part of a model this process loads.
#[derive(Debug, Default)]
pub enum Split {
    /// All of it.
    #[default]
    Whole,
    /// Its rank's slice of every layer ([`crate::tensor_parallel`]).
    Tensor(mlx::distributed::Group),
    /// Its rank's range of layers ([`crate::pipeline_parallel`]).
    Pipeline(mlx::distributed::Group),
}

/// [`load_with`], with `head` (when given) attached: a multi-token-prediction head trained
/// apart from the checkpoint, one safetensors file of `mtp.*` tensors that carries its own
/// config ([`Checkpoint::open_self_described`]). The model's family must read such a head
/// (see [`Model::draft_head`]), and every tensor must fit the model's shapes; either refusal
/// names what does not fit.
pub fn load_with_head(path: &Path, head: Option<&Path>, settings: LoadSettings) -> Result<Loaded> {
    load_split(path, head, settings, Split::Whole)
}

/// [`load_with_head`], this process reading only its `split` of the model. A family that
/// cannot split as asked is refused by name rather than loaded whole: each rank would then
/// compute the whole model and the others would wait on it forever.
pub fn load_split(
    path: &Path,
    head: Option<&Path>,
    settings: LoadSettings,
    split: Split,
) -> Result<Loaded> {
    let start = Instant::now();
    let checkpoint = Checkpoint::open(path)?;
    let mut config_json = checkpoint.config().clone();
    // Refuses an unsupported or malformed config before any tensor is read.
    let trained = describe(&config_json)?.context_length;
    let extension = match settings.context {
        Some(tokens) => extend_context(&mut config_json, trained, tokens),
        None => Extension::Within,
    };
    let dtype = match settings.dtype {
        Some(d) => d,
        None => default_dtype()?,
    };
    let mut parameters = checkpoint.parameters()?;
    let mut head_tensors = Vec::new();
    if let Some(head) = head {
        let head = Checkpoint::open_self_described(head)?;
        check_head_fits(head.config(), &config_json)?;
        for (name, tensor) in checkpoint_tensors(&head)? {
            if !name.starts_with("mtp.") {
                return Err(Error::Weights(format!(
                    "the attached head holds `{name}`, which is not a head tensor (`mtp.*`)"
                )));
            }
            if checkpoint.contains(&name) {
                return Err(Error::Weights(format!(
                    "the checkpoint has a head of its own (`{name}`); it takes no attached one"
                )));
            }
            head_tensors.push((name, tensor));
        }
        parameters = parameters.saturating_add(head.parameters()?);
    }
    let dense_bytes = parameters.saturating_mul(dtype.size_of() as u64);
    let on_cpu = !mlx::gpu_available()?;
    let dequantize = on_cpu && dense_bytes <= settings.dequantize_below_bytes;
    let packed_copies = dequantize && packed_decode_enabled();
    // The packed kernel multiplies f32 activations by f32 scales; in another dtype the forms
    // would reach MLX's own kernels, which take no 16-element groups.
    let packed_16 = quant::PACKED_16.has_packed_cpu_matvec() && dtype == Dtype::F32;
    // A pipeline stage reads only its own layers' tensors from the checkpoint.
    let stage = match &split {
        Split::Pipeline(group) => {
            let layers = describe(&config_json)?.num_layers();
            Some(PipelineStage::new(group.try_clone()?, layers)?)
        }
        _ => None,
    };
    let wanted = |name: &str| {
        stage
            .as_ref()
            .is_none_or(|s| decoder_layer_of(name).is_none_or(|layer| s.holds(layer)))
    };
    let stays_packed = on_cpu && !dequantize && packed_16;
    let tensors = if stays_packed {
        packed_for_cpu(&checkpoint, wanted)?
    } else {
        checkpoint_tensors_where(&checkpoint, wanted)?
    };
    let mut packed_forms = Vec::new();
    if packed_copies {
        for (name, _) in &tensors {
            if let Some(form) = checkpoint.packed_16(name)? {
                packed_forms.push((name.clone(), form));
            }
        }
    }
    let mut weights = Weights::new(tensors.into_iter().chain(head_tensors), dtype)
        .dequantized(dequantize)
        .with_packed_copies(packed_copies)
        .with_packed_forms(packed_forms)
        .with_k_blocks(stays_packed && k_blocks_enabled());
    match (split, &stage) {
        (Split::Tensor(group), _) => {
            weights = weights.with_tensor_parallel(TensorParallel::new(group)?);
        }
        (_, Some(stage)) => weights = weights.with_pipeline_stage(stage.clone()),
        _ => {}
    }
    let model = match build_model(&config_json, &mut weights) {
        Ok(model) => model,
        // A family that does not read a stage's layers alone misses the others' tensors.
        Err(e) if stage.is_some() => {
            return Err(Error::Config(format!(
                "`{}` models cannot be split across processes by pipeline parallelism yet ({e})",
                describe(&config_json)?.model_type
            )));
        }
        Err(e) => return Err(e),
    };
    check_split(&config_json, model.as_ref(), &weights, stage.as_ref())?;
    if head.is_some() && model.draft_head().is_none() {
        return Err(Error::Weights(format!(
            "`{}` models do not read a multi-token-prediction head",
            describe(&config_json)?.model_type
        )));
    }
    if let Some(unused) = weights.unused().first() {
        return Err(Error::Weights(format!(
            "the checkpoint holds `{unused}`, which the architecture does not use"
        )));
    }
    Ok(Loaded {
        model,
        config_json,
        extension,
        format: checkpoint.format(),
        dtype,
        parameters,
        duration: start.elapsed(),
    })
}

/// Refuses a model whose family ignored the split it was asked for: one that split no
/// projection across the tensor-parallel group, or kept caches for another stage's layers.
fn check_split(
    config: &serde_json::Value,
    model: &dyn Model,
    weights: &Weights,
    stage: Option<&PipelineStage>,
) -> Result<()> {
    let refuse = |how: &str| {
        Err(Error::Config(format!(
            "`{}` models cannot be split across processes by {how} yet",
            describe(config)?.model_type
        )))
    };
    if weights.tensor_parallel().is_some() && !weights.was_split() {
        return refuse("tensor parallelism");
    }
    if let Some(stage) = stage {
        let foreign_state = model
            .spec()
            .layers
            .iter()
            .enumerate()
            .any(|(i, state)| !stage.holds(i) && !matches!(state, LayerState::Stateless));
        if foreign_state {
            return refuse("pipeline parallelism");
        }
    }
    Ok(())
}

/// Loads the Gemma 4 assistant checkpoint at `path` (`model_type: gemma4_assistant`) to draft
/// for `target`, the model built from `target_config`, computing in `dtype` as the target
/// does. Every tensor must be used, and the assistant must fit the target (its width,
/// vocabulary and the key/value shapes it reads: [`Gemma4Assistant::new`]); either refusal
/// names what does not. Quantized weights are dequantized on a CPU as [`load_with`] does.
pub fn load_assistant(
    path: &Path,
    target: &dyn Model,
    target_config: &serde_json::Value,
    dtype: Dtype,
) -> Result<Box<dyn Assistant>> {
    let checkpoint = Checkpoint::open(path)?;
    let dense_bytes = checkpoint
        .parameters()?
        .saturating_mul(dtype.size_of() as u64);
    let dequantize = !mlx::gpu_available()? && dense_bytes <= DEQUANTIZE_BELOW_BYTES;
    let mut weights = Weights::new(checkpoint_tensors(&checkpoint)?, dtype).dequantized(dequantize);
    let assistant = Gemma4Assistant::new(checkpoint.config(), &mut weights, target, target_config)?;
    if let Some(unused) = weights.unused().first() {
        return Err(Error::Weights(format!(
            "the assistant holds `{unused}`, which its architecture does not use"
        )));
    }
    mlx::eval(&assistant.parameters())?;
    Ok(Box::new(assistant))
}

/// Loads the DFlash block drafter at `path` for the target built from `target_config`,
/// computing in `dtype` as the target does; every tensor must be used and the drafter must fit
/// the target ([`DFlash::new`]). Quantized weights are dequantized (its keys and values are
/// fused at load).
pub fn load_dflash(path: &Path, target_config: &serde_json::Value, dtype: Dtype) -> Result<DFlash> {
    let checkpoint = Checkpoint::open(path)?;
    let mut weights = Weights::new(checkpoint_tensors(&checkpoint)?, dtype).dequantized(true);
    let drafter = DFlash::new(checkpoint.config(), &mut weights, target_config)?;
    if let Some(unused) = weights.unused().first() {
        return Err(Error::Weights(format!(
            "the DFlash drafter holds `{unused}`, which its architecture does not use"
        )));
    }
    mlx::eval(&drafter.parameters())?;
    Ok(drafter)
}

/// Refuses a head whose config names another width or vocabulary than the model's: it was
/// trained for another model, and would draft nonsense where its shapes happen to fit.
fn check_head_fits(head: &serde_json::Value, model: &serde_json::Value) -> Result<()> {
    let fields = crate::config::Fields::text_section(model);
    let theirs = [
        (
            "hidden_size",
            fields.required_bounded("hidden_size", limits::HIDDEN)?,
        ),
        (
            "vocab_size",
            fields.required_bounded("vocab_size", limits::VOCAB)?,
        ),
    ];
    for (key, model_value) in theirs {
        let Some(head_value) = head.get(key).and_then(serde_json::Value::as_u64) else {
            return Err(Error::Config(format!(
                "the attached head's config does not say its `{key}`"
            )));
        };
        if usize::try_from(head_value) != Ok(model_value) {
            return Err(Error::Config(format!(
                "the attached head was trained for a `{key}` of {head_value}; \
                 this model's is {model_value}"
            )));
        }
    }
    Ok(())
}

/// The checkpoint's tensors for a model that stays quantized on a CPU, each in a form the
/// packed kernel multiplies at any number of rows: one with a 16-element packed form (GGUF's
/// Q2_K, Q3_K and Q6_K, see [`Checkpoint::packed_16`]) in that form rather than dense, and a
/// matrix of fewer bits than the kernel takes (GGUF's Q5 types, MLX's 5- and 6-bit ones)
/// widened to 8 bits, exactly.
///
/// Dense, the 16-element types were f32: four bytes per weight read every token where the
/// packed form reads one. A Q4_K_M file keeps its token table (the tied head), its value
/// projections and half its down projections in Q6_K, so Llama 3.2 1B decoded a 1 GB f32 head
/// per token (6 tok/s, 0.35x llama.cpp on the same file). Left at 5 bits, a matrix went
/// through MLX's own CPU kernel, a scalar loop.
fn packed_for_cpu(
    checkpoint: &Checkpoint,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<(String, quant::Tensor)>> {
    checkpoint
        .names()
        .into_iter()
        .filter(|name| wanted(name))
        .map(|name| {
            let tensor = match checkpoint.packed_16(&name)? {
                Some(form) => quant::Tensor::Quantized(form),
                None => match checkpoint.tensor(&name)? {
                    quant::Tensor::Quantized(q) => match packed_kernel_form(&q)? {
                        Some(form) => quant::Tensor::Quantized(form),
                        None => quant::Tensor::Quantized(q),
                    },
                    dense => dense,
                },
            };
            Ok((name, tensor))
        })
        .collect()
}

/// Every tensor `checkpoint` holds, by name.
pub(crate) fn checkpoint_tensors(checkpoint: &Checkpoint) -> Result<Vec<(String, quant::Tensor)>> {
    checkpoint_tensors_where(checkpoint, |_| true)
}

/// The tensors `checkpoint` holds whose names are `wanted`, by name; the others are not read.
fn checkpoint_tensors_where(
    checkpoint: &Checkpoint,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<(String, quant::Tensor)>> {
    checkpoint
        .names()
        .into_iter()
        .filter(|name| wanted(name))
        .map(|name| {
            let tensor = checkpoint.tensor(&name)?;
            Ok((name, tensor))
        })
        .collect()
}

/// The decoder layer a tensor belongs to, by its transformers name: `N` in `model.layers.N.…`
/// (also under `language_model.`); `None` for anything else (the table, the head, a drafter
/// head's `mtp.layers.N`, a vision tower's `encoder.layers.N`).
fn decoder_layer_of(name: &str) -> Option<usize> {
    let parts: Vec<&str> = name.split('.').collect();
    parts.windows(3).find_map(|w| match w {
        [owner, "layers", index] if matches!(*owner, "model" | "language_model") => {
            index.parse().ok()
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::decoder_layer_of;

    #[test]
    fn a_tensor_names_its_decoder_layer_and_nothing_else_does() {
        assert_eq!(
            decoder_layer_of("model.layers.3.mlp.up_proj.weight"),
            Some(3)
        );
        assert_eq!(
            decoder_layer_of("language_model.model.layers.12.self_attn.q_proj.weight"),
            Some(12)
        );
        assert_eq!(
            decoder_layer_of("model.language_model.layers.0.input_layernorm.weight"),
            Some(0)
        );
        for other in [
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.norm.weight",
            "mtp.layers.0.mlp.up_proj.weight",
            "vision_tower.vision_model.encoder.layers.2.mlp.fc1.weight",
            "model.layers.x.mlp.weight",
        ] {
            assert_eq!(decoder_layer_of(other), None, "{other}");
        }
    }
}
