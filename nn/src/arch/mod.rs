//! Architectures, one file each, and the registry that picks one by name.

pub mod deepseek_v3;
pub mod dflash;
pub mod gemma2;
pub mod gemma3;
pub mod gemma3_multimodal;
pub mod gemma4;
pub mod gemma4_assistant;
pub mod gpt_oss;
pub mod granitemoehybrid;
pub mod lfm2;
pub mod llama;
pub mod llama4;
pub mod llava;
pub mod mistral;
pub mod nemotron_h;
pub mod olmo2;
pub mod phi3;
pub mod qwen2;
pub mod qwen2_5_vl;
pub mod qwen2_audio;
pub mod qwen3;
pub mod qwen3_5;
pub mod qwen3_moe;
