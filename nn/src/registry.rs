//! Picking an architecture by the names checkpoints use for it.
//!
//! Each family reads its own hyperparameters from the checkpoint's `config.json`: the registry
//! hands it the JSON and gets back a [`ModelSpec`] (to describe a checkpoint without loading
//! it) or a built [`Model`].
//!
//! A family in this crate is one file in `arch/`, its `mod` line and one [`Architecture`] in
//! the list below (and, to load it from GGUF, its name in `quant`'s `gguf_config.rs`). A family
//! defined elsewhere (a research variant, a test) is added at run time with [`register`].

use std::sync::RwLock;

use mlx::Dtype;
use serde_json::Value;

use crate::arch::{
    deepseek_v3, gemma2, gemma3, gemma3_multimodal, gemma4, gpt_oss, granitemoehybrid, lfm2, llama,
    llama4, llava, mistral, nemotron_h, olmo2, phi3, qwen2, qwen2_5_vl, qwen2_audio, qwen3,
    qwen3_5, qwen3_moe,
};
use crate::config::Fields;
pub use crate::config::model_type;
use crate::model::{AudioInput, ImageInput, Model, ModelSpec};
use crate::weights::Weights;
use crate::{Error, Result};

/// One family: the names configs give it, how to read what it is, and how to build it.
/// Weights follow transformers' names and conventions whatever the checkpoint's format: `quant`
/// undoes llama.cpp's Q/K row permutation and Gemma norm offset.
#[derive(Debug, Clone, Copy)]
pub struct Architecture {
    /// The names configs give it: `model_type`, `architectures[0]`, GGUF
    /// `general.architecture`.
    pub names: &'static [&'static str],
    /// What the checkpoint with this `config.json` is, read without loading a weight.
    pub describe: fn(&Value) -> Result<ModelSpec>,
    /// The model, built from its `config.json` and its weights.
    pub build: fn(&Value, &mut Weights) -> Result<Box<dyn Model>>,
}

/// Families added with [`register`], after the built-in ones. Leaked, so lookups hand out
/// `'static` references as they do for the built-in list; a process registers a handful.
static REGISTERED: RwLock<Vec<&'static Architecture>> = RwLock::new(Vec::new());

/// Adds `architecture` for the rest of the process: [`describe`], [`build_model`] and
/// [`crate::load::load`] then pick it by any of its names. Fails, registering nothing, when
/// one of its names is taken (by a built-in family or an earlier registration).
pub fn register(architecture: Architecture) -> Result<()> {
    let mut registered = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    let taken = |name: &str| {
        ARCHITECTURES
            .iter()
            .chain(registered.iter().copied())
            .any(|a| a.names.contains(&name))
    };
    if architecture.names.is_empty() {
        return Err(Error::Config("an architecture needs a name".into()));
    }
    if let Some(name) = architecture.names.iter().find(|name| taken(name)) {
        return Err(Error::Config(format!(
            "an architecture is already registered as `{name}`"
        )));
    }
    registered.push(Box::leak(Box::new(architecture)));
    Ok(())
}

/// Architecture names as configs spell them (`model_type`, `architectures[0]`, GGUF
/// `general.architecture`).
const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        names: &["llama", "LlamaForCausalLM"],
        describe: |config| Ok(llama::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(llama::Llama::new(
                llama::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "qwen2",
            "Qwen2ForCausalLM",
            "qwen2_audio",
            "Qwen2AudioForConditionalGeneration",
        ],
        describe: |config| Ok(qwen2::Config::from_json(config)?.spec()),
        // A checkpoint with its audio encoder reads audio; the text model alone otherwise.
        build: |config, weights| match qwen2_audio(config)? {
            Some(audio) => Ok(Box::new(qwen2_audio::Qwen2Audio::new(audio, weights)?)),
            None => Ok(Box::new(qwen2::Qwen2::new(
                qwen2::Config::from_json(config)?,
                weights,
            )?)),
        },
    },
    Architecture {
        names: &[
            "qwen2_5_vl",
            "qwen2_5_vl_text",
            "Qwen2_5_VLForConditionalGeneration",
        ],
        describe: |config| Ok(qwen2_5_vl::Config::from_json(config)?.text.spec()),
        build: |config, weights| {
            Ok(Box::new(qwen2_5_vl::Qwen25Vl::new(
                qwen2_5_vl::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["qwen3", "Qwen3ForCausalLM"],
        describe: |config| Ok(qwen3::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(qwen3::Qwen3::new(
                qwen3::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["qwen3_moe", "qwen3moe", "Qwen3MoeForCausalLM"],
        describe: |config| Ok(qwen3_moe::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(qwen3_moe::Qwen3Moe::new(
                qwen3_moe::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "gemma3",
            "gemma3_text",
            "Gemma3ForCausalLM",
            "Gemma3ForConditionalGeneration",
        ],
        describe: |config| Ok(gemma3::Config::from_json(config)?.spec()),
        // A checkpoint with its vision tower reads images; the text model alone otherwise.
        build: |config, weights| match gemma3_vision(config)? {
            Some(multimodal) => Ok(Box::new(gemma3_multimodal::Gemma3Multimodal::new(
                multimodal, weights,
            )?)),
            None => Ok(Box::new(gemma3::Gemma3::new(
                gemma3::Config::from_json(config)?,
                weights,
            )?)),
        },
    },
    Architecture {
        names: &[
            "qwen3_5",
            "qwen3_5_text",
            "Qwen3_5ForCausalLM",
            "Qwen3_5ForConditionalGeneration",
            "qwen3_5_moe",
            "qwen3_5_moe_text",
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
            "qwen3_next",
            "Qwen3NextForCausalLM",
        ],
        describe: |config| Ok(qwen3_5::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(qwen3_5::Qwen3_5::new(
                qwen3_5::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "mistral",
            "MistralForCausalLM",
            "mistral3",
            "Mistral3ForConditionalGeneration",
            "mixtral",
            "MixtralForCausalLM",
        ],
        describe: |config| Ok(mistral::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(mistral::Mistral::new(
                mistral::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["lfm2", "Lfm2ForCausalLM"],
        describe: |config| Ok(lfm2::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(lfm2::Lfm2::new(
                lfm2::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            "glm4_moe_lite",
            "Glm4MoeLiteForCausalLM",
        ],
        describe: |config| Ok(deepseek_v3::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(deepseek_v3::DeepseekV3::new(
                deepseek_v3::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["gpt_oss", "GptOssForCausalLM"],
        describe: |config| Ok(gpt_oss::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(gpt_oss::GptOss::new(
                gpt_oss::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["nemotron_h", "NemotronHForCausalLM"],
        describe: |config| Ok(nemotron_h::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(nemotron_h::NemotronH::new(
                nemotron_h::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["granitemoehybrid", "GraniteMoeHybridForCausalLM"],
        describe: |config| Ok(granitemoehybrid::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(granitemoehybrid::GraniteMoeHybrid::new(
                granitemoehybrid::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "llama4",
            "llama4_text",
            "Llama4ForCausalLM",
            "Llama4ForConditionalGeneration",
        ],
        describe: |config| Ok(llama4::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(llama4::Llama4::new(
                llama4::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["gemma2", "Gemma2ForCausalLM"],
        describe: |config| Ok(gemma2::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(gemma2::Gemma2::new(
                gemma2::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &[
            "gemma4_text",
            "gemma4",
            "Gemma4ForCausalLM",
            "Gemma4ForConditionalGeneration",
        ],
        describe: |config| Ok(gemma4::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(gemma4::Gemma4::new(
                gemma4::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["olmo2", "Olmo2ForCausalLM"],
        describe: |config| Ok(olmo2::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(olmo2::Olmo2::new(
                olmo2::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["phi3", "Phi3ForCausalLM"],
        describe: |config| Ok(phi3::Config::from_json(config)?.spec()),
        build: |config, weights| {
            Ok(Box::new(phi3::Phi3::new(
                phi3::Config::from_json(config)?,
                weights,
            )?))
        },
    },
    Architecture {
        names: &["llava", "LlavaForConditionalGeneration"],
        // The text model's spec: the tower keeps no state per sequence.
        describe: |config| describe(&llava::Config::from_json(config)?.text_config),
        build: |config, weights| {
            Ok(Box::new(llava::Llava::new(
                llava::Config::from_json(config)?,
                weights,
                build_text_model,
            )?))
        },
    },
];

/// Whether an architecture is registered under `name`.
pub fn is_supported(name: &str) -> bool {
    find(name).is_some()
}

/// The names of every supported architecture.
pub fn supported() -> Vec<&'static str> {
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    ARCHITECTURES
        .iter()
        .chain(registered.iter().copied())
        .filter_map(|a| a.names.first().copied())
        .collect()
}

fn find(name: &str) -> Option<&'static Architecture> {
    if let Some(builtin) = ARCHITECTURES.iter().find(|a| a.names.contains(&name)) {
        return Some(builtin);
    }
    let registered = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    registered.iter().copied().find(|a| a.names.contains(&name))
}

fn architecture_of(config: &Value) -> Result<&'static Architecture> {
    // A family built around another's text model (LLaVA) names itself at the top level and
    // that model in `text_config`; where both are registered the top level decides.
    if let Some(wrapper) = (Fields { object: config }).str("model_type").and_then(find) {
        return Ok(wrapper);
    }
    let name = model_type(config)?;
    find(&name).ok_or(Error::UnsupportedArchitecture(name))
}

/// What the checkpoint with this `config.json` is, read without loading a weight; a config
/// missing a field that changes the numbers, or sized beyond any real model, is an error naming
/// the field.
pub fn describe(config: &Value) -> Result<ModelSpec> {
    (architecture_of(config)?.describe)(config)
}

/// The multimodal config of a Gemma 3 checkpoint that carries its vision tower
/// (`vision_config`), `None` for a text-only one.
fn gemma3_vision(config: &Value) -> Result<Option<gemma3_multimodal::Config>> {
    match config.get("vision_config") {
        Some(Value::Object(_)) => Ok(Some(gemma3_multimodal::Config::from_json(config)?)),
        _ => Ok(None),
    }
}

/// What images the model this config describes reads, read without loading a weight: `None`
/// for a text model (and for an architecture whose vision side mlxkit does not build, whatever
/// its config holds). [`build_model`] builds the image side exactly when this is `Some`.
pub fn image_input(config: &Value) -> Result<Option<ImageInput>> {
    let architecture = architecture_of(config)?;
    if architecture.names.contains(&"gemma3") {
        return Ok(gemma3_vision(config)?.map(|c| c.image_input()));
    }
    if architecture.names.contains(&"llava") {
        return Ok(Some(llava::Config::from_json(config)?.image_input()));
    }
    if architecture.names.contains(&"qwen2_5_vl") {
        return Ok(Some(qwen2_5_vl::Config::from_json(config)?.image_input()));
    }
    Ok(None)
}

/// The audio-language config of a Qwen2 checkpoint that carries its audio encoder
/// (`audio_config`: Qwen2-Audio), `None` for a text-only one.
fn qwen2_audio(config: &Value) -> Result<Option<qwen2_audio::Config>> {
    match config.get("audio_config") {
        Some(Value::Object(_)) => Ok(Some(qwen2_audio::Config::from_json(config)?)),
        _ => Ok(None),
    }
}

/// What audio the model this config describes reads, read without loading a weight: `None`
/// for a model without an audio side mlxkit builds. [`build_model`] builds the audio side
/// exactly when this is `Some`.
pub fn audio_input(config: &Value) -> Result<Option<AudioInput>> {
    let architecture = architecture_of(config)?;
    if architecture.names.contains(&"qwen2") {
        return Ok(qwen2_audio(config)?.map(|c| c.audio_input()));
    }
    Ok(None)
}

/// The compute dtype for the default device: bf16 on a GPU, f32 on the CPU (where MLX's bf16
/// kernels are several times slower).
pub fn default_dtype() -> Result<Dtype> {
    Ok(if mlx::gpu_available()? {
        Dtype::Bf16
    } else {
        Dtype::F32
    })
}

/// The text model a multimodal family wraps, from its text config as a text checkpoint of
/// that family would have it, weights not yet evaluated (the whole model's are, once built).
/// A wrapper is handed this function where the registry builds it ([`llava::Llava::new`]), so
/// that no family file imports the registry.
pub fn build_text_model(config: &Value, weights: &mut Weights) -> Result<Box<dyn Model>> {
    (architecture_of(config)?.build)(config, weights)
}

/// Builds the model `config` (a checkpoint's `config.json`) describes from `weights`,
/// evaluates every weight (so folds such as fused gate/up projections are computed once, now)
/// and releases MLX's buffer pool.
pub fn build_model(config: &Value, weights: &mut Weights) -> Result<Box<dyn Model>> {
    let model = (architecture_of(config)?.build)(config, weights)?;
    mlx::eval(&model.parameters())?;
    mlx::memory::clear_cache()?;
    Ok(model)
}
