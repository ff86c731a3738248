//! Vision encoders, one file each: images in, one feature vector per patch out. The families
//! that use them (`arch/`) pool and project those features into their text model's width.

pub mod qwen2_5_vl;
pub mod siglip;
