//! The *write* phase: the plan carried out into an mlx-lm folder — `model.safetensors` with
//! quantized matrices as `<module>.weight/.scales/.biases`, and `config.json` with the
//! `quantization` section naming every layout, so a mixed model loads without guessing.
//!
//! One source tensor is in memory at a time, and the folder is only complete when
//! [`write_folder`] returns: callers write into a scratch folder and store it afterwards.

use std::collections::BTreeMap;
use std::path::Path;

use mlx::Dtype;
use mlx::quantized::{QuantSpec, Quantized, quantize};
use serde_json::{Map, Value, json};

use super::plan::{Action, Plan, TensorPlan};
use super::source::Stored;
use super::target::mode_name;
use crate::safetensors_writer::SafetensorsWriter;
use crate::{Checkpoint, Error, Result, Tensor};

/// What [`write_folder`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Tensors in `model.safetensors`, quantization companions included.
    pub tensors: usize,
    /// Matrices written quantized.
    pub quantized: usize,
    /// Bytes of `model.safetensors`.
    pub bytes: u64,
}

/// Writes `checkpoint`'s tensors into `dir` as `plan` says, with `config.json`; `progress`
/// hears `(done, total, tensor)` after each tensor. The vocabulary files are the caller's.
pub fn write_folder(
    checkpoint: &Checkpoint,
    plan: &Plan,
    dir: &Path,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Written> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut writer = SafetensorsWriter::create(&dir.join("model.safetensors"))?;
    // Module → layout of every matrix written quantized, for the config's section.
    let mut layouts: BTreeMap<String, QuantSpec> = BTreeMap::new();
    let total = plan.tensors.len();
    for (done, t) in plan.tensors.iter().enumerate() {
        let written = if t.members.is_empty() {
            carry_out(checkpoint, &t.name, t.stored, t.action, plan.compute)?
        } else {
            stacked(checkpoint, t, plan.compute)?
        };
        match written {
            Tensor::Dense(array) => writer.add(&t.name, &array)?,
            Tensor::Quantized(q) => {
                let module = t
                    .name
                    .strip_suffix(".weight")
                    .ok_or_else(|| Error::Unsupported {
                        name: t.name.clone(),
                        what: "only `<module>.weight` matrices can be stored quantized".into(),
                    })?;
                add_quantized(&mut writer, module, &q)?;
                layouts.insert(module.to_string(), q.spec);
            }
            Tensor::KBlocks(_) => {
                return Err(Error::Unsupported {
                    name: t.name.clone(),
                    what: "a k-block matrix is a loaded model's CPU form, not a stored one".into(),
                });
            }
        }
        progress(done + 1, total, &t.name);
    }
    let tensors = writer.len();
    let bytes = writer.finish()?;

    let mut config = checkpoint.config().clone();
    let object = config
        .as_object_mut()
        .ok_or_else(|| Error::Config("config.json is not an object".into()))?;
    object.remove("quantization");
    object.remove("quantization_config");
    if let Some(section) = quantization_section(&layouts) {
        // mlx-lm reads either key; transformers only the second.
        object.insert("quantization".into(), section.clone());
        object.insert("quantization_config".into(), section);
    }
    let config_path = dir.join("config.json");
    let mut text = serde_json::to_string_pretty(&config)
        .map_err(|e| Error::io(&config_path, std::io::Error::other(e)))?;
    text.push('\n');
    std::fs::write(&config_path, text).map_err(|e| Error::io(&config_path, e))?;
    Ok(Written {
        tensors,
        quantized: layouts.len(),
        bytes,
    })
}

/// Source tensor `name`, stored as `stored`, as `action` writes it.
fn carry_out(
    checkpoint: &Checkpoint,
    name: &str,
    stored: Stored,
    action: Action,
    compute: Dtype,
) -> Result<Tensor> {
    // A GGUF type with 16-element groups loads dense; its exact packed form (a byte per value
    // and a scale and bias per 16) loads back to the same values in under half the bytes.
    if action == Action::Keep
        && let Some(packed) = checkpoint.packed_16(name)?
    {
        return Ok(Tensor::Quantized(packed));
    }
    Ok(match (action, checkpoint.tensor(name)?) {
        // A kept FP8 or NVFP4 weight was decoded to f32; it is written in the model's float dtype.
        (Action::Keep, Tensor::Dense(array)) if matches!(stored, Stored::Fp8 | Stored::Nvfp4) => {
            Tensor::Dense(array.astype(compute)?)
        }
        (Action::Keep, tensor) => tensor,
        (Action::PassThrough(spec), Tensor::Quantized(q)) if q.spec == spec => Tensor::Quantized(q),
        (Action::Quantize(spec) | Action::Requantize(spec), tensor) => {
            let dense = tensor.into_dense(Some(compute))?;
            Tensor::Quantized(quantize(&dense, spec)?)
        }
        (Action::PassThrough(spec), _) => {
            return Err(Error::Unsupported {
                name: name.to_string(),
                what: format!("planned as stored in {spec:?}, but it is not"),
            });
        }
    })
}

/// One projection of every expert, each written as planned, stacked `[experts, out, in]`.
/// Only this projection of one block is in memory at once.
fn stacked(checkpoint: &Checkpoint, t: &TensorPlan, compute: Dtype) -> Result<Tensor> {
    let parts = t
        .members
        .iter()
        .map(|name| carry_out(checkpoint, name, t.stored, t.action, compute))
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&t.name, parts)
}

/// A quantized matrix in mlx-lm's layout.
fn add_quantized(writer: &mut SafetensorsWriter, module: &str, q: &Quantized) -> Result<()> {
    writer.add(&format!("{module}.weight"), &q.weights)?;
    writer.add(&format!("{module}.scales"), &q.scales)?;
    if let Some(biases) = &q.biases {
        writer.add(&format!("{module}.biases"), biases)?;
    }
    Ok(())
}

fn spec_json(spec: QuantSpec) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("group_size".into(), json!(spec.group_size));
    m.insert("bits".into(), json!(spec.bits));
    m.insert("mode".into(), json!(mode_name(spec.mode)));
    m
}

/// mlx-lm's `quantization` section: the most common layout as the default, every other one as
/// a per-module override. Modules written dense need no entry: a module is quantized only
/// where its `.scales` exist.
pub fn quantization_section(layouts: &BTreeMap<String, QuantSpec>) -> Option<Value> {
    let mut counts: Vec<(QuantSpec, usize)> = Vec::new();
    for spec in layouts.values() {
        match counts.iter_mut().find(|(s, _)| s == spec) {
            Some((_, n)) => *n += 1,
            None => counts.push((*spec, 1)),
        }
    }
    // Ties go to the first layout seen, so the section does not depend on hash order.
    let mut default: Option<(QuantSpec, usize)> = None;
    for (spec, n) in &counts {
        if default.is_none_or(|(_, best)| *n > best) {
            default = Some((*spec, *n));
        }
    }
    let (default, _) = default?;
    let mut section = spec_json(default);
    for (module, spec) in layouts {
        if *spec != default {
            section.insert(module.clone(), Value::Object(spec_json(*spec)));
        }
    }
    Some(Value::Object(section))
}
