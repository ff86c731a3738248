//! HF-style checkpoint directories: `config.json`, optional `generation_config.json`, and
//! weights in `model.safetensors` or shards listed by `model.safetensors.index.json`.
//!
//! mlx-lm's quantized layout is recognized here: a weight `<m>.weight` (packed `u32`) with
//! `<m>.scales` (and `<m>.biases` in affine mode) loads as one quantized tensor, with the spec
//! the config's `quantization` section gives module `<m>`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx::Array;
use mlx::quantized::{QuantSpec, Quantized};
use serde_json::Value;

use crate::mlx_quantization::QuantizationConfig;
use crate::safetensors::SafetensorsFile;
use crate::tensor::Tensor;
use crate::{Error, Result};

/// The index's tensor name → shard file name map.
type WeightMap = BTreeMap<String, String>;

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

/// Where an NVFP4 weight's parts are (see `fp8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nvfp4Layout {
    /// NVIDIA ModelOpt: `weight` (packed), `weight_scale`, `weight_scale_2`.
    ModelOpt,
    /// compressed-tensors: `weight_packed`, `weight_scale`, `weight_global_scale`.
    CompressedTensors,
}

/// MLX's NVFP4 layout: E2M1 values with an E4M3 scale per 16.
const NVFP4: QuantSpec = QuantSpec {
    group_size: 16,
    bits: 4,
    mode: mlx::quantized::QuantMode::Nvfp4,
};

/// A checkpoint directory with its shards opened and validated.
#[derive(Debug)]
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    location: BTreeMap<String, usize>,
    config: Value,
    generation_config: Option<Value>,
    quantization: Option<QuantizationConfig>,
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

impl SafetensorsDir {
    /// Opens `dir`: reads its configs and validates every shard's header.
    pub fn open(dir: &Path) -> Result<SafetensorsDir> {
        let config = read_json(&dir.join("config.json"))?;
        let generation_path = dir.join("generation_config.json");
        let generation_config = if generation_path.exists() {
            Some(read_json(&generation_path)?)
        } else {
            None
        };
        let quantization = QuantizationConfig::from_config(&config)?;
        Self::with_config(dir, config, generation_config, quantization)
    }

    /// Opens the safetensors files of `dir` with an already-read config.
    pub(crate) fn with_config(
        dir: &Path,
        config: Value,
        generation_config: Option<Value>,
        quantization: Option<QuantizationConfig>,
    ) -> Result<SafetensorsDir> {
        let (shard_names, index) = shard_list(dir)?;
        Self::from_shards(
            dir,
            shard_names,
            index,
            config,
            generation_config,
            quantization,
        )
    }

    /// Opens one safetensors file as a whole checkpoint.
    pub(crate) fn with_single_file(
        path: &Path,
        config: Value,
        quantization: Option<QuantizationConfig>,
    ) -> Result<SafetensorsDir> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::NotACheckpoint(path.to_path_buf()))?;
        Self::from_shards(dir, vec![name], None, config, None, quantization)
    }

    fn from_shards(
        dir: &Path,
        shard_names: Vec<String>,
        index: Option<WeightMap>,
        config: Value,
        generation_config: Option<Value>,
        quantization: Option<QuantizationConfig>,
    ) -> Result<SafetensorsDir> {
        let mut files = Vec::with_capacity(shard_names.len());
        let mut location = BTreeMap::new();
        for (i, shard) in shard_names.iter().enumerate() {
            let file = SafetensorsFile::open(&dir.join(shard))?;
            for name in file.entries().keys() {
                if let Some(previous) = location.insert(name.clone(), i) {
                    return Err(Error::malformed(
                        dir,
                        format!(
                            "tensor {name:?} is in both {} and {shard}",
                            shard_names[previous]
                        ),
                    ));
                }
            }
            files.push(file);
        }
        if let Some(index) = index {
            // The index must tell the truth about where each tensor is.
            for (name, shard) in index {
                let found = location.get(&name).map(|&i| shard_names[i].as_str());
                if found != Some(shard.as_str()) {
                    return Err(Error::malformed(
                        dir.join(INDEX_FILE),
                        format!("tensor {name:?} is listed in {shard} but that shard lacks it"),
                    ));
                }
            }
        }
        Ok(SafetensorsDir {
            dir: dir.to_path_buf(),
            files,
            location,
            config,
            generation_config,
            quantization,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// `generation_config.json`, if present.
    pub fn generation_config(&self) -> Option<&Value> {
        self.generation_config.as_ref()
    }

    /// The mlx-lm quantization, if the checkpoint is MLX-quantized.
    pub fn quantization(&self) -> Option<&QuantizationConfig> {
        self.quantization.as_ref()
    }

    /// Every stored tensor name, including quantization companions (`.scales`, `.biases`).
    pub fn raw_names(&self) -> impl Iterator<Item = &str> {
        self.location.keys().map(String::as_str)
    }

    /// Whether a tensor of this stored name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
            || name
                .strip_suffix(".weight")
                .is_some_and(|module| self.nvfp4_of(module).is_some())
    }

    /// Logical tensor names: the stored names less the `.scales`/`.biases` companions of a
    /// quantized weight.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .location
            .keys()
            .filter(|name| self.companion_of(name).is_none())
            .map(|name| match name.strip_suffix(".weight_packed") {
                // compressed-tensors' packed NVFP4 weight is the module's weight.
                Some(module) if self.nvfp4_of(module).is_some() => format!("{module}.weight"),
                _ => name.clone(),
            })
            .collect();
        names.sort();
        names
    }

    /// The NVFP4 layout of `module`'s weight, when it is stored as NVFP4.
    fn nvfp4_of(&self, module: &str) -> Option<Nvfp4Layout> {
        let scales = self.entry(&format!("{module}.weight_scale"))?;
        if !scales.e4m3 {
            return None;
        }
        let packed = |name: &str| {
            self.entry(name)
                .is_some_and(|e| e.dtype == mlx::Dtype::U8 && !e.e4m3)
        };
        let weight = format!("{module}.weight");
        if packed(&weight)
            && self
                .location
                .contains_key(&format!("{module}.weight_scale_2"))
        {
            return Some(Nvfp4Layout::ModelOpt);
        }
        let weight_packed = format!("{module}.weight_packed");
        (packed(&weight_packed)
            && self
                .location
                .contains_key(&format!("{module}.weight_global_scale")))
        .then_some(Nvfp4Layout::CompressedTensors)
    }

    /// The stored packed weight and f32 per-tensor scale of an NVFP4 module.
    fn nvfp4_parts(
        &self,
        module: &str,
        layout: Nvfp4Layout,
    ) -> Result<(String, crate::Nvfp4Global)> {
        let (packed, global_name) = match layout {
            Nvfp4Layout::ModelOpt => (
                format!("{module}.weight"),
                format!("{module}.weight_scale_2"),
            ),
            Nvfp4Layout::CompressedTensors => (
                format!("{module}.weight_packed"),
                format!("{module}.weight_global_scale"),
            ),
        };
        let global = self
            .load_raw(&global_name)?
            .astype(mlx::Dtype::F32)?
            .to_vec::<f32>()?;
        let &[value] = global.as_slice() else {
            return Err(Error::Unsupported {
                name: global_name,
                what: format!("a per-tensor scale of {} values", global.len()),
            });
        };
        let global = match layout {
            Nvfp4Layout::ModelOpt => crate::Nvfp4Global::Times(value),
            Nvfp4Layout::CompressedTensors => crate::Nvfp4Global::Over(value),
        };
        Ok((packed, global))
    }

    /// An NVFP4 weight: in MLX's own `nvfp4` layout when its per-tensor scale is 1 (the bytes
    /// are MLX's: two E2M1 codes per byte, low nibble first, and E4M3 scales per 16), else
    /// decoded to f32 — MLX's quantized matmul takes no per-tensor scale.
    fn nvfp4_tensor(&self, name: &str, module: &str, layout: Nvfp4Layout) -> Result<Tensor> {
        let (packed_name, global) = self.nvfp4_parts(module, layout)?;
        let shape = self.shape(name)?;
        let packed = self.load_raw(&packed_name)?;
        let scales = self.load_raw(&format!("{module}.weight_scale"))?;
        let unit = matches!(global, crate::Nvfp4Global::Times(g) | crate::Nvfp4Global::Over(g) if g == 1.0);
        if unit && shape.last().is_some_and(|c| c % 8 == 0) && shape.len() == 2 {
            let words = Array::from_bytes(
                &packed.to_vec::<u8>()?,
                &[shape[0], shape[1] / 8],
                mlx::Dtype::U32,
            )?;
            let quantized = Quantized {
                weights: words,
                scales,
                biases: None,
                spec: NVFP4,
            };
            check_quantized_shapes(name, &quantized)?;
            return Ok(Tensor::Quantized(quantized));
        }
        crate::fp8::dequantize_nvfp4(
            name,
            &packed.to_vec::<u8>()?,
            &shape,
            &scales.to_vec::<u8>()?,
            global,
        )
        .map(Tensor::Dense)
    }

    fn companion_of(&self, name: &str) -> Option<String> {
        if let Some(module) = [
            ".weight_scale_inv",
            ".weight_scale_2",
            ".weight_scale",
            ".input_scale",
            ".weight_global_scale",
            ".input_global_scale",
        ]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        {
            // An FP8 or NVFP4 weight's scales (see `fp8`).
            let weight = format!("{module}.weight");
            return (self.is_e4m3(&weight) || self.nvfp4_of(module).is_some()).then_some(weight);
        }
        let module = name
            .strip_suffix(".scales")
            .or_else(|| name.strip_suffix(".biases"))?;
        let weight = format!("{module}.weight");
        let has_scales = self.location.contains_key(&format!("{module}.scales"));
        (has_scales && self.location.contains_key(&weight)).then_some(weight)
    }

    fn entry(&self, name: &str) -> Option<&crate::SafetensorsEntry> {
        let &file = self.location.get(name)?;
        self.files[file].entries().get(name)
    }

    fn is_e4m3(&self, name: &str) -> bool {
        self.entry(name).is_some_and(|e| e.e4m3)
    }

    /// An FP8 weight decoded with its scales: `weight_scale_inv` per block of the config's
    /// `weight_block_size` (HF fine-grained FP8), else `weight_scale` (compressed-tensors).
    fn fp8_tensor(&self, name: &str, module: &str) -> Result<Tensor> {
        let entry = self
            .entry(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let shape = entry.shape.clone();
        let codes = self.load_raw(name)?.to_vec::<u8>()?;
        let block_scales = format!("{module}.weight_scale_inv");
        let shaped_scales = format!("{module}.weight_scale");
        let (scales_name, layout) = if self.location.contains_key(&block_scales) {
            let block = self
                .config
                .get("quantization_config")
                .and_then(|q| q.get("weight_block_size"))
                .and_then(Value::as_array)
                .map(|b| b.iter().filter_map(Value::as_u64).collect::<Vec<_>>())
                .unwrap_or_else(|| vec![128, 128]);
            let [rows, cols] = block[..] else {
                return Err(Error::Config(format!(
                    "weight_block_size {block:?} is not [rows, columns]"
                )));
            };
            let size = |n: u64| usize::try_from(n).unwrap_or(0);
            (
                block_scales,
                crate::fp8::Fp8Scales::Blocks {
                    rows: size(rows),
                    cols: size(cols),
                },
            )
        } else if self.location.contains_key(&shaped_scales) {
            (shaped_scales, crate::fp8::Fp8Scales::Shaped)
        } else {
            return Err(Error::Unsupported {
                name: name.to_string(),
                what: "an FP8 weight without `weight_scale_inv` or `weight_scale` beside it".into(),
            });
        };
        let scales = self.load_raw(&scales_name)?;
        let scale_shape = scales.shape();
        let scales = scales.astype(mlx::Dtype::F32)?.to_vec::<f32>()?;
        crate::fp8::dequantize_fp8(name, &codes, &shape, &scales, &scale_shape, layout)
            .map(Tensor::Dense)
    }

    /// The logical shape of tensor `name` (unpacked, for a quantized weight), without loading.
    pub fn shape(&self, name: &str) -> Result<Vec<i32>> {
        if let Some(module) = name.strip_suffix(".weight")
            && let Some(layout) = self.nvfp4_of(module)
        {
            let packed = match layout {
                Nvfp4Layout::ModelOpt => name.to_string(),
                Nvfp4Layout::CompressedTensors => format!("{module}.weight_packed"),
            };
            let mut shape = self
                .entry(&packed)
                .ok_or_else(|| Error::MissingTensor(packed.clone()))?
                .shape
                .clone();
            if let Some(last) = shape.last_mut() {
                *last = last.checked_mul(2).ok_or_else(|| Error::Unsupported {
                    name: name.to_string(),
                    what: "packed width too large".into(),
                })?;
            }
            return Ok(shape);
        }
        let &file = self
            .location
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let mut shape = self.files[file].entries()[name].shape.clone();
        let spec = name
            .strip_suffix(".weight")
            .filter(|module| self.location.contains_key(&format!("{module}.scales")))
            .and_then(|module| self.quantization.as_ref()?.spec_for(module));
        if let (Some(spec), Some(last)) = (spec, shape.last_mut()) {
            *last = i32::try_from(i64::from(*last) * 32 / i64::from(spec.bits)).map_err(|_| {
                Error::Unsupported {
                    name: name.to_string(),
                    what: format!("unpacked width of {last} words is too large"),
                }
            })?;
        }
        Ok(shape)
    }

    /// How tensor `name` is stored: its dtype, or its MLX quantization.
    pub fn stored_as(&self, name: &str) -> Result<crate::create::Stored> {
        if let Some(module) = name.strip_suffix(".weight")
            && let Some(layout) = self.nvfp4_of(module)
        {
            let (_, global) = self.nvfp4_parts(module, layout)?;
            let unit = matches!(global, crate::Nvfp4Global::Times(g) | crate::Nvfp4Global::Over(g) if g == 1.0);
            return Ok(if unit {
                crate::create::Stored::Mlx(NVFP4)
            } else {
                crate::create::Stored::Nvfp4
            });
        }
        let &file = self
            .location
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        if self.is_e4m3(name) {
            return Ok(crate::create::Stored::Fp8);
        }
        let spec = name
            .strip_suffix(".weight")
            .filter(|module| self.location.contains_key(&format!("{module}.scales")))
            .and_then(|module| self.quantization.as_ref()?.spec_for(module));
        Ok(match spec {
            Some(spec) => crate::create::Stored::Mlx(spec),
            None => crate::create::Stored::Float(self.files[file].entries()[name].dtype),
        })
    }

    fn load_raw(&self, name: &str) -> Result<mlx::Array> {
        let &file = self
            .location
            .get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        self.files[file].load(name)
    }

    /// Loads tensor `name`; a weight with stored scales loads quantized, except in the
    /// 16-element layout of a converted GGUF ([`crate::PACKED_16`]), which MLX's kernels do not
    /// take: that loads dense, exactly as the GGUF did, and [`SafetensorsDir::packed_16`] gives
    /// the packed form.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let Some(module) = name.strip_suffix(".weight") else {
            return Ok(Tensor::Dense(self.load_raw(name)?));
        };
        if self.is_e4m3(name) {
            return self.fp8_tensor(name, module);
        }
        if let Some(layout) = self.nvfp4_of(module) {
            return self.nvfp4_tensor(name, module, layout);
        }
        match self.quantized(name, module)? {
            None => Ok(Tensor::Dense(self.load_raw(name)?)),
            Some(q) if q.spec == crate::PACKED_16 => {
                Ok(Tensor::Dense(crate::dequantize_packed_16(name, &q)?))
            }
            Some(q) => Ok(Tensor::Quantized(q)),
        }
    }

    /// The packed form of weight `name` when it is stored in [`crate::PACKED_16`]'s layout.
    pub fn packed_16(&self, name: &str) -> Result<Option<Quantized>> {
        let Some(module) = name.strip_suffix(".weight") else {
            return Ok(None);
        };
        let packed = self.location.contains_key(&format!("{module}.scales"))
            && self.quantization.as_ref().and_then(|q| q.spec_for(module))
                == Some(crate::PACKED_16);
        if !packed || self.is_e4m3(name) || self.nvfp4_of(module).is_some() {
            return Ok(None);
        }
        self.quantized(name, module)
    }

    /// Weight `name` of `module` in MLX's quantized layout, if it has stored scales.
    fn quantized(&self, name: &str, module: &str) -> Result<Option<Quantized>> {
        let scales_name = format!("{module}.scales");
        if !self.location.contains_key(&scales_name) {
            return Ok(None);
        }
        let spec = self
            .quantization
            .as_ref()
            .and_then(|q| q.spec_for(module))
            .ok_or_else(|| Error::Unsupported {
                name: name.to_string(),
                what: "has quantization scales but config.json gives no quantization for it".into(),
            })?;
        let biases_name = format!("{module}.biases");
        let biases = if spec.mode.has_biases() {
            Some(self.load_raw(&biases_name)?)
        } else {
            None
        };
        let quantized = Quantized {
            weights: self.load_raw(name)?,
            scales: self.load_raw(&scales_name)?,
            biases,
            spec,
        };
        check_quantized_shapes(name, &quantized)?;
        Ok(Some(quantized))
    }
}

/// Checks that packed weights, scales and biases describe the same matrix under `spec`.
fn check_quantized_shapes(name: &str, q: &Quantized) -> Result<()> {
    let bad = |what: String| Error::Unsupported {
        name: name.to_string(),
        what,
    };
    let w = q.weights.shape();
    let s = q.scales.shape();
    let (Some((&packed, w_outer)), Some((&groups, s_outer))) = (w.split_last(), s.split_last())
    else {
        return Err(bad("quantized weight or scales have no dimensions".into()));
    };
    if q.weights.dtype() != mlx::Dtype::U32 {
        return Err(bad(format!(
            "packed weight has dtype {:?}, not u32",
            q.weights.dtype()
        )));
    }
    let columns = i64::from(packed) * 32 / i64::from(q.spec.bits);
    if w_outer != s_outer || columns != i64::from(groups) * i64::from(q.spec.group_size) {
        return Err(bad(format!(
            "packed weight {w:?} and scales {s:?} disagree with {} bits in groups of {}",
            q.spec.bits, q.spec.group_size
        )));
    }
    if let Some(b) = &q.biases
        && b.shape() != s
    {
        return Err(bad(format!(
            "biases {:?} differ from scales {s:?}",
            b.shape()
        )));
    }
    Ok(())
}

/// The shard file names, and the index's tensor → shard map when there is an index.
fn shard_list(dir: &Path) -> Result<(Vec<String>, Option<WeightMap>)> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.exists() {
        let index = read_json(&index_path)?;
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::malformed(&index_path, "weight_map is missing"))?;
        let mut weight_map = BTreeMap::new();
        for (name, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                Error::malformed(
                    &index_path,
                    format!("tensor {name:?}: shard is not a string"),
                )
            })?;
            if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
                return Err(Error::malformed(
                    &index_path,
                    format!("tensor {name:?}: shard {shard:?} is not a file in this directory"),
                ));
            }
            weight_map.insert(name.clone(), shard.to_string());
        }
        let mut shards: Vec<String> = weight_map.values().cloned().collect();
        shards.sort();
        shards.dedup();
        return Ok((shards, Some(weight_map)));
    }
    if dir.join(SINGLE_FILE).exists() {
        return Ok((vec![SINGLE_FILE.to_string()], None));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut shards = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".safetensors") {
            shards.push(name);
        }
    }
    if shards.is_empty() {
        return Err(Error::malformed(dir, "no .safetensors files"));
    }
    shards.sort();
    Ok((shards, None))
}
