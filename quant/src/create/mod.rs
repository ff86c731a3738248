//! `create`'s pipeline: *read* a checkpoint's tensor list and config, *classify* the source
//! (its precision, its towers), *plan* every tensor under the [policy](policy) for a
//! [`Target`], and *write* an mlx-lm folder. The runner stores the folder as a model (the
//! manifest) and adds the vocabulary.
//!
//! ```no_run
//! # fn main() -> quant::Result<()> {
//! use quant::create::{Plan, Source, Target, write_folder};
//! let checkpoint = quant::Checkpoint::open("model.gguf".as_ref())?;
//! let plan = Plan::new(&Source::read(&checkpoint)?, Target::Int4);
//! print!("{plan}"); // what --dry-run shows
//! write_folder(&checkpoint, &plan, "out".as_ref(), &mut |done, total, _| {
//!     eprintln!("{done}/{total}");
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! Files: `source` (read, classify), `target` (the quantizations on offer), `policy` (the
//! per-tensor rules), `plan`, `write`.

mod plan;
pub mod policy;
mod source;
mod target;
mod write;

pub use plan::{Action, Plan, TensorPlan};
pub use source::{Precision, Source, SourceTensor, Stored, Tower};
pub use target::{Target, UnknownTarget, mode_name, spec_label};
pub use write::{Written, quantization_section, write_folder};
