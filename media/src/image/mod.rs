//! Images: decoding under limits ([`decode`]), preprocessing for an encoder ([`preprocess`])
//! with our own separable resize ([`resize`]), and tiling helpers ([`tiling`]).

pub(crate) mod decode;
pub(crate) mod preprocess;
pub(crate) mod resize;
pub(crate) mod tiling;
