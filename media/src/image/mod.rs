//! Images: decoding under limits ([`decode`], JPEG pixels through [`jpeg`]), preprocessing for
//! an encoder ([`preprocess`]) with our own separable resize ([`resize`]), tiling helpers
//! ([`tiling`]), Gemma 3's crops of long images ([`pan_and_scan`]), and patches for
//! dynamic-resolution encoders ([`patches`]).

pub(crate) mod decode;
pub(crate) mod jpeg;
pub(crate) mod pan_and_scan;
pub(crate) mod patches;
pub(crate) mod preprocess;
pub(crate) mod resize;
pub(crate) mod tiling;
