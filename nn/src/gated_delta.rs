//! The gated delta rule: the recurrence of gated delta networks (Yang, Kautz and Hatamizadeh,
//! "Gated Delta Networks: Improving Mamba2 with Delta Rule", 2024), the linear-attention
//! mixer of Qwen3-Next and Qwen3.5.
//!
//! Each value head keeps a state `S` (`Dv × Dk`, f32). Per token it decays by `exp(g)`, is
//! corrected towards the token's value along its key with learning rate `β`, and is read by the
//! query:
//!
//! ```text
//! S ← exp(g_t) · S
//! S ← S + β_t · (v_t − S k_t) k_tᵀ
//! y_t = S q_t
//! ```
//!
//! Queries and keys are L2-normalized first, and queries scaled by `Dk^-½`. On the CPU the scan
//! is one kernel ([`mlx::fast::gated_delta_scan`]); elsewhere it runs as MLX ops, token by
//! token. The two agree to f32 rounding (tested below).

use mlx::{Array, Dtype};

use crate::Result;

/// The inputs of one scan: `q`, `k` `[B, T, Hk, Dk]`, `v` `[B, T, Hv, Dv]`, the log decay
/// `g` and learning rate `beta` `[B, T, Hv]`. Each key head serves `Hv / Hk` consecutive value
/// heads.
pub struct DeltaInputs<'a> {
    /// Queries, raw from the convolution.
    pub q: &'a Array,
    /// Keys, raw from the convolution.
    pub k: &'a Array,
    /// Values.
    pub v: &'a Array,
    /// Log decay per value head (≤ 0).
    pub g: &'a Array,
    /// Learning rate per value head, in (0, 1).
    pub beta: &'a Array,
}

/// Runs the rule from `state` (`[B, Hv, Dv, Dk]`, f32): the outputs `[B, T, Hv, Dv]` in the
/// values' dtype and the state after the last token.
pub fn gated_delta_rule(inputs: &DeltaInputs<'_>, state: &Array) -> Result<(Array, Array)> {
    let (q, k) = normalized(inputs.q, inputs.k)?;
    let f32 = |a: &Array| a.astype(Dtype::F32);
    let (v, g, beta) = (f32(inputs.v)?, f32(inputs.g)?, f32(inputs.beta)?);
    let state = state.astype(Dtype::F32)?;
    let (y, state) = match mlx::fast::gated_delta_scan(&q, &k, &v, &g, &beta, &state)? {
        Some(scanned) => scanned,
        None => scan_in_ops(&q, &k, &v, &g, &beta, state)?,
    };
    Ok((y.astype(inputs.v.dtype())?, state))
}

/// `q / ‖q‖ · Dk^-½` and `k / ‖k‖` in f32, with the `ε = 10⁻⁶` inside the square root that the
/// reference kernels use. `rms_norm(x, ε / D) = √D · x / √(‖x‖² + ε)`, so one fused norm and a
/// scale give exactly that.
fn normalized(q: &Array, k: &Array) -> Result<(Array, Array)> {
    let dim = k.dim(-1)? as f32;
    let eps = 1e-6 / dim;
    let q = mlx::fast::rms_norm(&q.astype(Dtype::F32)?, None, eps)?.multiply(1.0 / dim)?;
    let k = mlx::fast::rms_norm(&k.astype(Dtype::F32)?, None, eps)?.multiply(1.0 / dim.sqrt())?;
    Ok((q, k))
}

/// The recurrence in MLX ops, one token at a time (GPU devices, where the CPU kernel does not
/// apply). Inputs as [`gated_delta_rule`], already normalized and in f32.
pub(crate) fn scan_in_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
) -> Result<(Array, Array)> {
    let shape = k.shape();
    let (tokens, key_heads) = (shape[1], shape[2]);
    let value_heads = v.dim(2)?;
    let group = value_heads / key_heads.max(1);
    // Each key head to the value heads it serves: [B, T, Hv, Dk].
    let widen = |a: &Array| -> Result<Array> {
        if group == 1 {
            return Ok(a.clone());
        }
        let s = a.shape();
        Ok(a.expand_dims(&[3])?
            .broadcast_to(&[s[0], s[1], s[2], group, s[3]])?
            .reshape(&[s[0], s[1], s[2] * group, s[3]])?)
    };
    let (q, k) = (widen(q)?, widen(k)?);
    let mut outputs = Vec::with_capacity(usize::try_from(tokens).unwrap_or(0));
    for t in 0..tokens {
        let at = |a: &Array| a.slice_axis(1, t, t + 1)?.squeeze(&[1]);
        let (qt, kt, vt) = (at(&q)?, at(&k)?, at(v)?);
        let decay = at(g)?.exp()?.expand_dims(&[2, 3])?;
        let rate = at(beta)?.expand_dims(&[2])?;
        state = state.multiply(&decay)?;
        // S k: [B, Hv, Dv, Dk] @ [B, Hv, Dk, 1] → [B, Hv, Dv].
        let memory = state.matmul(&kt.expand_dims(&[3])?)?.squeeze(&[3])?;
        let delta = vt.subtract(&memory)?.multiply(&rate)?;
        state = state.add(&delta.expand_dims(&[3])?.multiply(&kt.expand_dims(&[2])?)?)?;
        outputs.push(state.matmul(&qt.expand_dims(&[3])?)?.squeeze(&[3])?);
    }
    Ok((mlx::stack(&outputs, 1)?, state))
}

/// `softplus(x) = ln(1 + eˣ)`, without overflow for large `x`.
pub fn softplus(x: &Array) -> Result<Array> {
    Ok(x.maximum(0.0)?.add(&x.abs()?.negative()?.exp()?.log1p()?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(shape: &[i32], seed: u64) -> Array {
        let key = mlx::random::key(seed).unwrap();
        let u = mlx::random::uniform(shape, Dtype::F32, &key).unwrap();
        u.multiply(4.0).unwrap().subtract(2.0).unwrap()
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
        let (b, t, hk, hv, dk, dv) = (2, 7, 2, 4, 16, 8);
        let q = random(&[b, t, hk, dk], 1);
        let k = random(&[b, t, hk, dk], 2);
        let v = random(&[b, t, hv, dv], 3);
        let g = softplus(&random(&[b, t, hv], 4))
            .unwrap()
            .negative()
            .unwrap();
        let beta = random(&[b, t, hv], 5).sigmoid().unwrap();
        let state = random(&[b, hv, dv, dk], 6);
        let inputs = DeltaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let (y, s) = gated_delta_rule(&inputs, &state).unwrap();
        let (qn, kn) = normalized(&q, &k).unwrap();
        let (y_ops, s_ops) = scan_in_ops(&qn, &kn, &v, &g, &beta, state.clone()).unwrap();
        assert_eq!(y.shape(), vec![b, t, hv, dv]);
        assert_eq!(s.shape(), vec![b, hv, dv, dk]);
        assert!(max_diff(&y, &y_ops) < 1e-5, "{}", max_diff(&y, &y_ops));
        assert!(max_diff(&s, &s_ops) < 1e-5, "{}", max_diff(&s, &s_ops));

        // The first three tokens, then the other four from the state they left.
        let part = |a: &Array, from: i32, to: i32| a.slice_axis(1, from, to).unwrap();
        let first = DeltaInputs {
            q: &part(&q, 0, 3),
            k: &part(&k, 0, 3),
            v: &part(&v, 0, 3),
            g: &part(&g, 0, 3),
            beta: &part(&beta, 0, 3),
        };
        let (y1, s1) = gated_delta_rule(&first, &state).unwrap();
        let rest = DeltaInputs {
            q: &part(&q, 3, t),
            k: &part(&k, 3, t),
            v: &part(&v, 3, t),
            g: &part(&g, 3, t),
            beta: &part(&beta, 3, t),
        };
        let (y2, s2) = gated_delta_rule(&rest, &s1).unwrap();
        let joined = mlx::concatenate(&[y1, y2], 1).unwrap();
        assert_eq!(max_diff(&joined, &y), 0.0);
        assert_eq!(max_diff(&s2, &s), 0.0);
    }

    #[test]
    fn softplus_is_stable_at_both_ends() {
        let x = Array::from_slice(&[-100.0f32, 0.0, 100.0], &[3]).unwrap();
        let y = softplus(&x).unwrap().to_vec::<f32>().unwrap();
        assert!(y[0] >= 0.0 && y[0] < 1e-30);
        assert!((y[1] - std::f32::consts::LN_2).abs() < 1e-7);
        assert!((y[2] - 100.0).abs() < 1e-5);
    }
}
