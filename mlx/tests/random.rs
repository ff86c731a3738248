//! Keyed random numbers are deterministic and distributed as documented.

use mlx::{Array, Dtype, random};

#[test]
fn same_key_same_numbers_different_key_different_numbers() {
    let a = random::uniform(&[64], Dtype::F32, &random::key(7).unwrap()).unwrap();
    let b = random::uniform(&[64], Dtype::F32, &random::key(7).unwrap()).unwrap();
    let c = random::uniform(&[64], Dtype::F32, &random::key(8).unwrap()).unwrap();
    let (a, b, c) = (
        a.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        c.to_vec::<f32>().unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
    let keys = random::split(&random::key(7).unwrap(), 3).unwrap();
    assert_eq!(keys.len(), 3);
    let k0 = keys[0].to_vec::<u32>().unwrap();
    let k1 = keys[1].to_vec::<u32>().unwrap();
    assert_ne!(k0, k1);
}

#[test]
fn categorical_follows_the_distribution() {
    // p = (0.1, 0.2, 0.7); 20,000 draws in one batch, fixed key.
    let probs = [0.1f64, 0.2, 0.7];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
    let n = 20_000;
    let batch: Vec<f32> = logits.iter().cycle().take(3 * n).cloned().collect();
    let logits = Array::from_slice(&batch, &[n as i32, 3]).unwrap();
    let draws = random::categorical(&logits, -1, &random::key(3).unwrap()).unwrap();
    let draws = draws.to_vec::<u32>().unwrap();
    let mut counts = [0usize; 3];
    for d in draws {
        counts[d as usize] += 1;
    }
    // Chi-square with 2 degrees of freedom; 13.8 is the 0.999 quantile. The key is fixed, so
    // this is deterministic: it fails only if the sampler's distribution is wrong.
    let chi2: f64 = counts
        .iter()
        .zip(probs)
        .map(|(&c, p)| {
            let e = p * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum();
    assert!(chi2 < 13.8, "chi-square {chi2} for counts {counts:?}");
    let g = random::gumbel(&[8], Dtype::F32, &random::key(4).unwrap()).unwrap();
    assert_eq!(g.shape(), vec![8]);
}
