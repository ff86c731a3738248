//! Vision encoders, one file each: images in, one feature vector per patch out. The families
//! that use them (`arch/`) pool and project those features into their text model's width and
//! put them in place of the prompt's image tokens (the crate's `placement`).

pub mod clip;
pub mod qwen2_5_vl;
pub mod siglip;
mod vit;
