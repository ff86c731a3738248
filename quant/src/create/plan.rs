//! The *plan* phase: the policy's decision for every tensor, with what it costs, before any
//! data is read. `mlxkit create --dry-run` prints it.

use std::fmt;

use mlx::Dtype;
use mlx::quantized::{QuantMode, QuantSpec};

use super::policy::{Decision, decide};
use super::source::{Source, Stored};
use super::target::{Target, spec_label};
use crate::gguf_tensor::loaded_spec;

/// What the write phase does with one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Written exactly as the source loads it (dense in its dtype, or in its quantized layout).
    Keep,
    /// Quantized from floating-point weights.
    Quantize(QuantSpec),
    /// Already quantized another way: dequantized, then quantized to this layout.
    Requantize(QuantSpec),
    /// Already in this exact layout: copied without a round trip.
    PassThrough(QuantSpec),
}

impl Action {
    /// The layout written, for the quantizing actions.
    pub fn spec(self) -> Option<QuantSpec> {
        match self {
            Action::Keep => None,
            Action::Quantize(s) | Action::Requantize(s) | Action::PassThrough(s) => Some(s),
        }
    }
}

/// One tensor's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlan {
    /// The tensor's name (transformers' naming).
    pub name: String,
    /// Its logical shape.
    pub shape: Vec<i32>,
    /// How the source stores it.
    pub stored: Stored,
    /// What is done with it.
    pub action: Action,
    /// Why, when the policy has something to say (kept, promoted, a smaller group).
    pub reason: Option<String>,
    /// The source tensors written stacked as this one, in order (one projection of every
    /// expert of a mixture, as `[experts, out, in]`); empty when it is the source tensor of the
    /// same name.
    pub members: Vec<String>,
}

impl TensorPlan {
    fn elements(&self) -> u64 {
        self.shape
            .iter()
            .map(|&d| u64::try_from(d).unwrap_or(0))
            .product()
    }

    /// Bytes this tensor takes once written (an estimate for kept GGUF tensors, whose loaded
    /// form depends on the block type).
    pub fn written_bytes(&self, compute: Dtype) -> u64 {
        let elements = self.elements();
        match (self.action, self.stored) {
            (Action::Keep, Stored::Float(dtype)) => elements * dtype.size_of() as u64,
            (Action::Keep, Stored::Fp8 | Stored::Nvfp4) => elements * compute.size_of() as u64,
            (Action::Keep, Stored::Mlx(spec)) => quantized_bytes(elements, spec, compute),
            // Block types are written as they load, with f32 scales and biases.
            (Action::Keep, Stored::Gguf(ty)) => match (loaded_spec(ty), ty.block_layout()) {
                (Some(spec), _) => quantized_bytes(elements, spec, Dtype::F32),
                (None, Some((block, bytes))) => elements / block.max(1) * bytes,
                (None, None) => elements * 4,
            },
            (action, _) => action
                .spec()
                .map_or(0, |spec| quantized_bytes(elements, spec, compute)),
        }
    }
}

/// Packed weights plus per-group scales (and biases for affine, in `compute`; the
/// floating-point modes store one byte per scale).
fn quantized_bytes(elements: u64, spec: QuantSpec, compute: Dtype) -> u64 {
    let groups = elements / u64::try_from(spec.group_size.max(1)).unwrap_or(1);
    let per_group = match spec.mode {
        QuantMode::Affine => 2 * compute.size_of() as u64,
        _ => 1,
    };
    elements * u64::try_from(spec.bits).unwrap_or(0) / 8 + groups * per_group
}

/// A model's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The target quantization; `None` for a conversion that quantizes nothing.
    pub target: Option<Target>,
    /// The source's architecture.
    pub architecture: String,
    /// The source's precision, as a label.
    pub precision: String,
    /// The dtype quantization runs in and scales are stored in.
    pub compute: Dtype,
    /// Every tensor, in name order.
    pub tensors: Vec<TensorPlan>,
}

impl Plan {
    /// Applies the policy to every tensor of `source`.
    pub fn new(source: &Source, target: Target) -> Plan {
        Plan::build(source, Some(target))
    }

    /// Every tensor of `source` written as the checkpoint loads it, quantizing nothing: what
    /// `create` does with a GGUF file, so that loading it reads MLX's layouts from the blobs
    /// instead of repacking GGUF blocks every time. Block types repack without rounding.
    pub fn as_loaded(source: &Source) -> Plan {
        Plan::build(source, None)
    }

    fn build(source: &Source, target: Option<Target>) -> Plan {
        let tensors = source
            .tensors
            .iter()
            .map(|t| {
                let decision = match target {
                    Some(target) => decide(t, target),
                    None => Decision::Keep(as_loaded_reason(t.stored)),
                };
                let (action, reason) = match decision {
                    Decision::Keep(why) => (Action::Keep, Some(why)),
                    Decision::Quantize(spec, why) => {
                        let why = match t.stored {
                            Stored::Nvfp4 if spec.mode == QuantMode::Nvfp4 => Some(
                                "re-quantized: its per-tensor scale is not one MLX's matmul takes"
                                    .to_string(),
                            ),
                            _ => why,
                        };
                        let action = match t.stored {
                            Stored::Float(_) => Action::Quantize(spec),
                            Stored::Mlx(stored) if stored == spec => Action::PassThrough(spec),
                            Stored::Mlx(_) | Stored::Gguf(_) | Stored::Fp8 | Stored::Nvfp4 => {
                                Action::Requantize(spec)
                            }
                        };
                        (action, why)
                    }
                };
                TensorPlan {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    stored: t.stored,
                    action,
                    reason,
                    members: Vec::new(),
                }
            })
            .collect();
        let tensors = stack_experts(tensors);
        Plan {
            target,
            architecture: source.architecture.clone(),
            precision: source.precision_label(),
            compute: source.compute_dtype(),
            tensors,
        }
    }

    /// Bytes the written weights take.
    pub fn written_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.written_bytes(self.compute))
            .sum()
    }

    /// How many tensors each written layout gets, most common first: the first is the
    /// model's default in its `quantization` config section.
    pub fn layouts(&self) -> Vec<(QuantSpec, usize)> {
        let mut counts: Vec<(QuantSpec, usize)> = Vec::new();
        for spec in self.tensors.iter().filter_map(|t| t.action.spec()) {
            match counts.iter_mut().find(|(s, _)| *s == spec) {
                Some((_, n)) => *n += 1,
                None => counts.push((spec, 1)),
            }
        }
        counts.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| spec_label(a.0).cmp(&spec_label(b.0)))
        });
        counts
    }
}

/// Why a conversion keeps a tensor as it is: the layout a GGUF block type loads into.
fn as_loaded_reason(stored: Stored) -> String {
    match stored {
        Stored::Gguf(ty) => match loaded_spec(ty) {
            Some(spec) => format!("as loaded: {} without rounding", spec_label(spec)),
            None => "as loaded".to_string(),
        },
        _ => "as stored".to_string(),
    }
}

/// Where a tensor sits in a mixture's per-expert weights: `(experts module, expert index,
/// projection)`, for `<…>.experts.<index>.<projection>.weight`.
fn expert_member(name: &str) -> Option<(&str, usize, &str)> {
    let at = name.rfind(".experts.")?;
    let (module, rest) = (
        &name[..at + ".experts".len()],
        &name[at + ".experts.".len()..],
    );
    let (index, projection) = rest.split_once('.')?;
    let projection = projection.strip_suffix(".weight")?;
    if projection.contains(".experts.") {
        return None;
    }
    Some((module, index.parse().ok()?, projection))
}

/// Replaces each complete set of per-expert matrices of one projection (experts `0..n`, every
/// one the same shape and planned the same way) by one plan for
/// `<…>.experts.<projection>.weight` of shape `[n, out, in]`, the layout MLX's gathered
/// matmul reads: a stacked model loads without copying its experts together. A set that is
/// incomplete or mixed stays per expert, which loads too.
fn stack_experts(tensors: Vec<TensorPlan>) -> Vec<TensorPlan> {
    use std::collections::BTreeMap;
    let mut sets: BTreeMap<(String, String), Vec<(usize, usize)>> = BTreeMap::new();
    for (i, t) in tensors.iter().enumerate() {
        if let Some((module, index, projection)) = expert_member(&t.name) {
            sets.entry((module.to_string(), projection.to_string()))
                .or_default()
                .push((index, i));
        }
    }
    let mut stacked_away = vec![false; tensors.len()];
    let mut stacks = Vec::new();
    for ((module, projection), mut members) in sets {
        members.sort_unstable();
        let first = &tensors[members[0].1];
        let complete = members.len() > 1
            && members
                .iter()
                .enumerate()
                .all(|(e, &(index, _))| e == index);
        let alike = members.iter().all(|&(_, i)| {
            let t = &tensors[i];
            t.shape == first.shape && t.action == first.action && t.stored == first.stored
        });
        // A kept GGUF block type has no stacked form the loader reads.
        let stackable = !matches!(
            (first.action, first.stored),
            (Action::Keep, Stored::Gguf(_))
        );
        if !(complete && alike && stackable && first.shape.len() == 2) {
            continue;
        }
        let Ok(count) = i32::try_from(members.len()) else {
            continue;
        };
        let note = format!("{} experts stacked", members.len());
        stacks.push(TensorPlan {
            name: format!("{module}.{projection}.weight"),
            shape: [vec![count], first.shape.clone()].concat(),
            stored: first.stored,
            action: first.action,
            reason: Some(match &first.reason {
                Some(why) => format!("{why}; {note}"),
                None => note,
            }),
            members: members
                .iter()
                .map(|&(_, i)| tensors[i].name.clone())
                .collect(),
        });
        for &(_, i) in &members {
            stacked_away[i] = true;
        }
    }
    let mut out: Vec<TensorPlan> = tensors
        .into_iter()
        .zip(stacked_away)
        .filter_map(|(t, away)| (!away).then_some(t))
        .chain(stacks)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

impl fmt::Display for Plan {
    /// One line per tensor (name, shape, stored as, written as, why), then a summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A conversion writes scales as the source loads them (f32 for GGUF block types).
        let target = match self.target {
            Some(target) => format!("{target}; scales in {:?}", self.compute),
            None => "as loaded".to_string(),
        };
        writeln!(
            f,
            "source: {} ({}); target: {target}",
            self.architecture, self.precision
        )?;
        let width = self.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &self.tensors {
            let shape = format!("{:?}", t.shape);
            let written = match t.action {
                Action::Keep => "keep".to_string(),
                Action::Quantize(s) => spec_label(s),
                Action::Requantize(s) => format!("{} (requantized)", spec_label(s)),
                Action::PassThrough(s) => format!("{} (as stored)", spec_label(s)),
            };
            let line = format!(
                "{:width$}  {shape:16}  {:8}  {written:24}  {}",
                t.name,
                t.stored.label(),
                t.reason.as_deref().unwrap_or("")
            );
            writeln!(f, "{}", line.trim_end())?;
        }
        let kept = self
            .tensors
            .iter()
            .filter(|t| t.action == Action::Keep)
            .count();
        let layouts: Vec<String> = self
            .layouts()
            .iter()
            .map(|(s, n)| format!("{n} {}", spec_label(*s)))
            .collect();
        writeln!(
            f,
            "{} tensors: {}, {kept} kept; about {:.1} MB written",
            self.tensors.len(),
            if layouts.is_empty() {
                "none quantized".to_string()
            } else {
                layouts.join(", ")
            },
            self.written_bytes() as f64 / 1e6
        )
    }
}
