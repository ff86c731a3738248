//! Layers, the model contract and architectures, built on MLX.
//!
//! Layers (one per file) are built from checkpoint tensors and know nothing of architectures;
//! architectures (`arch/`, one file each) assemble layers and decide their conventions.
//!
//! - [`config`]: what every family's `config.json` reader shares (fields named when missing or
//!   absurd, rope parameters in transformers 4 and 5 spellings, layer types, tie rules).
//! - [`weights`]: [`Weights`], named tensors handed to layers in the compute dtype.
//! - Layers: [`linear`], [`embedding`], [`rms_norm`], [`layer_norm`], [`conv1d`], [`rope`]
//!   (default, linear, llama3, yarn, proportional, per-frequency divisors; partial;
//!   traditional; axial, from explicit positions per axis: M-RoPE, 2-D vision rope),
//!   [`attention`] (GQA, q/k norms, soft-capping, output gates, sinks, optional
//!   rope), [`sdpa`] (the scaled dot product every
//!   attention block shares), [`cached_attention`] (each batch row over its own cache, with
//!   blocks of tokens that also see each other's later tokens),
//!   [`activation`] (fused gated activations, clamped SwiGLU), [`mlp`], [`moe`] (routing by
//!   softmax, sigmoid or top-k logits, shared experts, expert groups and biases),
//!   [`short_conv`] (causal depthwise convolution with a carried tail), [`gated_delta`] (the
//!   gated delta rule's recurrence), [`ssd`] (Mamba-2's state space recurrence), [`mamba2`]
//!   (its mixer), [`recurrent_rows`] (recurrent state across batch rows and captures),
//!   `mtp_head` (a multi-token-prediction head over a family's own decoder layer: Qwen3.5's
//!   `mtp.*`, DeepSeek-V3's layer after its last, or one trained apart and attached at load).
//! - [`limited_vocabulary`]: a model's head cut to the ids its tokenizer decodes.
//! - [`model`]: the [`Model`] contract, [`Batch`], [`Forward`], [`ModelSpec`] (what the engine
//!   needs to know of a model, whatever its family), and [`Vision`], the image side of a model
//!   that reads images ([`ImageInput`]: its pixels and prompt tokens), and [`Audio`], the
//!   audio side of one that reads audio ([`AudioInput`]: its log-mel features and prompt
//!   token).
//! - [`arch`]: one file per family, each with its own config read from the checkpoint's keys:
//!   `llama`, `qwen2`, `qwen3`, `qwen3_moe`, `gemma3`, `qwen3_5` (Qwen3.5, Qwen3.5-MoE,
//!   Qwen3-Next), `lfm2`, `nemotron_h`, `granitemoehybrid`, `deepseek_v3` (and
//!   GLM-4-MoE-Lite), `gpt_oss`, `llama4`, `mistral` (Mistral, Mixtral, Mistral 3), `gemma2`,
//!   `gemma4`, `olmo2`, `phi3`; `gemma3_multimodal`, Gemma 3 reading images through a SigLIP
//!   tower (the text-only families load multimodal checkpoints with their towers set aside);
//!   `llava`, LLaVA 1.5: a CLIP tower's features projected into a Llama's prompt;
//!   `qwen2_5_vl`, Qwen2.5-VL: M-RoPE positions and a dynamic-resolution tower;
//!   `qwen2_audio`, Qwen2 reading audio through a Whisper encoder. Drafters that serve only
//!   beside a target: `gemma4_assistant` (Gemma 4's assistant, over the target's caches) and
//!   `dflash` (DFlash block drafters, over the target's tapped layers; `taps` collects them).
//! - [`tensor_parallel`] and [`pipeline_parallel`]: one model split across the ranks of an MLX
//!   distributed group, by heads and columns or by layer ranges.
//! - [`vision`]: vision encoders, one file each: `siglip` (patch features of an image), `clip`
//!   (CLIP's tower through the layer a family reads), `qwen2_5_vl` (images of any size, window
//!   attention, merged 2x2 patches); what ViT towers share (`vit`).
//! - `placement`: media features put in place of a prompt's image or audio tokens.
//! - [`audio`]: audio encoders, one file each: `whisper` (features of log-mel frames); and
//!   Whisper the speech recognizer: `whisper_decoder` (its text decoder, cross-attending to
//!   the encoder), `whisper_model` (the encoder-decoder checkpoint), `whisper_decoding`
//!   (special tokens, the forced prompt, greedy decoding with the timestamp rules).
//! - [`registry`]: architecture by name; each family reads its own `config.json`
//!   ([`registry::describe`], [`build_model`]); [`registry::register`] adds a family defined
//!   outside this crate; compute dtype per device.
//! - [`load`]: opening a checkpoint directory or GGUF file into a ready model, with its
//!   parameters counted from the checkpoint's tensors and the [`load::LoadSettings`] (compute
//!   dtype, when a quantized checkpoint is dequantized on a CPU).

pub mod activation;
pub mod arch;
pub mod attention;
pub mod audio;
pub mod cached_attention;
pub mod config;
pub mod context_extension;
pub mod conv1d;
pub mod embedding;
mod error;
pub mod gated_delta;
pub mod layer_norm;
pub mod limited_vocabulary;
pub mod linear;
pub mod load;
pub mod mamba2;
pub mod mlp;
pub mod model;
pub mod moe;
mod mtp_head;
pub mod pipeline_parallel;
mod placement;
pub mod recurrent_rows;
pub mod registry;
pub mod rms_norm;
pub mod rope;
pub mod sdpa;
pub mod short_conv;
pub mod ssd;
mod taps;
pub mod tensor_parallel;
pub mod vision;
pub mod weights;

pub use error::{Error, Result};
pub use model::{
    Assistant, AssistantStep, Audio, AudioInput, Batch, DraftHead, Forward, ImageGrid, ImageInput,
    ImagePreprocessing, InputEmbeddings, LayerState, Model, ModelSpec, PatchInput, Vision,
};
pub use registry::build_model;
pub use weights::Weights;
