//! The policy: what happens to each tensor of a model when it is quantized.
//!
//! The rules follow what keeps a quantized model's output close to its source for little
//! size, as the upstream create and mlx-lm settle it:
//! - embeddings, norms, biases, convolutions and other non-matrices stay as they are: they are
//!   small, and the embedding is read one row per token;
//! - vision and audio towers stay at source precision: encoders are far more sensitive to
//!   4-bit weights than language layers (upstream measured 26–34% error on projected image
//!   features), small, and run once per input;
//! - MoE routers stay dense: a rounding error there picks other experts;
//! - the output head takes the 8-bit type of the target's family (int8 or mxfp8);
//! - under int4, `k_proj`, `v_proj` and `down_proj` are promoted to int8, the projections whose
//!   errors grow most through the layers;
//! - every other matrix takes the target's base type;
//! - a matrix whose row width the type's groups do not divide takes the nearest layout that
//!   fits (affine groups of 32) or stays dense, and the plan says which.
//!
//! The rules read transformers' tensor names, which every family here keeps (GGUF names are
//! translated when the checkpoint is read), so one policy serves every architecture.

use mlx::quantized::QuantSpec;

use super::source::SourceTensor;
use super::target::Target;

/// What the policy decides for one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Written as the source holds it, for this reason.
    Keep(String),
    /// Written quantized with this layout; the reason says why when it is not the base type.
    Quantize(QuantSpec, Option<String>),
}

/// The decision for `tensor` under `target`.
pub fn decide(tensor: &SourceTensor, target: Target) -> Decision {
    let name = tensor.name.as_str();
    let keep = |why: &str| Decision::Keep(why.to_string());
    if let Some(tower) = tower_of(name) {
        return keep(tower);
    }
    let Some(module) = name.strip_suffix(".weight") else {
        return keep("not a weight matrix");
    };
    let leaf = module.rsplit('.').next().unwrap_or(module);
    if is_embedding(module) {
        return keep("embedding");
    }
    if is_router(module, leaf) {
        return keep("router");
    }
    if module.contains("conv") {
        return keep("convolution");
    }
    if leaf.contains("norm") {
        return keep("norm");
    }
    let experts = module.contains("experts");
    match tensor.shape.len() {
        2 => {}
        3 if experts => {}
        _ => return keep("not a matrix"),
    }
    let (spec, why) = if name == "lm_head.weight" {
        (target.eight_bit(), Some("output head: 8-bit".to_string()))
    } else if target == Target::Int4 && matches!(leaf, "k_proj" | "v_proj" | "down_proj") {
        (
            target.eight_bit(),
            Some(format!("{leaf} promoted under int4")),
        )
    } else {
        (target.base(), None)
    };
    let width = tensor.shape.last().map_or(0, |&w| i64::from(w));
    match Target::aligned(spec, width) {
        Some(fitted) if fitted == spec => Decision::Quantize(spec, why),
        Some(fitted) => Decision::Quantize(
            fitted,
            Some(format!(
                "width {width} not a multiple of {}: groups of {}",
                spec.group_size, fitted.group_size
            )),
        ),
        None => Decision::Keep(format!(
            "width {width} not a multiple of {}",
            spec.group_size
        )),
    }
}

/// The encoder a tensor belongs to, by the prefixes transformers' multimodal families use.
fn tower_of(name: &str) -> Option<&'static str> {
    const VISION: &[&str] = &[
        "vision_tower",
        "vision_model",
        "visual.",
        "multi_modal_projector",
        "mm_projector",
        "embed_vision",
    ];
    const AUDIO: &[&str] = &[
        "audio_tower",
        "audio_model",
        "embed_audio",
        "audio_projector",
    ];
    let has = |parts: &[&str]| parts.iter().any(|p| name.contains(p));
    if has(VISION) {
        Some("vision tower")
    } else if has(AUDIO) {
        Some("audio tower")
    } else {
        None
    }
}

fn is_embedding(module: &str) -> bool {
    module.ends_with("embed_tokens")
        || module.ends_with("embed_tokens_per_layer")
        || module.ends_with("wte")
        || module.ends_with("word_embeddings")
}

/// MoE routers: a module named `gate` or `router` (not `gate_proj`), and the sigmoid gate of a
/// shared expert.
fn is_router(module: &str, leaf: &str) -> bool {
    matches!(leaf, "gate" | "router" | "shared_expert_gate")
        || module.ends_with("router.classifier")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::source::Stored;
    use mlx::Dtype;

    fn tensor(name: &str, shape: &[i32]) -> SourceTensor {
        SourceTensor {
            name: name.into(),
            shape: shape.to_vec(),
            stored: Stored::Float(Dtype::Bf16),
        }
    }

    fn spec_of(d: Decision) -> Option<QuantSpec> {
        match d {
            Decision::Quantize(spec, _) => Some(spec),
            Decision::Keep(_) => None,
        }
    }

    #[test]
    fn int4_promotes_sensitive_projections_and_keeps_the_rest_dense() {
        let int4 = Target::Int4;
        let q = |name: &str, shape: &[i32]| spec_of(decide(&tensor(name, shape), int4));
        let four = Some(QuantSpec::affine(64, 4));
        let eight = Some(QuantSpec::affine(64, 8));
        assert_eq!(
            q("model.layers.0.self_attn.q_proj.weight", &[512, 512]),
            four
        );
        assert_eq!(
            q("model.layers.0.self_attn.k_proj.weight", &[128, 512]),
            eight
        );
        assert_eq!(
            q("model.layers.0.self_attn.v_proj.weight", &[128, 512]),
            eight
        );
        assert_eq!(
            q("model.layers.0.mlp.down_proj.weight", &[512, 1024]),
            eight
        );
        assert_eq!(q("model.layers.0.mlp.up_proj.weight", &[1024, 512]), four);
        assert_eq!(q("lm_head.weight", &[1000, 512]), eight);
        assert_eq!(
            q("model.layers.0.mlp.experts.down_proj", &[8, 512, 1024]),
            None
        );
        assert_eq!(
            q(
                "model.layers.0.mlp.experts.gate_up_proj.weight",
                &[8, 2048, 512]
            ),
            four
        );
        for kept in [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.gate.weight",
            "model.vision_tower.encoder.layers.0.mlp.fc1.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.linear_attn.conv1d.weight",
        ] {
            assert_eq!(q(kept, &[64, 512]), None, "{kept}");
        }
        assert_eq!(q("model.layers.0.input_layernorm.weight", &[512]), None);
    }

    #[test]
    fn fp_targets_promote_only_the_head_and_fall_back_to_dense() {
        let d = |name: &str, shape: &[i32], t: Target| decide(&tensor(name, shape), t);
        assert_eq!(
            spec_of(d(
                "model.layers.0.mlp.down_proj.weight",
                &[512, 1024],
                Target::Nvfp4
            )),
            Some(Target::Nvfp4.base())
        );
        assert_eq!(
            spec_of(d("lm_head.weight", &[1000, 512], Target::Mxfp4)),
            Some(Target::Mxfp8.base())
        );
        let odd = d(
            "model.layers.0.mlp.up_proj.weight",
            &[64, 48],
            Target::Mxfp4,
        );
        assert_eq!(odd, Decision::Keep("width 48 not a multiple of 32".into()));
        let fallback = d("model.layers.0.mlp.up_proj.weight", &[64, 96], Target::Int8);
        assert!(
            matches!(&fallback, Decision::Quantize(s, Some(why)) if s.group_size == 32 && why.contains("groups of 32")),
            "{fallback:?}"
        );
    }
}
