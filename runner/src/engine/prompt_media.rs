//! How a model takes images and audio in a prompt, in one place: the layout request handlers
//! expand an image or a clip into ([`ImagePrompt`], [`AudioPrompt`], read from the model and
//! its vocabulary at load), and the check a job's media pass at admission ([`check_media`]):
//! each item's tokens exactly where, and as many as, the model lays them out.

use nn::Model;
use tokenizer::Tokenizer;

use crate::engine::job::{EncoderInput, Job, PromptMedia};
use crate::engine::step::StepError;

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

/// Refuses a job whose images the model cannot take or whose prompt does not hold them as
/// the model lays them out: each image's range must be exactly its image tokens, in order,
/// and the prompt may hold no other image token.
pub fn check_media(model: &dyn Model, job: &Job) -> Result<(), StepError> {
    if job.images.is_empty() {
        return Ok(());
    }
    if job.images.iter().any(PromptMedia::is_audio) {
        return check_audio(model, job);
    }
    let Some(vision) = model.vision() else {
        return Err(StepError::Request("this model does not read images".into()));
    };
    let input = vision.image_input();
    // A dynamic-resolution model's image takes as many tokens as its grid says.
    let merge = vision.patch_input().map(|p| p.merge_size);
    let mut runs = Vec::with_capacity(job.images.len());
    for (n, image) in job.images.iter().enumerate() {
        let expected = match (image.grid(), merge) {
            (None, None) => input.tokens_per_image,
            (Some(grid), Some(merge)) => grid.tokens(merge),
            (Some(_), None) => {
                return Err(StepError::Request(format!(
                    "image {n} comes as patches; this model takes whole images"
                )));
            }
            (None, Some(_)) => {
                return Err(StepError::Request(format!(
                    "image {n} comes as whole pixels; this model takes patches"
                )));
            }
        };
        runs.push((image.tokens.clone(), expected));
    }
    check_media_runs(&job.prompt, &runs, input.image_token, &IMAGE_RUNS)
}

/// [`check_media`] for a prompt with audio: every media item must be an audio
/// segment, each range exactly the audio tokens its valid frames make
/// ([`nn::Audio::audio_tokens`]), in order, and no other audio token in the prompt.
fn check_audio(model: &dyn Model, job: &Job) -> Result<(), StepError> {
    let Some(audio) = model.audio() else {
        return Err(StepError::Request("this model does not read audio".into()));
    };
    let input = audio.audio_input();
    let mut runs = Vec::with_capacity(job.images.len());
    for (n, segment) in job.images.iter().enumerate() {
        let EncoderInput::Audio(mel) = &segment.input else {
            return Err(StepError::Request(format!(
                "media item {n} is an image in a prompt with audio"
            )));
        };
        if mel.feature_size != input.num_mel_bins || mel.frames != input.max_frames {
            return Err(StepError::Request(format!(
                "audio segment {n} has {} bins by {} frames; the encoder takes {} by {}",
                mel.feature_size, mel.frames, input.num_mel_bins, input.max_frames
            )));
        }
        runs.push((segment.tokens.clone(), audio.audio_tokens(mel.valid_frames)));
    }
    check_media_runs(&job.prompt, &runs, input.audio_token, &AUDIO_RUNS)
}

/// How [`check_media_runs`] names one kind of media in its errors.
struct MediaRunNames {
    /// One item ("image", "audio segment").
    item: &'static str,
    /// Its tokens ("image", "audio").
    token: &'static str,
    /// The item before it ("image", "segment").
    previous: &'static str,
    /// Several items ("images", "segments").
    items: &'static str,
}

const IMAGE_RUNS: MediaRunNames = MediaRunNames {
    item: "image",
    token: "image",
    previous: "image",
    items: "images",
};

const AUDIO_RUNS: MediaRunNames = MediaRunNames {
    item: "audio segment",
    token: "audio",
    previous: "segment",
    items: "segments",
};

/// Refuses a prompt whose media `runs` (each item's prompt range and the tokens its input
/// makes) are not, in order, exactly that many `token`s each, or that holds `token` anywhere
/// else. An item that makes no token is refused too.
fn check_media_runs(
    prompt: &[u32],
    runs: &[(std::ops::Range<usize>, usize)],
    token: u32,
    names: &MediaRunNames,
) -> Result<(), StepError> {
    let mut previous_end = 0;
    let mut expected_total = 0;
    for (n, (range, expected)) in runs.iter().enumerate() {
        let (range, expected) = (range.clone(), *expected);
        let holds = prompt
            .get(range.clone())
            .is_some_and(|ids| ids.iter().all(|&id| id == token));
        if expected == 0 || range.start < previous_end || range.len() != expected || !holds {
            return Err(StepError::Request(format!(
                "{} {n} at prompt tokens {range:?} is not {expected} {} tokens after the \
                 previous {}",
                names.item, names.token, names.previous
            )));
        }
        previous_end = range.end;
        expected_total += expected;
    }
    let held = prompt.iter().filter(|&&id| id == token).count();
    if held != expected_total {
        return Err(StepError::Request(format!(
            "the prompt holds {held} {} tokens for {} {} of {expected_total} tokens",
            names.token,
            runs.len(),
            names.items
        )));
    }
    Ok(())
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
