//! mlx-lm's quantization config: which modules are quantized, with what bits, group size and
//! mode, and per-module overrides keyed by module path.
//!
//! ```json
//! "quantization": {
//!     "group_size": 64, "bits": 4, "mode": "affine",
//!     "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
//!     "model.layers.0.mlp.gate": false
//! }
//! ```

use std::collections::BTreeMap;

use mlx::quantized::{QuantMode, QuantSpec};
use serde_json::{Map, Value};

use crate::{Error, Result};

/// The quantization of an mlx-lm checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizationConfig {
    /// The spec of modules without an override.
    pub default: QuantSpec,
    /// Per-module specs; `None` marks a module left unquantized.
    pub overrides: BTreeMap<String, Option<QuantSpec>>,
}

impl QuantizationConfig {
    /// Reads `quantization` (or mlx-lm's copy, `quantization_config`) from a model config;
    /// `None` if the checkpoint is not MLX-quantized.
    pub fn from_config(config: &Value) -> Result<Option<QuantizationConfig>> {
        let section = config.get("quantization").or_else(|| {
            // HF uses `quantization_config` for other schemes (GPTQ, AWQ …) too; only an
            // MLX-style one (with `bits`, without `quant_method`) is ours.
            config
                .get("quantization_config")
                .filter(|q| q.get("bits").is_some() && q.get("quant_method").is_none())
        });
        let Some(section) = section else {
            return Ok(None);
        };
        let object = section
            .as_object()
            .ok_or_else(|| Error::Config("quantization is not an object".into()))?;
        let default = spec_from(object, "quantization")?;
        let mut overrides = BTreeMap::new();
        for (key, value) in object {
            match value {
                Value::Object(o) => {
                    overrides.insert(key.clone(), Some(spec_from(o, key)?));
                }
                Value::Bool(false) => {
                    overrides.insert(key.clone(), None);
                }
                _ => {}
            }
        }
        Ok(Some(QuantizationConfig { default, overrides }))
    }

    /// The spec of module `path` (a weight name without `.weight`), or `None` if unquantized.
    pub fn spec_for(&self, path: &str) -> Option<QuantSpec> {
        match self.overrides.get(path) {
            Some(spec) => *spec,
            None => Some(self.default),
        }
    }
}

/// MLX's name for a mode, as mlx-lm writes it.
pub fn mode_from_name(name: &str) -> Option<QuantMode> {
    Some(match name {
        "affine" => QuantMode::Affine,
        "mxfp4" => QuantMode::Mxfp4,
        "mxfp8" => QuantMode::Mxfp8,
        "nvfp4" => QuantMode::Nvfp4,
        _ => return None,
    })
}

fn spec_from(object: &Map<String, Value>, what: &str) -> Result<QuantSpec> {
    let mode = match object.get("mode") {
        None => QuantMode::Affine,
        Some(v) => v
            .as_str()
            .and_then(mode_from_name)
            .ok_or_else(|| Error::Config(format!("{what}: unknown quantization mode {v}")))?,
    };
    let int = |key: &str| -> Result<Option<i32>> {
        match object.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| Error::Config(format!("{what}: {key} {v} is not a small integer"))),
        }
    };
    let bits = int("bits")?.ok_or_else(|| Error::Config(format!("{what}: bits is missing")))?;
    // mlx-lm omits the group size only for the fixed-group modes.
    let group_size = match (int("group_size")?, mode) {
        (Some(g), _) => g,
        (None, QuantMode::Nvfp4) => 16,
        (None, QuantMode::Mxfp4 | QuantMode::Mxfp8) => 32,
        (None, QuantMode::Affine) => {
            return Err(Error::Config(format!("{what}: group_size is missing")));
        }
    };
    if !(1..=8).contains(&bits) || group_size <= 0 {
        return Err(Error::Config(format!(
            "{what}: bits {bits} / group_size {group_size} are not a valid quantization"
        )));
    }
    Ok(QuantSpec {
        group_size,
        bits,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_defaults_and_overrides() {
        let config = json!({"quantization": {
            "group_size": 64, "bits": 4,
            "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
            "model.layers.0.mlp.gate": false,
        }});
        let q = QuantizationConfig::from_config(&config).unwrap().unwrap();
        assert_eq!(
            q.spec_for("model.layers.1.mlp.up_proj"),
            Some(QuantSpec::affine(64, 4))
        );
        assert_eq!(
            q.spec_for("model.layers.0.mlp.down_proj"),
            Some(QuantSpec::affine(32, 8))
        );
        assert_eq!(q.spec_for("model.layers.0.mlp.gate"), None);
    }

    #[test]
    fn reads_modes() {
        let config = json!({"quantization": {"bits": 4, "mode": "mxfp4"}});
        let q = QuantizationConfig::from_config(&config).unwrap().unwrap();
        assert_eq!(q.default.mode, QuantMode::Mxfp4);
        assert_eq!(q.default.group_size, 32);
    }

    #[test]
    fn ignores_other_schemes_and_refuses_nonsense() {
        let gptq = json!({"quantization_config": {"bits": 4, "quant_method": "gptq"}});
        assert_eq!(QuantizationConfig::from_config(&gptq).unwrap(), None);
        let bad = json!({"quantization": {"bits": 4, "group_size": 64, "mode": "int3"}});
        assert!(QuantizationConfig::from_config(&bad).is_err());
        let missing = json!({"quantization": {"group_size": 64}});
        assert!(QuantizationConfig::from_config(&missing).is_err());
    }
}
