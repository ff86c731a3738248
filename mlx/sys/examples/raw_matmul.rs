//! A matrix product through the raw bridge: arrays from host bytes, a lazy graph, one
//! evaluation, the result copied back, and an MLX exception arriving as a `Result` error.
//!
//! ```sh
//! cargo run --example raw_matmul   # from mlx/sys
//! ```
//!
//! This is the layer the safe `mlx` crate is built on; applications should use that crate. The
//! bridge speaks in dtype codes (`mlx::Dtype`'s discriminants) and raw bytes.

use mlx_sys::{Exception, UniquePtr, ffi};

/// `mlx::Dtype::F32`'s code.
const F32: u8 = 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("MLX {}", ffi::version()?);

    let a = f32_array(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let b = f32_array(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], &[3, 2])?;
    let bias = ffi::array_scalar_f32(0.5, F32)?;

    // Nothing is computed yet: each call only adds a node to MLX's lazy graph.
    let product = ffi::binary(ffi::BinaryOp::Matmul, &a, &b)?;
    let shifted = ffi::binary(ffi::BinaryOp::Add, &product, &bias)?;
    println!(
        "graph built: shape {:?}, {} bytes",
        ffi::array_shape(&shifted)?,
        ffi::array_nbytes(&shifted)?
    );

    // One evaluation computes every array in the list together.
    let mut outputs = ffi::list_new()?;
    ffi::list_push(outputs.pin_mut(), &shifted)?;
    ffi::eval(&outputs)?;

    let values = read_f32(&shifted)?;
    println!("a @ b + 0.5 = {values:?}");
    assert_eq!(values, [4.5, 5.5, 10.5, 11.5]);

    // A shape mismatch is a C++ exception inside MLX; the bridge hands it back as an error
    // instead of aborting the process.
    match ffi::binary(ffi::BinaryOp::Matmul, &a, &a) {
        Ok(_) => return Err("a [2, 3] @ [2, 3] product should have been refused".into()),
        Err(exception) => println!("a @ a refused: {}", exception.what()),
    }
    Ok(())
}

fn f32_array(values: &[f32], shape: &[i32]) -> Result<UniquePtr<ffi::Array>, Exception> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    ffi::array_from_bytes(&bytes, shape, F32)
}

fn read_f32(array: &ffi::Array) -> Result<Vec<f32>, Exception> {
    let mut bytes = vec![0u8; ffi::array_nbytes(array)?];
    ffi::array_read_bytes(array, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
