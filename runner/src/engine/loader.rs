//! Loading a stored model: weights onto the MLX worker, vocabulary and chat template beside.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use grammar::GrammarCompiler;

use tokenizer::{ChatTemplate, Family, Tokenizer};

use crate::engine::encoded_media::EncodedIds;
use crate::engine::loaded::{LoadedModel, LoopConfig};
use crate::engine::step::StepError;
use crate::model_name::ModelName;
use crate::store::{Format, Manifest};

/// What went wrong while loading.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The weights could not be read or built.
    #[error("loading `{name}`: {source}")]
    Model {
        /// The model.
        name: String,
        /// Why.
        source: nn::Error,
    },
    /// The vocabulary or template could not be read.
    #[error("loading the tokenizer of `{name}`: {source}")]
    Tokenizer {
        /// The model.
        name: String,
        /// Why.
        source: tokenizer::Error,
    },
    /// The model's files are not as its manifest says.
    #[error("model `{0}` has no weights file")]
    NoWeights(String),
    /// The draft model cannot draft for this target.
    #[error("draft model `{draft}` for `{target}`: {reason}")]
    Draft {
        /// The draft model.
        draft: String,
        /// The target.
        target: String,
        /// Why.
        reason: String,
    },
}

/// A draft model to load beside the target, its vocabulary already found to be the target's
/// ([`check_draft_vocabulary`], which the scheduler runs before it unloads anything).
#[derive(Debug, Clone)]
pub struct DraftSource {
    /// Its name in the store.
    pub name: ModelName,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its materialized files.
    pub dir: std::path::PathBuf,
    /// Whether the target fails to load without it (a Modelfile `DRAFT` or a request naming
    /// it); a server-wide default draft is skipped, with a warning, for targets it cannot
    /// draft for.
    pub required: bool,
    /// Whether requests that leave the drafter to the server draft with it (a Modelfile
    /// `DRAFT`, the server's `--draft`), not only requests naming it.
    pub by_default: bool,
}

/// Everything request handlers need to know about the loaded model. Shared across threads;
/// the model itself stays on the MLX worker.
pub struct ModelInfo {
    /// Its name.
    pub name: ModelName,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its vocabulary.
    pub tokenizer: Tokenizer,
    /// Its chat template (the manifest's override, the checkpoint's, or the family fallback).
    pub template: ChatTemplate,
    /// The output-parser family (thinking and tool-call syntax), when recognized.
    pub family: Option<Family>,
    /// The context length requests are held to.
    pub context_length: usize,
    /// [`Tokenizer::longest_token_bytes`], for refusing oversize prompts before tokenizing.
    pub longest_token_bytes: usize,
    /// The transformers-style config (for `show`).
    pub config: serde_json::Value,
    /// Compiles structured-output constraints for this vocabulary; built on first use
    /// (≈0.2 s), or why it cannot be.
    pub grammar_compiler: OnceLock<Result<GrammarCompiler, String>>,
    /// The draft model loaded beside it, if any.
    pub draft: Option<ModelName>,
    /// How images enter its prompts, when it reads images.
    pub vision: Option<ImagePrompt>,
    /// How audio enters its prompts, when it reads audio.
    pub audio: Option<AudioPrompt>,
    /// The images and audio segments whose encoded features the engine keeps: an image among
    /// them is sent to the engine undecoded.
    pub encoded: Arc<EncodedIds>,
}

/// How a model that reads audio takes a clip in a prompt: cut into segments of at most the
/// encoder's window, each turned into log-mel features and laid out as `start`, its audio
/// tokens, `end` (Qwen2-Audio's processor writes `<|audio_bos|>`, one `<|AUDIO|>` per encoded
/// row, `<|audio_eos|>`).
#[derive(Debug, Clone)]
pub struct AudioPrompt {
    /// The encoder's input and the audio token.
    pub input: nn::AudioInput,
    /// The feature extractor the encoder was trained behind, its window the encoder's.
    pub features: media::LogMelConfig,
    /// Audio tokens a segment filling `n` frames takes, for each `n` up to the window: the
    /// model's count ([`nn::Audio::audio_tokens`]) read once at load, since prompts are
    /// prepared away from the model.
    pub tokens_for_frames: Vec<usize>,
    /// The text of the marker before a segment's audio tokens.
    pub start: String,
    /// The text of one audio token.
    pub audio: String,
    /// The text of the marker after them.
    pub end: String,
}

impl AudioPrompt {
    /// The marker texts Qwen2-Audio's processor puts around a clip's audio tokens (its
    /// `audio_bos_token` and `audio_eos_token`); the only audio family mlxkit builds.
    const MARKERS: (&'static str, &'static str) = ("<|audio_bos|>", "<|audio_eos|>");

    /// The prompt side of `audio` for a model with `tokenizer`; fails when the vocabulary has
    /// no text for the audio token or the markers (without them two segments' tokens would
    /// run together), or when the encoder's window is not a whole number of seconds of 10 ms
    /// frames (no Whisper extractor makes it).
    pub fn new(audio: &dyn nn::Audio, tokenizer: &Tokenizer) -> Result<AudioPrompt, String> {
        let input = audio.audio_input();
        let token = tokenizer
            .id_to_token(input.audio_token)
            .filter(|text| tokenizer.token_to_id(text) == Some(input.audio_token))
            .ok_or_else(|| {
                format!(
                    "the vocabulary has no token {} (the audio token)",
                    input.audio_token
                )
            })?;
        let marker = |text: &str| -> Result<String, String> {
            tokenizer
                .token_to_id(text)
                .map(|_| text.to_string())
                .ok_or_else(|| format!("the vocabulary has no `{text}` to mark audio"))
        };
        let (start, end) = (marker(Self::MARKERS.0)?, marker(Self::MARKERS.1)?);
        let mut features = media::LogMelConfig::whisper(input.num_mel_bins);
        let hop = features.hop_length;
        let per_second = features.sampling_rate as usize / hop;
        if input.max_frames == 0 || !input.max_frames.is_multiple_of(per_second) {
            return Err(format!(
                "an audio window of {} frames is not a whole number of seconds",
                input.max_frames
            ));
        }
        features.chunk_length = input.max_frames / per_second;
        if features.frames() != input.max_frames {
            return Err(format!(
                "log-mel features of {} frames for an encoder window of {}",
                features.frames(),
                input.max_frames
            ));
        }
        features.check().map_err(|e| e.to_string())?;
        let tokens_for_frames = (0..=input.max_frames)
            .map(|n| audio.audio_tokens(n))
            .collect();
        Ok(AudioPrompt {
            input,
            features,
            tokens_for_frames,
            start,
            audio: token,
            end,
        })
    }

    /// Seconds of audio one segment holds at most: the encoder's window.
    pub fn window_seconds(&self) -> f64 {
        self.features.chunk_length as f64
    }
}

/// How a model that reads images takes them in a prompt.
#[derive(Debug, Clone)]
pub struct ImagePrompt {
    /// The encoder's input and the image tokens.
    pub input: nn::ImageInput,
    /// How each image is laid out in the prompt and preprocessed.
    pub layout: ImageLayout,
}

/// How an image's place in a rendered prompt becomes tokens, and its pixels encoder input.
#[derive(Debug, Clone)]
pub enum ImageLayout {
    /// Every image takes the same tokens (Gemma 3, LLaVA).
    Fixed {
        /// The preprocessing its encoder expects.
        processor: media::ImageProcessorConfig,
        /// The text an image's place becomes. With start and end tokens it is Gemma 3's
        /// processor layout, `\n\n<start_of_image>`, `tokens_per_image` image tokens,
        /// `<end_of_image>\n\n` (transformers 5.24's `Gemma3Processor.full_image_sequence`,
        /// which replaces the `<start_of_image>` the chat template writes for an image);
        /// without them it is the image tokens alone, as `LlavaProcessor` expands each
        /// `<image>`.
        expansion: String,
        /// Gemma 3's pan and scan, when the checkpoint's `preprocessor_config.json` turns it
        /// on (`do_pan_and_scan`): a long image also shows as crops, each laid out as a whole
        /// image after the original ([`ImageLayout::with_crops`]).
        pan_and_scan: Option<media::PanAndScan>,
    },
    /// An image takes as many tokens as its grid after the processor's resize (Qwen2.5-VL):
    /// `start`, that many `image`, `end`, as `Qwen2_5_VLProcessor` expands the
    /// `<|vision_start|><|image_pad|><|vision_end|>` its chat template writes for an image.
    Patches {
        /// The processor, its sizes the encoder's and its pixel budget the checkpoint's.
        processor: media::PatchProcessorConfig,
        /// The text of the start marker (empty without one).
        start: String,
        /// The text of one image token.
        image: String,
        /// The text of the end marker (empty without one).
        end: String,
    },
}

impl ImagePrompt {
    /// The prompt side of `vision` for a model with `tokenizer` and, for a dynamic-resolution
    /// model, the checkpoint's `preprocessor_config.json` (`None`: the processor's defaults);
    /// fails when the vocabulary has no text for the image tokens or its markers (a prompt
    /// could not hold them), or when the processor's config does not fit the encoder.
    pub fn new(
        vision: &dyn nn::Vision,
        preprocessor: Option<&serde_json::Value>,
        tokenizer: &Tokenizer,
    ) -> Result<ImagePrompt, String> {
        let input = vision.image_input();
        let text = |id: u32, what: &str| -> Result<String, String> {
            tokenizer
                .id_to_token(id)
                .filter(|text| tokenizer.token_to_id(text) == Some(id))
                .ok_or_else(|| format!("the vocabulary has no token {id} ({what})"))
        };
        let image = text(input.image_token, "the image token")?;
        let start = input
            .start_token
            .map(|id| text(id, "the start of an image"))
            .transpose()?;
        let end = input
            .end_token
            .map(|id| text(id, "the end of an image"))
            .transpose()?;
        let mut expansion = String::new();
        if let Some(start) = &start {
            expansion.push_str("\n\n");
            expansion.push_str(start);
        }
        for _ in 0..input.tokens_per_image {
            expansion.push_str(&image);
        }
        if let Some(end) = &end {
            expansion.push_str(end);
            expansion.push_str("\n\n");
        }
        let size = u32::try_from(input.image_size)
            .map_err(|_| format!("images of {} pixels a side", input.image_size))?;
        // The processor the model's encoder was trained behind, at its size.
        let processor = match input.preprocessing {
            nn::ImagePreprocessing::Siglip => media::ImageProcessorConfig::siglip(size),
            nn::ImagePreprocessing::Clip => media::ImageProcessorConfig::clip(size),
            nn::ImagePreprocessing::Patches => {
                let patches = vision
                    .patch_input()
                    .ok_or("a dynamic-resolution model without patch sizes")?;
                return Ok(ImagePrompt {
                    input,
                    layout: ImageLayout::Patches {
                        processor: patch_processor(patches, preprocessor)?,
                        start: start.unwrap_or_default(),
                        image,
                        end: end.unwrap_or_default(),
                    },
                });
            }
        };
        // Only Gemma 3's processor cuts crops, around its start and end markers.
        let pan_and_scan = match (&start, &end) {
            (Some(_), Some(_)) => pan_and_scan(preprocessor)?,
            _ => None,
        };
        Ok(ImagePrompt {
            input,
            layout: ImageLayout::Fixed {
                processor,
                expansion,
                pan_and_scan,
            },
        })
    }
}

impl ImageLayout {
    /// The text of an image shown whole and as `crops` crops, `expansion` each, as
    /// transformers 5.24's `Gemma3Processor` writes it (the image alone without crops).
    pub fn with_crops(expansion: &str, crops: usize) -> String {
        if crops == 0 {
            return expansion.to_string();
        }
        format!(
            "Here is the original image {expansion} and here are some crops to help you see \
             better {}",
            vec![expansion; crops].join(" ")
        )
    }
}

/// The most crops a checkpoint may ask an image to be cut into.
const MAX_PAN_AND_SCAN_CROPS: u64 = 16;

/// Gemma 3's pan-and-scan settings from `preprocessor_config.json`, when `do_pan_and_scan` is
/// true (transformers' defaults for the `pan_and_scan_*` keys it leaves out or nulls).
fn pan_and_scan(
    preprocessor: Option<&serde_json::Value>,
) -> Result<Option<media::PanAndScan>, String> {
    let Some(config) = preprocessor else {
        return Ok(None);
    };
    let key = |name: &str| config.get(name).filter(|v| !v.is_null());
    match key("do_pan_and_scan") {
        None | Some(serde_json::Value::Bool(false)) => return Ok(None),
        Some(serde_json::Value::Bool(true)) => {}
        Some(other) => {
            return Err(format!(
                "preprocessor_config.json: `do_pan_and_scan` = {other} is not a boolean"
            ));
        }
    }
    let defaults = media::PanAndScan::default();
    let count = |name: &str, default: u32, range: std::ops::RangeInclusive<u64>| match key(name) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|n| range.contains(n))
            .map(|n| n as u32)
            .ok_or_else(|| {
                format!(
                    "preprocessor_config.json: `{name}` = {v} is not a whole number in \
                         {}..={}",
                    range.start(),
                    range.end()
                )
            }),
    };
    let ratio = match key("pan_and_scan_min_ratio_to_activate") {
        None => defaults.min_ratio_to_activate,
        Some(v) => v
            .as_f64()
            .filter(|r| r.is_finite() && *r >= 1.0)
            .ok_or_else(|| {
                format!(
                    "preprocessor_config.json: `pan_and_scan_min_ratio_to_activate` = {v} is not \
                 a ratio of at least 1"
                )
            })?,
    };
    Ok(Some(media::PanAndScan {
        min_crop_size: count(
            "pan_and_scan_min_crop_size",
            defaults.min_crop_size,
            1..=u64::from(u32::MAX),
        )?,
        max_num_crops: count(
            "pan_and_scan_max_num_crops",
            defaults.max_num_crops,
            1..=MAX_PAN_AND_SCAN_CROPS,
        )?,
        min_ratio_to_activate: ratio,
    }))
}

/// Qwen2-VL's processor for an encoder of `patches`: its defaults, with the pixel budget and
/// normalization of the checkpoint's `preprocessor_config.json` when it has them (`min_pixels`
/// / `max_pixels`, which transformers lets override `size.shortest_edge` / `longest_edge`;
/// `image_mean`, `image_std`). Patch, merge and frame sizes are the encoder's; a processor
/// config naming others is refused, as is a budget `media` refuses.
fn patch_processor(
    patches: nn::PatchInput,
    preprocessor: Option<&serde_json::Value>,
) -> Result<media::PatchProcessorConfig, String> {
    let size = |n: usize, name: &str| {
        u32::try_from(n).map_err(|_| format!("`{name}` = {n} is out of range"))
    };
    let mut processor = media::PatchProcessorConfig {
        patch_size: size(patches.patch_size, "patch_size")?,
        merge_size: size(patches.merge_size, "spatial_merge_size")?,
        temporal_patch_size: size(patches.temporal_patch_size, "temporal_patch_size")?,
        ..media::PatchProcessorConfig::qwen2_vl()
    };
    if let Some(config) = preprocessor {
        let pixels = |path: &[&str]| -> Result<Option<u64>, String> {
            let mut value = Some(config);
            for key in path {
                value = value.and_then(|v| v.get(key));
            }
            match value {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                    format!(
                        "preprocessor_config.json: `{}` is not a pixel count",
                        path.join(".")
                    )
                }),
            }
        };
        let min = pixels(&["min_pixels"])?.or(pixels(&["size", "shortest_edge"])?);
        let max = pixels(&["max_pixels"])?.or(pixels(&["size", "longest_edge"])?);
        processor.min_pixels = min.unwrap_or(processor.min_pixels);
        processor.max_pixels = max.unwrap_or(processor.max_pixels);
        for (key, ours) in [
            ("patch_size", processor.patch_size),
            ("merge_size", processor.merge_size),
            ("temporal_patch_size", processor.temporal_patch_size),
        ] {
            if let Some(theirs) = pixels(&[key])?
                && theirs != u64::from(ours)
            {
                return Err(format!(
                    "preprocessor_config.json: `{key}` = {theirs}, the encoder's is {ours}"
                ));
            }
        }
        let triple = |key: &str| -> Result<Option<[f32; 3]>, String> {
            match config.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v
                    .as_array()
                    .filter(|a| a.len() == 3)
                    .and_then(|a| {
                        let f = |i: usize| a[i].as_f64().map(|x| x as f32);
                        Some([f(0)?, f(1)?, f(2)?])
                    })
                    .map(Some)
                    .ok_or_else(|| {
                        format!("preprocessor_config.json: `{key}` is not three numbers")
                    }),
            }
        };
        processor.image_mean = triple("image_mean")?.unwrap_or(processor.image_mean);
        processor.image_std = triple("image_std")?.unwrap_or(processor.image_std);
    }
    // A budget or size media refuses is refused at load, not at the first image.
    let side = processor.factor();
    processor
        .resized_size(side, side)
        .map_err(|e| format!("preprocessor_config.json: {e}"))?;
    Ok(processor)
}

/// The files of a model whose manifest has been materialized into `dir`.
pub fn weights_path(dir: &Path, manifest: &Manifest) -> Option<std::path::PathBuf> {
    match manifest.format {
        Format::Gguf => manifest
            .layers
            .iter()
            .find(|l| l.path.ends_with(".gguf"))
            .map(|l| dir.join(&l.path)),
        Format::Safetensors => Some(dir.to_path_buf()),
    }
}

/// A stored model's vocabulary alone, from its materialized files in `dir`: for checks made
/// before anything loads (a Modelfile's `DRAFT`).
pub fn tokenizer_of(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
) -> Result<Tokenizer, LoadError> {
    let weights =
        weights_path(dir, manifest).ok_or_else(|| LoadError::NoWeights(name.to_string()))?;
    match manifest.format {
        Format::Gguf => Tokenizer::from_gguf_file(&weights),
        Format::Safetensors => Tokenizer::from_hf_dir(&weights),
    }
    .map_err(|source| LoadError::Tokenizer {
        name: name.to_string(),
        source,
    })
}

/// Whether `draft` can draft for `target` (with `manifest`, materialized in `dir`): its
/// vocabulary is the target's, id for id. Reads the vocabularies alone, so a draft that cannot
/// fit is refused before anything is unloaded or loaded.
pub fn check_draft_vocabulary(
    target: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    draft: &DraftSource,
) -> Result<(), LoadError> {
    let ours = tokenizer_of(target, manifest, dir)?;
    let theirs = tokenizer_of(&draft.name, &draft.manifest, &draft.dir)?;
    match ours.vocabulary_difference(&theirs) {
        Some(difference) => Err(LoadError::Draft {
            draft: draft.name.to_string(),
            target: target.to_string(),
            reason: format!("its vocabulary is not the target's ({difference})"),
        }),
        None => Ok(()),
    }
}

/// Loads the model (on the calling thread, which must be the MLX worker) and its tokenizer,
/// and `draft` beside it, ready to serve with `loop_config`.
pub fn load(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    draft: Option<&DraftSource>,
    loop_config: LoopConfig,
) -> Result<(LoadedModel, ModelInfo), LoadError> {
    let model_err = |source| LoadError::Model {
        name: name.to_string(),
        source,
    };
    let tok_err = |source| LoadError::Tokenizer {
        name: name.to_string(),
        source,
    };
    let loaded = load_weights(name, manifest, dir)?;
    let tokenizer = tokenizer_of(name, manifest, dir)?;
    let template = match &manifest.template {
        Some(source) => ChatTemplate::new(
            source.clone(),
            tokenizer.bos_text().unwrap_or_default(),
            tokenizer.eos_text().unwrap_or_default(),
        ),
        None => ChatTemplate::for_tokenizer(&tokenizer),
    }
    .map_err(tok_err)?;
    let context_length = loaded.model.spec().context_length.max(1);
    let preprocessor = preprocessor_config(dir, manifest).map_err(model_err)?;
    let vision = loaded
        .model
        .vision()
        .map(|v| ImagePrompt::new(v, preprocessor.as_ref(), &tokenizer))
        .transpose()
        .map_err(|reason| model_err(nn::Error::Config(reason)))?;
    let audio = loaded
        .model
        .audio()
        .map(|a| AudioPrompt::new(a, &tokenizer))
        .transpose()
        .map_err(|reason| model_err(nn::Error::Config(reason)))?;
    // Padded head rows beyond the tokenizer would be ids no reply can decode.
    let model =
        nn::limited_vocabulary::LimitedVocabulary::wrap(loaded.model, tokenizer.vocab_size());
    let mut session =
        LoadedModel::new(model, context_length, loop_config).map_err(|e| match e {
            StepError::Model(source) => model_err(source),
            other => model_err(nn::Error::InvalidInput(other.to_string())),
        })?;
    let draft = match draft {
        None => None,
        Some(source) => match attach_draft(&mut session, name, source) {
            Ok(()) => Some(source.name.clone()),
            Err(e) if !source.required => {
                tracing::warn!("{e}; `{name}` decodes without it");
                None
            }
            Err(e) => return Err(e),
        },
    };
    let encoded = session.encoded_ids();
    Ok((
        session,
        ModelInfo {
            name: name.clone(),
            manifest: manifest.clone(),
            family: Family::detect(&tokenizer),
            longest_token_bytes: tokenizer.longest_token_bytes(),
            tokenizer,
            template,
            context_length,
            config: loaded.config_json,
            grammar_compiler: OnceLock::new(),
            draft,
            vision,
            audio,
            encoded,
        },
    ))
}

/// The checkpoint's `preprocessor_config.json` (its image processor's settings), when it
/// has one; an unreadable one is an error naming it.
fn preprocessor_config(
    dir: &Path,
    manifest: &Manifest,
) -> Result<Option<serde_json::Value>, nn::Error> {
    if manifest.format != Format::Safetensors {
        return Ok(None);
    }
    let path = dir.join("preprocessor_config.json");
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(nn::Error::Config(format!("{}: {e}", path.display()))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| nn::Error::Config(format!("{}: {e}", path.display())))
}

/// A stored model's weights.
fn load_weights(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
) -> Result<nn::load::Loaded, LoadError> {
    let weights =
        weights_path(dir, manifest).ok_or_else(|| LoadError::NoWeights(name.to_string()))?;
    nn::load::load(&weights, None).map_err(|source| LoadError::Model {
        name: name.to_string(),
        source,
    })
}

/// Loads `source` beside the target `session` as its draft model.
fn attach_draft(
    session: &mut LoadedModel,
    target: &ModelName,
    source: &DraftSource,
) -> Result<(), LoadError> {
    let loaded = load_weights(&source.name, &source.manifest, &source.dir)?;
    // Its tokenizer is the target's (checked before loading): cut its head as the target's.
    let vocab = session.model().spec().vocab_size;
    let model = nn::limited_vocabulary::LimitedVocabulary::wrap(loaded.model, vocab);
    session
        .attach_draft(source.name.to_string(), model, source.by_default)
        .map_err(|e| LoadError::Draft {
            draft: source.name.to_string(),
            target: target.to_string(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::pan_and_scan;
    use serde_json::json;

    #[test]
    fn pan_and_scan_is_read_from_the_preprocessor_config() {
        assert_eq!(pan_and_scan(None), Ok(None));
        assert_eq!(pan_and_scan(Some(&json!({}))), Ok(None));
        assert_eq!(
            pan_and_scan(Some(&json!({ "do_pan_and_scan": null }))),
            Ok(None)
        );
        assert_eq!(
            pan_and_scan(Some(&json!({ "do_pan_and_scan": false }))),
            Ok(None)
        );
        // transformers' defaults for what the config leaves out or nulls.
        assert_eq!(
            pan_and_scan(Some(&json!({
                "do_pan_and_scan": true,
                "pan_and_scan_max_num_crops": null,
            }))),
            Ok(Some(media::PanAndScan::default()))
        );
        for bad in [
            json!({ "do_pan_and_scan": "yes" }),
            json!({ "do_pan_and_scan": true, "pan_and_scan_min_crop_size": 0 }),
            json!({ "do_pan_and_scan": true, "pan_and_scan_max_num_crops": 1000 }),
            json!({ "do_pan_and_scan": true, "pan_and_scan_min_ratio_to_activate": 0.5 }),
        ] {
            let err = pan_and_scan(Some(&bad)).unwrap_err();
            assert!(err.starts_with("preprocessor_config.json: `"), "{err}");
        }
    }
}
