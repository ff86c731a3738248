//! `Weights`: the named tensors of a checkpoint, handed out to layers as they are built.
//!
//! Dense tensors are converted to the compute dtype when taken (f32 on CPU, bf16 on GPU);
//! quantized ones keep their packing, with scales and biases in the compute dtype. Every tensor
//! taken is tracked, so a loader can report weights the architecture never used.

use std::collections::{BTreeMap, BTreeSet};

use mlx::k_blocks::KBlocks;
use mlx::quantized::{QuantSpec, Quantized};
use mlx::{Array, Dtype};

use crate::linear::{Linear, Tensor};
use crate::pipeline_parallel::PipelineStage;
use crate::tensor_parallel::TensorParallel;
use crate::{Error, Result};

/// Named tensors and the dtype layers compute in.
pub struct Weights {
    tensors: BTreeMap<String, Tensor>,
    taken: BTreeSet<String>,
    /// Tensors already made into layers and released (see [`Weights::settle`]).
    settled: BTreeSet<String>,
    dtype: Dtype,
    dequantize: bool,
    packed_copies: bool,
    packed_forms: BTreeMap<String, Quantized>,
    /// This process's slice of a model split across ranks, when it is.
    tensor_parallel: Option<TensorParallel>,
    /// This process's range of a model's layers, when they are split across ranks.
    pipeline_stage: Option<PipelineStage>,
    /// Whether a projection was handed out split across the tensor-parallel group.
    split: bool,
    /// Whether layers take k-quant matrices in the k-block form ([`Weights::with_k_blocks`]).
    k_blocks: bool,
}

impl Weights {
    /// Wraps `tensors`; dense ones are converted to `dtype` when taken.
    pub fn new(tensors: impl IntoIterator<Item = (String, Tensor)>, dtype: Dtype) -> Weights {
        Weights {
            tensors: tensors.into_iter().collect(),
            taken: BTreeSet::new(),
            settled: BTreeSet::new(),
            dtype,
            dequantize: false,
            packed_copies: false,
            packed_forms: BTreeMap::new(),
            tensor_parallel: None,
            pipeline_stage: None,
            split: false,
            k_blocks: false,
        }
    }

    /// Whether the family split any projection across the tensor-parallel group: one that
    /// does not know how would leave every projection whole.
    pub fn was_split(&self) -> bool {
        self.split
    }

    /// Reads only `stage`'s layers of the model (its family asks which,
    /// [`Weights::pipeline_stage`]).
    pub fn with_pipeline_stage(mut self, stage: PipelineStage) -> Weights {
        self.pipeline_stage = Some(stage);
        self
    }

    /// The pipeline stage this model is loaded as, if any.
    pub fn pipeline_stage(&self) -> Option<&PipelineStage> {
        self.pipeline_stage.as_ref()
    }

    /// Whether decoder layer `layer` (its tensors under `prefix`, dot included) is another
    /// pipeline stage's: its tensors are then set aside, for that stage reads them.
    pub fn is_another_stages(&mut self, layer: usize, prefix: &str) -> bool {
        let theirs = self
            .pipeline_stage
            .as_ref()
            .is_some_and(|stage| !stage.holds(layer));
        if theirs {
            self.set_aside(prefix);
        }
        theirs
    }

    /// Hands out this rank's slice of the model `parallel` splits: its projections through
    /// [`Weights::column_parallel`] and [`Weights::row_parallel`].
    pub fn with_tensor_parallel(mut self, parallel: TensorParallel) -> Weights {
        self.tensor_parallel = Some(parallel);
        self
    }

    /// The split this model is loaded for, if any.
    pub fn tensor_parallel(&self) -> Option<&TensorParallel> {
        self.tensor_parallel.as_ref()
    }

    /// `prefix` (`[out, in]`, with its bias when `bias`) as a column-parallel projection: this
    /// rank's slice of the output rows when the model is split, the whole otherwise.
    pub fn column_parallel(
        &mut self,
        prefix: &str,
        out: i32,
        inp: i32,
        bias: bool,
    ) -> Result<Linear> {
        let whole = self.projection(prefix, out, inp, bias)?;
        let Some(parallel) = self.tensor_parallel.clone() else {
            return Ok(whole);
        };
        let (start, end) = parallel.slice(out, &format!("output rows of `{prefix}`"))?;
        self.split = true;
        let (weight, bias) = whole.into_parts();
        let weight = owned(dense_for_parallel(prefix, weight)?.slice_axis(0, start, end)?)?;
        let bias = bias
            .map(|b| owned(b.slice_axis(0, start, end)?))
            .transpose()?;
        Ok(Linear::new(Tensor::Dense(weight), bias))
    }

    /// `prefix` (`[out, in]`) as a row-parallel projection: this rank's slice of the input
    /// columns, its products summed over the ranks before the bias, when the model is split;
    /// the whole otherwise.
    pub fn row_parallel(&mut self, prefix: &str, out: i32, inp: i32, bias: bool) -> Result<Linear> {
        let whole = self.projection(prefix, out, inp, bias)?;
        let Some(parallel) = self.tensor_parallel.clone() else {
            return Ok(whole);
        };
        let (start, end) = parallel.slice(inp, &format!("input columns of `{prefix}`"))?;
        self.split = true;
        let (weight, bias) = whole.into_parts();
        let weight = owned(dense_for_parallel(prefix, weight)?.slice_axis(1, start, end)?)?;
        Ok(Linear::new(Tensor::Dense(weight), bias).summed_over(parallel))
    }

    /// Hands quantized tensors out dequantized to the compute dtype. On a CPU, MLX's quantized
    /// matmul is a plain loop while dense f32 goes through BLAS, so for models whose dense
    /// weights fit in memory this trades memory for an order of magnitude of prefill speed.
    pub fn dequantized(mut self, yes: bool) -> Weights {
        self.dequantize = yes;
        self
    }

    /// With [`Weights::dequantized`], also keeps each quantized matrix's packed form when the
    /// CPU has a packed kernel for its layout ([`mlx::quantized::QuantSpec::has_packed_cpu_matvec`]):
    /// [`Weights::linear`], [`Weights::matrix`] and [`Weights::packed`] hand it out, and decode
    /// steps read it while prompts go through BLAS on the dense copy.
    pub fn with_packed_copies(mut self, yes: bool) -> Weights {
        self.packed_copies = yes;
        self
    }

    /// Packed forms of tensors that load dense (GGUF's 16-element-group k-quants, see
    /// `quant::Checkpoint::packed_16`), handed out like the packed copies of quantized ones.
    pub fn with_packed_forms(
        mut self,
        forms: impl IntoIterator<Item = (String, Quantized)>,
    ) -> Weights {
        self.packed_forms.extend(forms);
        self
    }

    /// Layers and tables made from now on take a quantized matrix whose values are a GGUF
    /// k-quant's (Q4_K, Q6_K) in the CPU's k-block form ([`mlx::k_blocks`]): fewer bytes per
    /// weight, read in one stream. For a model that stays quantized on a CPU.
    pub fn with_k_blocks(mut self, yes: bool) -> Weights {
        self.k_blocks = yes;
        self
    }

    /// `tensor` as a layer or table takes it: in the k-block form when
    /// [`Weights::with_k_blocks`] asks for it and its values allow it, else as it is.
    fn layer_form(&self, tensor: Tensor) -> Result<Tensor> {
        match &tensor {
            Tensor::Quantized(q) if self.k_blocks && !self.dequantize => {
                Ok(match KBlocks::from_affine(q)? {
                    Some(blocks) => Tensor::KBlocks(blocks),
                    None => tensor,
                })
            }
            _ => Ok(tensor),
        }
    }

    /// The token table `name`, dense or quantized, in the form a lookup and a tied head read
    /// (see [`Weights::with_k_blocks`]); an error naming it when absent.
    pub fn table(&mut self, name: &str) -> Result<Tensor> {
        let table = self.weight(name)?;
        let table = self.layer_form(table)?;
        if matches!(table, Tensor::KBlocks(_)) {
            // The stored form goes now, as a layer's does (`settle`): held to the end of the
            // load beside its k-block form, a 1B's tied Q6_K table (394 MB affine) raised the
            // peak RSS past the affine layout's.
            self.tensors.remove(name);
            self.settled.insert(name.to_string());
        }
        Ok(table)
    }

    /// The packed form of quantized tensor `name`, scales and biases in the compute dtype, when
    /// packed copies are kept for it (see [`Weights::with_packed_copies`]).
    pub fn packed(&self, name: &str) -> Result<Option<Quantized>> {
        if !(self.dequantize && self.packed_copies) {
            return Ok(None);
        }
        let q = match (self.tensors.get(name), self.packed_forms.get(name)) {
            (_, Some(form)) => form,
            (Some(Tensor::Quantized(q)), None) => q,
            _ => return Ok(None),
        };
        let Some(q) = packed_kernel_form(q)? else {
            return Ok(None);
        };
        match Tensor::Quantized(q).to_dtype(self.dtype)? {
            Tensor::Quantized(q) => Ok(Some(q)),
            Tensor::Dense(_) | Tensor::KBlocks(_) => Ok(None),
        }
    }

    /// The compute dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Whether a tensor of this name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.settled.contains(name)
    }

    /// Marks every tensor under `prefix` as used without loading it, for parts of a checkpoint
    /// a family reads elsewhere or not at all (a vision tower in a text-only load); say why at
    /// the call. Returns how many there were.
    pub fn set_aside(&mut self, prefix: &str) -> usize {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        let count = names.len();
        self.taken.extend(names);
        count
    }

    /// Renames every tensor under `from` to lie under `to` instead (its taken mark and packed
    /// form with it), for a family that builds another family's model from a part of its
    /// checkpoint (LLaVA's `language_model.model.…` read as a text checkpoint's `model.…`).
    /// Returns how many were renamed; a new name already held by another tensor is an error
    /// naming it.
    pub fn rename_prefix(&mut self, from: &str, to: &str) -> Result<usize> {
        let names: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| k.starts_with(from))
            .cloned()
            .collect();
        for name in &names {
            let renamed = format!("{to}{}", &name[from.len()..]);
            if self.tensors.contains_key(&renamed) {
                return Err(Error::Weights(format!(
                    "`{name}` would be read as `{renamed}`, which the checkpoint also holds"
                )));
            }
        }
        for name in &names {
            let renamed = format!("{to}{}", &name[from.len()..]);
            if let Some(tensor) = self.tensors.remove(name) {
                self.tensors.insert(renamed.clone(), tensor);
            }
            if self.taken.remove(name) {
                self.taken.insert(renamed.clone());
            }
            if let Some(form) = self.packed_forms.remove(name) {
                self.packed_forms.insert(renamed, form);
            }
        }
        Ok(names.len())
    }

    /// Names of tensors never taken.
    pub fn unused(&self) -> Vec<&str> {
        self.tensors
            .keys()
            .filter(|k| !self.taken.contains(*k))
            .map(String::as_str)
            .collect()
    }

    /// Refuses a tensor that a layer has already taken and released: a second reader of it
    /// would otherwise be told it is missing from the checkpoint.
    fn absent(&self, name: &str) -> Result<()> {
        if self.settled.contains(name) {
            return Err(Error::Weights(format!(
                "tensor `{name}` was already made into a layer, and is read a second time"
            )));
        }
        Ok(())
    }

    /// The tensor `name`, dense or quantized, or `None`.
    pub fn optional(&mut self, name: &str) -> Result<Option<Tensor>> {
        let Some(tensor) = self.tensors.get(name) else {
            return self.absent(name).map(|()| None);
        };
        self.taken.insert(name.to_string());
        Ok(Some(match tensor {
            Tensor::Quantized(_) if self.dequantize => {
                Tensor::Dense(tensor.clone().into_dense(Some(self.dtype))?)
            }
            _ => tensor.to_dtype(self.dtype)?,
        }))
    }

    /// The tensor `name` exactly as the checkpoint stores it (its own dtype; quantized stays
    /// quantized), for a table read a few rows at a time: widening all of it to the compute
    /// dtype would cost memory for no arithmetic (Gemma 4's per-layer embeddings are 2.3 G
    /// entries in its 2B model). The caller widens what it gathers.
    pub fn stored(&mut self, name: &str) -> Result<Tensor> {
        self.absent(name)?;
        let tensor = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::Weights(format!("tensor `{name}` is missing")))?
            .clone();
        self.taken.insert(name.to_string());
        Ok(tensor)
    }

    /// The tensor `name`, dense or quantized; an error naming it when absent.
    pub fn weight(&mut self, name: &str) -> Result<Tensor> {
        self.optional(name)?
            .ok_or_else(|| Error::Weights(format!("tensor `{name}` is missing")))
    }

    /// A floating-point tensor (quantized ones are dequantized), checked against `shape`.
    pub fn dense(&mut self, name: &str, shape: &[i32]) -> Result<Array> {
        let array = match self.weight(name)? {
            Tensor::Dense(a) => a,
            quantized => quantized.into_dense(Some(self.dtype))?,
        };
        if array.shape() != shape {
            return Err(Error::Weights(format!(
                "tensor `{name}` has shape {:?}, expected {shape:?}",
                array.shape()
            )));
        }
        Ok(array)
    }

    /// `prefix.weight` checked to be `[out, in]`, as a bias-free [`Linear`] (with its packed
    /// copy, if kept), for projections that are fused before use and so must not carry a bias.
    pub fn matrix(&mut self, prefix: &str, out: i32, inp: i32) -> Result<Linear> {
        if self.contains(&format!("{prefix}.bias")) {
            return Err(Error::Weights(format!(
                "`{prefix}` has a bias, which this architecture does not support"
            )));
        }
        let name = format!("{prefix}.weight");
        let weight = self.weight(&name)?;
        check_matrix(&name, &weight, out, inp)?;
        let weight = self.layer_form(weight)?;
        let linear = Linear::new(weight, None).with_packed(self.packed(&name)?);
        self.settle(&name, linear)
    }

    /// A projection `[out, in]` under `prefix`: with its bias when the architecture's config
    /// says the projections have one ([`Weights::linear`]), bias-free otherwise
    /// ([`Weights::matrix`], which refuses a stray bias).
    pub fn projection(&mut self, prefix: &str, out: i32, inp: i32, bias: bool) -> Result<Linear> {
        if bias {
            self.linear(prefix, out, inp)
        } else {
            self.matrix(prefix, out, inp)
        }
    }

    /// `prefix.weight` and, when present, `prefix.bias` as a [`Linear`] of `[out, in]`.
    pub fn linear(&mut self, prefix: &str, out: i32, inp: i32) -> Result<Linear> {
        let name = format!("{prefix}.weight");
        let weight = self.weight(&name)?;
        check_matrix(&name, &weight, out, inp)?;
        let bias = match self.optional(&format!("{prefix}.bias"))? {
            None => None,
            Some(Tensor::Dense(b)) => {
                if b.shape() != [out] {
                    return Err(Error::Weights(format!(
                        "tensor `{prefix}.bias` has shape {:?}, expected [{out}]",
                        b.shape()
                    )));
                }
                Some(b)
            }
            Some(Tensor::Quantized(_) | Tensor::KBlocks(_)) => {
                return Err(Error::Weights(format!(
                    "tensor `{prefix}.bias` is quantized"
                )));
            }
        };
        let weight = self.layer_form(weight)?;
        let linear = Linear::new(weight, bias).with_packed(self.packed(&name)?);
        self.settle(&name, linear)
    }

    /// Evaluates `linear`, built from the checkpoint's tensor `name`, and lets the stored form
    /// go. Checkpoint tensors are read before the model is built, and a stored matrix is not
    /// what layers keep: they keep it dense in the compute dtype, or repacked with scales in
    /// that dtype. Held to the end of the load, every stored matrix stayed resident beside
    /// what was made of it until then, and the allocator kept the freed pages a while longer:
    /// evaluating each layer as it is built took SmolLM2 135M's peak RSS from 660 to 616 MB.
    fn settle(&mut self, name: &str, linear: Linear) -> Result<Linear> {
        let linear = linear.evaluated()?;
        self.tensors.remove(name);
        self.settled.insert(name.to_string());
        Ok(linear)
    }
}

/// Checks that a (possibly packed) weight is `[out, in]`.
pub(crate) fn check_matrix(name: &str, weight: &Tensor, out: i32, inp: i32) -> Result<()> {
    let (rows, cols) = match weight {
        Tensor::Dense(w) => {
            let s = w.shape();
            if s.len() != 2 {
                return Err(Error::Weights(format!(
                    "tensor `{name}` has shape {s:?}, expected [{out}, {inp}]"
                )));
            }
            (s[0], s[1])
        }
        Tensor::Quantized(q) => {
            let s = q.weights.shape();
            if s.len() != 2 {
                return Err(Error::Weights(format!(
                    "tensor `{name}` has packed shape {s:?}"
                )));
            }
            // u32 words hold 32 / bits values.
            (s[0], s[1] * 32 / q.spec.bits)
        }
        Tensor::KBlocks(k) => {
            let [rows, cols] = k.shape();
            (rows as i32, cols as i32)
        }
    };
    if (rows, cols) != (out, inp) {
        return Err(Error::Weights(format!(
            "tensor `{name}` is [{rows}, {cols}], expected [{out}, {inp}]"
        )));
    }
    Ok(())
}

/// `part` in memory of its own. A slice is a view of its whole matrix and would keep it alive,
/// so every rank would hold every rank's weights; copied out, the whole is freed once the load
/// drops it.
fn owned(part: Array) -> Result<Array> {
    Ok(Array::from_bytes(
        &part.to_bytes()?,
        &part.shape(),
        part.dtype(),
    )?)
}

/// A split projection's weight as a dense matrix: quantized ones are refused by name until
/// their packed rows are split.
fn dense_for_parallel(prefix: &str, weight: Tensor) -> Result<Array> {
    match weight {
        Tensor::Dense(a) => Ok(a),
        Tensor::Quantized(_) | Tensor::KBlocks(_) => Err(Error::Weights(format!(
            "`{prefix}` is quantized; a tensor-parallel load splits dense weights only (load \
             it dequantized)"
        ))),
    }
}

/// `q` in a layout the packed CPU kernel multiplies: as it is, or with fewer bits than the
/// kernel takes (GGUF's Q5 types, MLX's 5- and 6-bit ones) widened to 8 bits, exactly. `None`
/// where the kernel takes neither.
pub(crate) fn packed_kernel_form(q: &Quantized) -> Result<Option<Quantized>> {
    if q.spec.has_packed_cpu_matvec() {
        Ok(Some(q.clone()))
    } else if q.spec.bits < 8 && (QuantSpec { bits: 8, ..q.spec }).has_packed_cpu_matvec() {
        Ok(Some(quant::widen_to_8_bits(q)?))
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_prefix_moves_names_and_marks_and_refuses_collisions() {
        let one = || Tensor::Dense(Array::from_slice(&[1f32], &[1]).unwrap());
        let mut weights = Weights::new(
            [
                ("language_model.model.norm.weight".to_string(), one()),
                ("language_model.model.embed.weight".to_string(), one()),
                ("vision.weight".to_string(), one()),
            ],
            Dtype::F32,
        );
        weights.weight("language_model.model.norm.weight").unwrap();
        assert_eq!(
            weights
                .rename_prefix("language_model.model.", "model.")
                .unwrap(),
            2
        );
        assert!(weights.contains("model.embed.weight"));
        assert!(!weights.contains("language_model.model.embed.weight"));
        // The tensor taken before the rename stays taken under its new name.
        assert_eq!(weights.unused(), ["model.embed.weight", "vision.weight"]);
        assert_eq!(weights.rename_prefix("absent.", "model.").unwrap(), 0);
        let error = weights
            .rename_prefix("vision.", "model.embed.")
            .unwrap_err();
        assert!(error.to_string().contains("model.embed.weight"), "{error}");
        assert!(
            weights.contains("vision.weight"),
            "nothing moved on a collision"
        );
    }

    #[test]
    fn quantized_weights_with_f16_scales_dequantize_in_the_compute_dtype() {
        // Values whose affine reconstruction needs more than f16's 11 significant bits.
        let values: Vec<f32> = (0..64 * 4)
            .map(|i| ((i * 37) % 101) as f32 * 0.0123 - 0.6)
            .collect();
        let dense = Array::from_slice(&values, &[4, 64]).unwrap();
        let q = mlx::quantized::quantize(&dense, QuantSpec::affine(32, 4)).unwrap();
        let half = Quantized {
            scales: q.scales.astype(Dtype::F16).unwrap(),
            biases: q.biases.as_ref().map(|b| b.astype(Dtype::F16).unwrap()),
            ..q.clone()
        };
        // The reference: the same f16 scales and biases, widened, reconstructed in f32.
        let exact = Quantized {
            scales: half.scales.astype(Dtype::F32).unwrap(),
            biases: half.biases.as_ref().map(|b| b.astype(Dtype::F32).unwrap()),
            ..q.clone()
        }
        .dequantize(Some(Dtype::F32))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
        let mut weights = Weights::new([("w".to_string(), Tensor::Quantized(half))], Dtype::F32)
            .dequantized(true);
        let Some(Tensor::Dense(got)) = weights.optional("w").unwrap() else {
            panic!("not handed out dense");
        };
        assert_eq!(got.dtype(), Dtype::F32);
        assert_eq!(got.to_vec::<f32>().unwrap(), exact);
    }

    #[test]
    fn a_matrix_made_into_a_layer_is_released_and_cannot_be_read_again() {
        let matrix = Array::from_slice(&[1f32, 2., 3., 4.], &[2, 2]).unwrap();
        let mut weights = Weights::new(
            [("proj.weight".to_string(), Tensor::Dense(matrix))],
            Dtype::F32,
        );
        let layer = weights.matrix("proj", 2, 2).unwrap();
        let Tensor::Dense(w) = layer.weight() else {
            panic!("not dense");
        };
        assert_eq!(w.to_vec::<f32>().unwrap(), [1., 2., 3., 4.]);
        assert!(weights.tensors.is_empty(), "the stored form is still held");
        assert!(weights.contains("proj.weight"));
        assert!(weights.unused().is_empty());
        let error = weights.weight("proj.weight").unwrap_err();
        assert!(
            error.to_string().contains("already made into a layer"),
            "{error}"
        );
    }
}
