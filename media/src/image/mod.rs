//! Images: decoding under limits ([`decode`]), preprocessing for an encoder ([`preprocess`])
//! with our own separable resize ([`resize`]), tiling helpers ([`tiling`]), and patches for
//! dynamic-resolution encoders ([`patches`]).

pub(crate) mod decode;
pub(crate) mod jpeg;
pub(crate) mod patches;
pub(crate) mod preprocess;
pub(crate) mod resize;
pub(crate) mod tiling;
