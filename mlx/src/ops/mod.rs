//! Array operations, grouped by kind. All are lazy and return new arrays.

mod elementwise;
mod index;
mod reduce;
mod shape;
mod sort;

pub use elementwise::{Operand, r#where};
pub use index::SliceSpec;
pub use shape::{concatenate, stack};
