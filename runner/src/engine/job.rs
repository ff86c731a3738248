//! What a generation asks of the engine and what it streams back.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

/// One generation: an already tokenized prompt and how to continue it.
pub struct Job {
    /// Prompt token ids (chat template applied, special tokens included).
    pub prompt: Vec<u32>,
    /// Sampling options for this request.
    pub sampling: sampler::Options,
    /// The most tokens to generate.
    pub max_tokens: usize,
    /// Token ids that end generation (EOS and end-of-turn tokens); not streamed.
    pub stop_tokens: Vec<u32>,
    /// The constraint every sampled token must satisfy (structured output), at the start of
    /// the output. Its end tokens must be `stop_tokens`: it allows them only when complete.
    pub grammar: Option<grammar::Grammar>,
    /// Prompt offsets where a conversation turn starts (the last user message, say): the
    /// prefix cache keeps restore points there, so an edited or regenerated turn resumes.
    pub turn_starts: Vec<usize>,
    /// The media in the prompt, in prompt order: images for a model that reads images, audio
    /// segments for one that reads audio (empty otherwise). Their tokens are the model's image
    /// or audio token; the prefix cache keys them by content, and a prefill chunk never splits
    /// one.
    pub images: Vec<PromptMedia>,
    /// Whether and how to decode speculatively.
    pub speculation: Speculation,
    /// Where tokens and the final summary go. The job stops at its next step once the
    /// receiver is dropped (the client went away).
    pub events: UnboundedSender<Event>,
    /// Set by the caller to stop the job at its next step (a stop string matched); the job
    /// still reports `Done` with its statistics.
    pub cancel: Arc<AtomicBool>,
}

impl Job {
    /// Whether the job should stop: cancelled, or nobody is listening.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }

    /// The prefix trie's view of the images wholly within the first `len` prompt tokens:
    /// keyed by content, evaluated in one forward each (their tokens attend both ways).
    pub fn media_items(&self, len: usize) -> Vec<prefix_trie::MediaItem> {
        self.images
            .iter()
            .filter(|image| image.tokens.end <= len)
            .map(|image| prefix_trie::MediaItem {
                tokens: image.tokens.clone(),
                content_hash: image.content_hash(),
                causal: false,
            })
            .collect()
    }

    /// The image whose tokens hold prompt position `at`, if any.
    pub fn image_at(&self, at: usize) -> Option<&PromptMedia> {
        self.images.iter().find(|image| image.tokens.contains(&at))
    }
}

/// An image, or a segment of an audio clip, in a job's prompt: a run of tokens whose
/// embeddings an encoder's features replace.
#[derive(Debug, Clone)]
pub struct PromptMedia {
    /// The prompt positions of its image (or audio) tokens (the markers around them are
    /// text).
    pub tokens: Range<usize>,
    /// Its content's identity under the model's preprocessing: keys the prefix cache and the
    /// engine's cache of encoded images.
    pub id: media::MediaId,
    /// What its model's encoder takes.
    pub input: EncoderInput,
}

/// An image or audio segment preprocessed for its model's encoder.
#[derive(Debug, Clone)]
pub enum EncoderInput {
    /// Channel-first pixels of the encoder's one size (Gemma 3, LLaVA).
    Pixels(Arc<media::PixelValues>),
    /// Flattened patches and their grid, for a dynamic-resolution encoder (Qwen2.5-VL).
    Patches(Arc<media::ImagePatches>),
    /// Log-mel features of one segment of a clip, at most the encoder's window long
    /// (Qwen2-Audio).
    Audio(Arc<media::LogMel>),
    /// An image left undecoded because the engine held its features when the prompt was
    /// prepared (a conversation sending it again); decoded on the worker only if they are
    /// gone by the time its tokens are evaluated.
    Undecoded(Arc<UndecodedImage>),
}

/// An image's bytes and how its model preprocesses them.
#[derive(Debug)]
pub struct UndecodedImage {
    /// The image as sent.
    pub bytes: Arc<[u8]>,
    /// The model's preprocessing.
    pub processing: ImageProcessing,
}

/// How a model's images are preprocessed.
#[derive(Debug, Clone, Copy)]
pub enum ImageProcessing {
    /// To the encoder's one size: the whole image, or one of its pan-and-scan crops.
    Fixed(media::ImageProcessorConfig, Option<media::CropRect>),
    /// Into the patches of a dynamic-resolution encoder, whose grid (read from the image's
    /// header) is known before decoding.
    Patches(media::PatchProcessorConfig, media::PatchGrid),
}

impl UndecodedImage {
    /// Its identity under the model's preprocessing (what decoding it would give); a crop's
    /// adds its rectangle.
    pub fn id(&self) -> media::MediaId {
        match &self.processing {
            ImageProcessing::Fixed(config, None) => config.media_id(&self.bytes),
            ImageProcessing::Fixed(config, Some(rect)) => {
                let mut key = config.shape_key();
                key.extend([rect.x, rect.y, rect.width, rect.height].map(u64::from));
                media::MediaId::new(media::Modality::Image, &self.bytes, &key)
            }
            ImageProcessing::Patches(config, _) => config.media_id(&self.bytes),
        }
    }

    /// Decodes it under the default [`media::ImageLimits`] and preprocesses it.
    pub fn decode(&self) -> media::Result<EncoderInput> {
        self.preprocess(&decode_image(&self.bytes)?)
    }

    /// Preprocesses it from its decoded pixels (`decode_image` of its bytes).
    pub fn preprocess(&self, rgb: &media::RgbImage) -> media::Result<EncoderInput> {
        Ok(match &self.processing {
            ImageProcessing::Fixed(config, None) => {
                EncoderInput::Pixels(Arc::new(media::preprocess(rgb, config)?))
            }
            ImageProcessing::Fixed(config, Some(rect)) => {
                let crop = media::crop(rgb, *rect);
                EncoderInput::Pixels(Arc::new(media::preprocess(&crop, config)?))
            }
            ImageProcessing::Patches(config, _) => {
                EncoderInput::Patches(Arc::new(media::preprocess_patches(rgb, config)?))
            }
        })
    }
}

/// An image's pixels under the default [`media::ImageLimits`] (counted in
/// `mlxkit_images_decoded_total`).
pub fn decode_image(bytes: &[u8]) -> media::Result<media::RgbImage> {
    metrics::counter!("mlxkit_images_decoded_total").increment(1);
    media::decode_image(bytes, &media::ImageLimits::default())
}

impl PromptMedia {
    /// Whether it is a segment of audio rather than an image.
    pub fn is_audio(&self) -> bool {
        matches!(self.input, EncoderInput::Audio(_))
    }

    /// Its grid, when its encoder takes patches: what places its tokens' rotary positions.
    pub fn grid(&self) -> Option<nn::ImageGrid> {
        let grid = match &self.input {
            EncoderInput::Pixels(_) | EncoderInput::Audio(_) => return None,
            EncoderInput::Patches(patches) => patches.grid,
            EncoderInput::Undecoded(image) => match &image.processing {
                ImageProcessing::Fixed(..) => return None,
                ImageProcessing::Patches(_, grid) => *grid,
            },
        };
        Some(nn::ImageGrid {
            t: grid.t as usize,
            h: grid.h as usize,
            w: grid.w as usize,
        })
    }

    /// The first 64 bits of its id, as the prefix trie takes a content hash.
    pub fn content_hash(&self) -> u64 {
        let bytes = self.id.as_bytes();
        u64::from_le_bytes([
            bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
        ])
    }
}

/// A request's choice of speculative decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculation {
    /// The server's drafter (`--draft`), if it has one, drafting at most `max_depth` tokens a
    /// round (`None`: the engine's default).
    ServerDefault {
        /// The deepest round this request allows.
        max_depth: Option<usize>,
    },
    /// Plain decoding.
    Off,
    /// Speculate with this drafter, drafting at most `max_depth` tokens a round (`None`: the
    /// engine's limit).
    On {
        /// Where drafts come from.
        drafter: DrafterKind,
        /// The deepest round this request allows.
        max_depth: Option<usize>,
    },
}

impl Default for Speculation {
    fn default() -> Speculation {
        Speculation::ServerDefault { max_depth: None }
    }
}

/// The drafters the engine can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DrafterKind {
    /// Prompt lookup: continue the longest earlier match of the context's last tokens.
    Ngram,
    /// Layer-skip self-draft: the target's first this many layers, its final norm and head,
    /// on the target's own caches (no extra weights).
    SelfDraft(usize),
    /// The draft model loaded beside the target (Modelfile `DRAFT`, `draft: "<model>"`):
    /// a smaller model with the same vocabulary and caches of its own.
    Model,
    /// The multi-token-prediction head the target's checkpoint ships (`mtp`): one decoder
    /// layer over the target's final state and the next token, with caches of its own.
    Mtp,
}

/// The deepest layer-skip draft `self:<k>` names.
pub const MAX_SELF_DRAFT_LAYERS: usize = 256;

impl DrafterKind {
    /// The name requests use (`ngram`, `self:4`); `model` for a draft model, which requests
    /// call by the model's own name.
    pub fn name(self) -> String {
        match self {
            DrafterKind::Ngram => "ngram".into(),
            DrafterKind::SelfDraft(layers) => format!("self:{layers}"),
            DrafterKind::Model => "model".into(),
            DrafterKind::Mtp => "mtp".into(),
        }
    }

    /// The built-in drafter called `name` (`ngram`, `self:<layers>`), if the engine has it;
    /// any other name may be a draft model's.
    pub fn parse(name: &str) -> Option<DrafterKind> {
        match name.split_once(':') {
            None if name == "ngram" => Some(DrafterKind::Ngram),
            None if name == "mtp" => Some(DrafterKind::Mtp),
            Some(("self", layers)) => layers
                .parse()
                .ok()
                .filter(|n| (1..=MAX_SELF_DRAFT_LAYERS).contains(n))
                .map(DrafterKind::SelfDraft),
            _ => None,
        }
    }
}

/// The logprob of one generated token and its best alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token's logprob.
    pub logprob: f32,
    /// The most likely tokens, most likely first, with their logprobs.
    pub top: Vec<(u32, f32)>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoneReason {
    /// The model produced a stop token (or a stop string matched, decided by the caller).
    Stop,
    /// The token budget or the context ran out.
    Length,
    /// The client went away.
    Cancelled,
}

impl DoneReason {
    /// The name APIs report (`stop`, `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            DoneReason::Stop => "stop",
            DoneReason::Length => "length",
            DoneReason::Cancelled => "cancelled",
        }
    }
}

/// Timings and counts of one generation, as Ollama reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (not evaluated).
    pub cached_tokens: usize,
    /// Time evaluating the rest of the prompt.
    pub prompt_eval: Duration,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Time generating them (from the first decode step to the last token read).
    pub eval: Duration,
    /// Peak MLX memory during the job, bytes.
    pub peak_memory: usize,
    /// Speculative rounds, when the job speculated.
    pub speculation: Option<SpeculationStats>,
    /// Images in its prompt.
    pub images: usize,
    /// Images its prompt needed that the vision encoder ran for (not served from the prefix
    /// cache nor from the cache of encoded images).
    pub images_encoded: usize,
    /// Audio segments in its prompt (a clip longer than the encoder's window is several).
    pub audio: usize,
    /// Audio segments its prompt needed that the audio encoder ran for (not served from the
    /// prefix cache nor from the cache of encoded features).
    pub audio_encoded: usize,
}

/// What speculation did for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationStats {
    /// The drafter (reported by the name requests use, `self:12` and not just `self`).
    pub drafter: DrafterKind,
    /// Verification rounds (including depth-0 rounds, where the controller drafted nothing).
    pub rounds: usize,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Of those, accepted.
    pub accepted: usize,
    /// Tokens decoded in the plain forward, outside rounds, while the controller found that
    /// drafting did not pay.
    pub plain: usize,
}

impl SpeculationStats {
    /// Draft tokens per round.
    pub fn mean_depth(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.drafted as f64 / self.rounds as f64
        }
    }
}

impl Stats {
    /// Prompt tokens actually evaluated.
    pub fn prompt_eval_count(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }
}

/// What a job streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token.
    Token {
        /// Its id.
        id: u32,
        /// Its logprobs, when asked for.
        logprobs: Option<TokenLogprobs>,
    },
    /// The job finished.
    Done {
        /// Why.
        reason: DoneReason,
        /// Counts and timings.
        stats: Stats,
    },
    /// The job failed (or the engine did); nothing follows.
    Failed(String),
}
