//! Elementwise arithmetic, comparisons, activations, casts and matmul.

use std::borrow::Cow;

use mlx_sys::ffi::{self, BinaryOp, UnaryOp};

use crate::{Array, Dtype, Result};

/// The right-hand side of a binary op: an array, or a scalar that takes the other operand's
/// floating dtype (so `x * 0.5` stays bf16 for a bf16 `x` instead of promoting to f32).
pub trait Operand {
    /// This operand as an array to combine with `like`.
    fn to_operand(&self, like: &Array) -> Result<Cow<'_, Array>>;
}

impl Operand for Array {
    fn to_operand(&self, _like: &Array) -> Result<Cow<'_, Array>> {
        Ok(Cow::Borrowed(self))
    }
}

impl Operand for &Array {
    fn to_operand(&self, _like: &Array) -> Result<Cow<'_, Array>> {
        Ok(Cow::Borrowed(*self))
    }
}

impl Operand for f32 {
    fn to_operand(&self, like: &Array) -> Result<Cow<'_, Array>> {
        let dtype = like.dtype();
        let dtype = if dtype.is_float() { dtype } else { Dtype::F32 };
        Ok(Cow::Owned(Array::scalar(*self, dtype)?))
    }
}

impl Operand for i32 {
    fn to_operand(&self, like: &Array) -> Result<Cow<'_, Array>> {
        let dtype = like.dtype();
        if dtype == Dtype::Bool {
            return Ok(Cow::Owned(Array::scalar_int(*self, Dtype::I32)?));
        }
        Ok(Cow::Owned(Array::scalar_int(*self, dtype)?))
    }
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<Array> {
                    Array::from_raw(ffi::unary(UnaryOp::$op, self.raw())?)
                }
            )*
        }
    };
}

unary_ops! {
    /// `-x`.
    negative => Negative;
    /// `|x|`.
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// `ln(1 + x)`, accurate near zero.
    log1p => Log1p;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// `x²`.
    square => Square;
    /// `1 / x`.
    reciprocal => Reciprocal;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid;
    /// The error function.
    erf => Erf;
    /// Rounds down.
    floor => Floor;
    /// Rounds up.
    ceil => Ceil;
    /// Boolean negation.
    logical_not => LogicalNot;
    /// Which elements are NaN.
    is_nan => IsNan;
    /// Blocks gradients (a no-op for inference).
    stop_gradient => StopGradient;
    /// `x · sigmoid(x)`.
    silu => Silu;
    /// Exact GELU, `x · (1 + erf(x/√2)) / 2`.
    gelu => Gelu;
    /// GELU with the tanh approximation, as Gemma uses.
    gelu_tanh => GeluTanh;
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self, other: impl Operand) -> Result<Array> {
                    let other = other.to_operand(self)?;
                    Array::from_raw(ffi::binary(BinaryOp::$op, self.raw(), other.raw())?)
                }
            )*
        }
    };
}

binary_ops! {
    /// `self + other`, broadcasting.
    add => Add;
    /// `self - other`, broadcasting.
    subtract => Subtract;
    /// `self * other`, broadcasting.
    multiply => Multiply;
    /// `self / other`, broadcasting.
    divide => Divide;
    /// Remainder with the sign of the divisor.
    remainder => Remainder;
    /// `self ^ other`.
    power => Power;
    /// Elementwise maximum.
    maximum => Maximum;
    /// Elementwise minimum.
    minimum => Minimum;
    /// `self == other`.
    equal => Equal;
    /// `self != other`.
    not_equal => NotEqual;
    /// `self < other`.
    less => Less;
    /// `self <= other`.
    less_equal => LessEqual;
    /// `self > other`.
    greater => Greater;
    /// `self >= other`.
    greater_equal => GreaterEqual;
    /// Boolean and.
    logical_and => LogicalAnd;
    /// Boolean or.
    logical_or => LogicalOr;
}

impl Array {
    /// Matrix product over the last two axes, broadcasting the batch axes.
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        Array::from_raw(ffi::binary(BinaryOp::Matmul, self.raw(), other.raw())?)
    }

    /// Converts the elements to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        Array::from_raw(ffi::astype(self.raw(), dtype.code())?)
    }

    /// The same bytes read as `dtype` (a bitcast): the last axis scales by the ratio of the
    /// two element sizes, so it must divide evenly when `dtype` is wider.
    pub fn view_as(&self, dtype: Dtype) -> Result<Array> {
        Array::from_raw(ffi::view_as(self.raw(), dtype.code())?)
    }

    /// Picks from `x` where `self` is true, else from `y`, broadcasting all three.
    pub fn select(&self, x: impl Operand, y: impl Operand) -> Result<Array> {
        let x = x.to_operand(self)?;
        let y = y.to_operand(&x)?;
        Array::from_raw(ffi::where_(self.raw(), x.raw(), y.raw())?)
    }

    /// Limits the elements to `[lo, hi]`.
    pub fn clip(&self, lo: impl Operand, hi: impl Operand) -> Result<Array> {
        let lo = lo.to_operand(self)?;
        let hi = hi.to_operand(self)?;
        Array::from_raw(ffi::clip(self.raw(), lo.raw(), hi.raw())?)
    }

    /// `beta · self + alpha · (a @ b)` in one op.
    pub fn addmm(&self, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
        Array::from_raw(ffi::addmm(self.raw(), a.raw(), b.raw(), alpha, beta)?)
    }
}

/// Picks from `x` where `condition` is true, else from `y`.
pub fn r#where(condition: &Array, x: &Array, y: &Array) -> Result<Array> {
    condition.select(x, y)
}
