//! Arrays are lazy: operations build a graph, and nothing runs until it is evaluated or read.
//! Here a tiny "next token" step (logits → temperature → softmax → argmax) is built, evaluated
//! once, and read back; then an invalid op comes back as an error, not an abort.
//!
//! ```sh
//! cargo run --example lazy_graph   # from mlx
//! ```

use mlx::{Array, Device, Dtype};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "MLX {} on {:?} (default device)",
        mlx::version()?,
        Device::default_device()?
    );

    // Two rows of logits over a five-token vocabulary, as a model's output head would give.
    let logits = Array::from_slice(
        &[
            1.0f32, 3.0, 0.5, 2.0, -1.0, //
            0.0, 0.0, 4.0, 0.0, 1.0,
        ],
        &[2, 5],
    )?;

    // Each call only records an op; scalars take the array's dtype.
    let probs = logits.multiply(1.0 / 0.7)?.softmax(&[-1], true)?;
    let best = probs.argmax(-1, false)?;
    let total = probs.sum(&[-1], false)?;
    println!(
        "graph built: probs {:?} {:?}, best {:?} {:?}",
        probs.shape(),
        probs.dtype(),
        best.shape(),
        best.dtype()
    );

    // One evaluation computes all three together; the reads below then just copy.
    mlx::eval([&probs, &best, &total])?;
    for (row, p) in probs.to_vec::<f32>()?.chunks(5).enumerate() {
        let rounded: Vec<String> = p.iter().map(|v| format!("{v:.3}")).collect();
        println!("row {row}: p = [{}]", rounded.join(", "));
    }
    let best = best.to_vec::<u32>()?;
    println!(
        "argmax per row: {best:?}, row sums: {:?}",
        total.to_vec::<f32>()?
    );
    assert_eq!(best, [1, 2]);

    // A [2, 5] @ [2, 5] product is invalid; MLX's exception arrives as `mlx::Error`.
    match logits.matmul(&logits) {
        Ok(_) => return Err("the mismatched matmul should have been refused".into()),
        Err(error) => println!("[2, 5] @ [2, 5] refused: {error}"),
    }

    // Converting reads the whole array back to the host.
    let ids = Array::arange(0.0, 4.0, 1.0, Dtype::I32)?.reshape(&[2, 2])?;
    println!(
        "arange reshaped to {:?}: {:?}",
        ids.shape(),
        ids.to_vec::<i32>()?
    );
    Ok(())
}
