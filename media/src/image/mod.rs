//! Images: decoding under limits ([`decode`]), preprocessing for an encoder ([`preprocess`]),
//! and tiling helpers ([`tiling`]).

pub(crate) mod decode;
pub(crate) mod preprocess;
pub(crate) mod tiling;
