//! Drafter heads that ship inside the binary, each trained for one catalog model
//! (`scripts/train_mtp_head.py`; how, and its held-out acceptance, in
//! `runner/heads/README.md`): `pull` stores a model's head beside it, and loading attaches it
//! (`nn::load::load_with_head`), so `draft: "mtp"` drafts with it.

/// The head's file name within a stored model.
pub const HEAD_FILE: &str = "mtp-head.safetensors";

/// SmolLM2-135M-Instruct's multi-token-prediction head, 8-bit.
const SMOLLM2_135M: &[u8] = include_bytes!("../heads/smollm2-135m-mtp.safetensors");

/// The head shipped for catalog model `name`, if one is.
pub fn for_model(name: &str) -> Option<&'static [u8]> {
    match name {
        "smollm2:135m" => Some(SMOLLM2_135M),
        _ => None,
    }
}
