//! The selective state space recurrence of Mamba-2 (Dao and Gu, "Transformers are SSMs:
//! Generalized Models and Efficient Algorithms Through Structured State Space Duality", 2024),
//! the mixer of Nemotron-H, Falcon-H1 and Granite 4 hybrids.
//!
//! Each head keeps a state `S` (`P × N`, f32) that decays by `exp(dt · a)`, takes in the
//! token's input along the group's `b`, and is read along the group's `c`:
//!
//! ```text
//! S ← exp(dt_t a) · S + dt_t x_t b_tᵀ
//! y_t = S c_t + D x_t
//! ```
//!
//! On the CPU the scan is one kernel ([`mlx::fast::ssd_scan`]); elsewhere it runs as MLX ops,
//! token by token. The two agree to f32 rounding (tested below).

use mlx::{Array, Dtype};

use crate::Result;

/// The inputs of one scan: `x` `[B, T, H, P]`, step sizes `dt` `[B, T, H]` (after softplus and
/// clamping), `b` and `c` `[B, T, G, N]` (each group shared by `H / G` consecutive heads).
pub struct SsdInputs<'a> {
    /// The heads' inputs.
    pub x: &'a Array,
    /// Step sizes.
    pub dt: &'a Array,
    /// Input projections of the state.
    pub b: &'a Array,
    /// Output projections of the state.
    pub c: &'a Array,
}

/// Runs the recurrence from `state` (`[B, H, P, N]`, f32) with decay rates `a` (`[H]`,
/// negative) and skip weights `d` (`[H]`): the outputs `[B, T, H, P]` in `x`'s dtype and the
/// state after the last token.
pub fn ssd(inputs: &SsdInputs<'_>, a: &Array, d: &Array, state: &Array) -> Result<(Array, Array)> {
    let f32 = |t: &Array| t.astype(Dtype::F32);
    let (x, dt, b, c) = (
        f32(inputs.x)?,
        f32(inputs.dt)?,
        f32(inputs.b)?,
        f32(inputs.c)?,
    );
    let (a, state) = (f32(a)?, f32(state)?);
    let (y, state) = match mlx::fast::ssd_scan(&x, &dt, &a, &b, &c, &state)? {
        Some(scanned) => scanned,
        None => scan_in_ops(&x, &dt, &a, &b, &c, state)?,
    };
    let skip = x.multiply(&f32(d)?.expand_dims(&[-1])?)?;
    Ok((y.add(&skip)?.astype(inputs.x.dtype())?, state))
}

/// The recurrence in MLX ops, one token at a time (GPU devices, where the CPU kernel does not
/// apply). All f32; no skip term.
pub(crate) fn scan_in_ops(
    x: &Array,
    dt: &Array,
    a: &Array,
    b: &Array,
    c: &Array,
    mut state: Array,
) -> Result<(Array, Array)> {
    let shape = x.shape();
    let (tokens, heads) = (shape[1], shape[2]);
    let groups = b.dim(2)?;
    let per_group = heads / groups.max(1);
    // Each group to the heads it serves: [B, T, H, N].
    let widen = |t: &Array| -> Result<Array> {
        if per_group == 1 {
            return Ok(t.clone());
        }
        let s = t.shape();
        Ok(t.expand_dims(&[3])?
            .broadcast_to(&[s[0], s[1], s[2], per_group, s[3]])?
            .reshape(&[s[0], s[1], s[2] * per_group, s[3]])?)
    };
    let (b, c) = (widen(b)?, widen(c)?);
    let mut outputs = Vec::with_capacity(usize::try_from(tokens).unwrap_or(0));
    for t in 0..tokens {
        let at = |v: &Array| v.slice_axis(1, t, t + 1)?.squeeze(&[1]);
        let (xt, dtt, bt, ct) = (at(x)?, at(dt)?, at(&b)?, at(&c)?);
        let decay = dtt.multiply(a)?.exp()?.expand_dims(&[2, 3])?;
        // dt · x ⊗ b: [B, H, P, 1] · [B, H, 1, N].
        let input = xt
            .multiply(&dtt.expand_dims(&[2])?)?
            .expand_dims(&[3])?
            .multiply(&bt.expand_dims(&[2])?)?;
        state = state.multiply(&decay)?.add(&input)?;
        outputs.push(state.matmul(&ct.expand_dims(&[3])?)?.squeeze(&[3])?);
    }
    Ok((mlx::stack(&outputs, 1)?, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx::random::key(seed).unwrap();
        let u = mlx::random::uniform(shape, Dtype::F32, &key).unwrap();
        u.multiply(2.0).unwrap().subtract(1.0).unwrap()
    }

    fn max_diff(a: &Array, b: &Array) -> f32 {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The CPU kernel and the ops recurrence compute the same scan, in one piece or in two.
    #[test]
    fn kernel_matches_the_recurrence_in_ops() {
        let (n, t, h, p, g, s) = (2, 6, 4, 8, 2, 16);
        let x = random(&[n, t, h, p], 1);
        let dt = random(&[n, t, h], 2).abs().unwrap().multiply(0.5).unwrap();
        let a = random(&[h], 3).abs().unwrap().negative().unwrap();
        let b = random(&[n, t, g, s], 4);
        let c = random(&[n, t, g, s], 5);
        let d = random(&[h], 6);
        let state = random(&[n, h, p, s], 7);
        let inputs = SsdInputs {
            x: &x,
            dt: &dt,
            b: &b,
            c: &c,
        };
        let (y, end) = ssd(&inputs, &a, &d, &state).unwrap();
        let (y_ops, end_ops) = scan_in_ops(&x, &dt, &a, &b, &c, state.clone()).unwrap();
        let skip = x.multiply(d.expand_dims(&[-1]).unwrap()).unwrap();
        let y_ops = y_ops.add(&skip).unwrap();
        assert!(max_diff(&y, &y_ops) < 1e-5, "{}", max_diff(&y, &y_ops));
        assert!(
            max_diff(&end, &end_ops) < 1e-5,
            "{}",
            max_diff(&end, &end_ops)
        );

        let part = |v: &Array, from: i32, to: i32| v.slice_axis(1, from, to).unwrap();
        let first = SsdInputs {
            x: &part(&x, 0, 2),
            dt: &part(&dt, 0, 2),
            b: &part(&b, 0, 2),
            c: &part(&c, 0, 2),
        };
        let (y1, s1) = ssd(&first, &a, &d, &state).unwrap();
        let rest = SsdInputs {
            x: &part(&x, 2, t),
            dt: &part(&dt, 2, t),
            b: &part(&b, 2, t),
            c: &part(&c, 2, t),
        };
        let (y2, s2) = ssd(&rest, &a, &d, &s1).unwrap();
        assert_eq!(max_diff(&mlx::concatenate(&[y1, y2], 1).unwrap(), &y), 0.0);
        assert_eq!(max_diff(&s2, &end), 0.0);
    }
}
