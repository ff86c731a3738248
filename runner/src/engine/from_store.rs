//! Loading a stored model: weights onto the MLX worker, vocabulary and chat template beside.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use grammar::GrammarCompiler;

use tokenizer::{ChatTemplate, Family, Tokenizer, ToolFormat};

use crate::engine::encoded_media::EncodedIds;
use crate::engine::loaded_model::{LoadedModel, LoopConfig};
use crate::engine::prompt_media::{AudioPrompt, ImagePrompt};
use crate::engine::step::StepError;
use crate::group::Parallel;
use crate::group::control::ToWorker;
use crate::group::leader::Leader;
use crate::group::rank_0::GroupLink;
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
    /// How tools reach it: through its template, or in the generic format where the template
    /// cannot show them (probed once, at load).
    pub tool_format: ToolFormat,
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
    /// Whether its checkpoint ships a drafter head (`draft: "mtp"`).
    pub draft_head: bool,
    /// How images enter its prompts, when it reads images.
    pub vision: Option<ImagePrompt>,
    /// How audio enters its prompts, when it reads audio.
    pub audio: Option<AudioPrompt>,
    /// The images and audio segments whose encoded features the engine keeps: an image among
    /// them is sent to the engine undecoded.
    pub encoded: Arc<EncodedIds>,
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

/// The chat template a model is served with: its manifest's override, else its vocabulary's
/// (the checkpoint's, or its family's fallback).
fn chat_template(manifest: &Manifest, tokenizer: &Tokenizer) -> tokenizer::Result<ChatTemplate> {
    match &manifest.template {
        Some(source) => ChatTemplate::new(
            source.clone(),
            tokenizer.bos_text().unwrap_or_default(),
            tokenizer.eos_text().unwrap_or_default(),
        ),
        None => ChatTemplate::for_tokenizer(tokenizer),
    }
}

/// Whether `draft` can draft for `target` (with `manifest`, materialized in `dir`): its
/// vocabulary is the target's, id for id; a Gemma 4 assistant, which reads the target's own
/// embedding, must instead fit the target's shapes. Reads the vocabularies (or configs) alone,
/// so a draft that cannot fit is refused before anything is unloaded or loaded.
pub fn check_draft_vocabulary(
    target: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    draft: &DraftSource,
) -> Result<(), LoadError> {
    if only_drafts(draft) {
        let refuse = |reason: String| LoadError::Draft {
            draft: draft.name.to_string(),
            target: target.to_string(),
            reason,
        };
        let target_config = checkpoint_config(target, manifest, dir)?;
        let draft_config = checkpoint_config(&draft.name, &draft.manifest, &draft.dir)?;
        let fits = if nn::arch::dflash::is_dflash(&draft_config) {
            nn::arch::dflash::check_fit(&draft_config, &target_config)
        } else {
            nn::arch::gemma4_assistant::check_fit(&draft_config, &target_config)
        };
        return fits.map_err(|e| refuse(e.to_string()));
    }
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

/// The context a Modelfile's `num_ctx` asks for. As in Ollama, a user may run a model past
/// its trained context (an agent's 12k-token tool prompt on an 8k model); the model is then
/// loaded with its rotary embedding stretched to it (`nn::context_extension`). A shorter
/// `num_ctx` is a per-request option and lowers each request's context instead
/// (`server::prompt::check_context`).
fn modelfile_context(manifest: &Manifest) -> Option<usize> {
    manifest
        .parameters
        .get("num_ctx")
        // A Modelfile writes every number as a float; requests refuse one past 1e8.
        .and_then(serde_json::Value::as_f64)
        .filter(|n| n.fract() == 0.0 && (1.0..=1e8).contains(n))
        .map(|n| n as usize)
}

/// The context `loaded` serves, and a log line where it is past the trained one.
fn served_context(name: &ModelName, loaded: &nn::load::Loaded, asked: Option<usize>) -> usize {
    let trained = loaded.model.spec().context_length.max(1);
    let Some(asked) = asked.filter(|&asked| asked > trained) else {
        return trained;
    };
    match loaded.extension {
        nn::context_extension::Extension::Yarn { factor } => tracing::info!(
            "`{name}` serves a context of {asked} tokens (its Modelfile's num_ctx), past the \
             {trained} it was trained for: its rotary embedding is stretched {factor:.2}x (YaRN)"
        ),
        _ => tracing::warn!(
            "`{name}` serves a context of {asked} tokens (its Modelfile's num_ctx), past the \
             {trained} it was trained for, with its rotary embedding as it ships; replies past \
             {trained} tokens may degrade"
        ),
    }
    asked
}

/// Loads the model (on the calling thread, which must be the MLX worker) and its tokenizer,
/// and `draft` beside it, ready to serve with `loop_config`.
///
/// With `group`, the model is split across the group's processes: every worker is told to
/// load its part, this process loads rank 0's, and the model serves once all have answered.
pub fn load(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    draft: Option<&DraftSource>,
    loop_config: LoopConfig,
    group: Option<&Arc<GroupLink>>,
) -> Result<(LoadedModel, ModelInfo), LoadError> {
    let model_err = |source| LoadError::Model {
        name: name.to_string(),
        source,
    };
    let tok_err = |source| LoadError::Tokenizer {
        name: name.to_string(),
        source,
    };
    if group.is_some() && draft.is_some() {
        return Err(model_err(nn::Error::Group(
            "draft models are not served across processes yet".into(),
        )));
    }
    let asked_context = modelfile_context(manifest);
    let loaded = match group {
        None => load_weights(name, manifest, dir, asked_context, nn::load::Split::Whole)?,
        Some(group) => load_leader(
            name,
            manifest,
            dir,
            asked_context,
            loop_config.kv_storage,
            group,
        )?,
    };
    let context_length = served_context(name, &loaded, asked_context);
    let tokenizer = tokenizer_of(name, manifest, dir)?;
    let template = chat_template(manifest, &tokenizer).map_err(tok_err)?;
    let family = Family::detect(&tokenizer);
    let preprocessor = preprocessor_config(dir, manifest).map_err(model_err)?;
    let vision = loaded
        .model
        .vision()
        .map(|v| ImagePrompt::new(v, preprocessor.as_ref(), &tokenizer))
        .transpose()
        .map_err(|reason| model_err(nn::Error::Config(reason)))?;
    let draft_head = loaded.model.draft_head().is_some();
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
    if group.is_some() {
        // Workers hold caches per sequence only: a prefix restored on rank 0 they could not
        // follow.
        session.reuse_prefixes(false);
    }
    let draft = match draft {
        None => None,
        Some(source) => match attach_draft(
            &mut session,
            name,
            (&loaded.config_json, loaded.dtype),
            source,
        ) {
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
            family,
            tool_format: ToolFormat::detect(&template, family),
            longest_token_bytes: tokenizer.longest_token_bytes(),
            tokenizer,
            template,
            context_length,
            config: loaded.config_json,
            grammar_compiler: OnceLock::new(),
            draft,
            draft_head,
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

/// Rank 0's part of a model split across `group`, once every worker has loaded its own, each
/// to keep its caches as `kv_storage` says.
fn load_leader(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    context: Option<usize>,
    kv_storage: Option<kvcache::KvStorage>,
    group: &Arc<GroupLink>,
) -> Result<nn::load::Loaded, LoadError> {
    let group_err = |message: String| LoadError::Model {
        name: name.to_string(),
        source: nn::Error::Group(message),
    };
    let formation = group.formation().map_err(group_err)?;
    formation
        .links
        .tell(&ToWorker::Load {
            model: name.to_string(),
            parallel: group.parallel,
            kv_cache: kv_storage.map(crate::group::control::kv_storage_name),
        })
        .map_err(group_err)?;
    let own = formation
        .group()
        .map_err(nn::Error::from)
        .map_err(|source| LoadError::Model {
            name: name.to_string(),
            source,
        })
        .and_then(|g| {
            let split = match group.parallel {
                Parallel::Tensor => nn::load::Split::Tensor(g),
                Parallel::Pipeline => nn::load::Split::Pipeline(g),
            };
            load_weights(name, manifest, dir, context, split)
        });
    // The workers are answered for even when this rank failed: they must not be left loading
    // while rank 0 moves on.
    let workers = formation.links.answers("loading", WORKER_LOAD_TIMEOUT);
    let mut loaded = own?;
    workers.map_err(group_err)?;
    loaded.model =
        Box::new(
            Leader::new(loaded.model, formation).map_err(|source| LoadError::Model {
                name: name.to_string(),
                source,
            })?,
        );
    Ok(loaded)
}

/// How long rank 0 waits for its workers to load their parts.
const WORKER_LOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A worker's part of stored model `name`, as rank 0 loads its own (`split` from the group).
pub fn load_part(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    split: nn::load::Split,
) -> Result<Box<dyn nn::Model>, LoadError> {
    let context = modelfile_context(manifest);
    Ok(load_weights(name, manifest, dir, context, split)?.model)
}

/// A stored model's weights, `split` says which part of them.
fn load_weights(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
    context: Option<usize>,
    split: nn::load::Split,
) -> Result<nn::load::Loaded, LoadError> {
    let weights =
        weights_path(dir, manifest).ok_or_else(|| LoadError::NoWeights(name.to_string()))?;
    let settings = nn::load::LoadSettings {
        context,
        ..nn::load::LoadSettings::default()
    };
    // A drafter head trained for the model and stored beside it (`pull`'s shipped heads); a
    // model split across processes drafts with no head yet (rank 0 alone would run it).
    let head = manifest
        .layers
        .iter()
        .find(|l| l.path == crate::shipped_heads::HEAD_FILE)
        .filter(|_| matches!(split, nn::load::Split::Whole))
        .map(|l| dir.join(&l.path));
    nn::load::load_split(&weights, head.as_deref(), settings, split).map_err(|source| {
        LoadError::Model {
            name: name.to_string(),
            source,
        }
    })
}

/// Whether `draft` only drafts beside a target (a Gemma 4 assistant, a DFlash drafter), as
/// its import recorded.
fn only_drafts(draft: &DraftSource) -> bool {
    crate::capabilities::only_drafts(&draft.manifest.details.capabilities)
}

/// The config of a stored model's checkpoint (a GGUF file's metadata in transformers' names).
fn checkpoint_config(
    name: &ModelName,
    manifest: &Manifest,
    dir: &Path,
) -> Result<serde_json::Value, LoadError> {
    let weights =
        weights_path(dir, manifest).ok_or_else(|| LoadError::NoWeights(name.to_string()))?;
    quant::Checkpoint::open(&weights)
        .map(|checkpoint| checkpoint.config().clone())
        .map_err(|source| LoadError::Model {
            name: name.to_string(),
            source: source.into(),
        })
}

/// Loads `source` beside the target `session` as its draft model: a Gemma 4 assistant or a
/// DFlash drafter is fitted to the target (`target_config`, computing in `dtype`); any other
/// is a model of its own.
fn attach_draft(
    session: &mut LoadedModel,
    target: &ModelName,
    (target_config, dtype): (&serde_json::Value, mlx::Dtype),
    source: &DraftSource,
) -> Result<(), LoadError> {
    let refuse = |reason: String| LoadError::Draft {
        draft: source.name.to_string(),
        target: target.to_string(),
        reason,
    };
    if only_drafts(source) {
        let weights = weights_path(&source.dir, &source.manifest)
            .ok_or_else(|| LoadError::NoWeights(source.name.to_string()))?;
        if source.manifest.details.family == "dflash" {
            let drafter = nn::load::load_dflash(&weights, target_config, dtype)
                .map_err(|e| refuse(e.to_string()))?;
            return session
                .attach_block_drafter(source.name.to_string(), drafter, source.by_default)
                .map_err(|e| refuse(e.to_string()));
        }
        let assistant = nn::load::load_assistant(&weights, session.model(), target_config, dtype)
            .map_err(|e| refuse(e.to_string()))?;
        session.attach_assistant(source.name.to_string(), assistant, source.by_default);
        return Ok(());
    }
    let loaded = load_weights(
        &source.name,
        &source.manifest,
        &source.dir,
        None,
        nn::load::Split::Whole,
    )?;
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
