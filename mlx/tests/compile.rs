//! Compiled closures: results, errors and panics coming back as errors.

use mlx::{Array, Error, compile};

#[test]
fn compiled_closure_computes_and_is_reusable() {
    let f = compile(
        |xs: &[Array]| {
            let y = xs[0].multiply(&xs[1])?.add(1.0)?.silu()?;
            Ok(vec![y])
        },
        false,
    )
    .unwrap();
    for scale in [1.0f32, 2.0, -3.0] {
        let a = Array::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap();
        let b = Array::full(&[3], scale, mlx::Dtype::F32).unwrap();
        let got = f.call(&[a.clone(), b.clone()]).unwrap();
        let expected = a.multiply(&b).unwrap().add(1.0).unwrap().silu().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].to_vec::<f32>().unwrap(),
            expected.to_vec::<f32>().unwrap()
        );
    }
}

#[test]
fn an_error_inside_the_closure_is_returned() {
    let f = compile(|xs: &[Array]| Ok(vec![xs[0].matmul(&xs[0])?]), false).unwrap();
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    match f.call(&[a]) {
        Err(Error::Mlx(message)) => assert!(message.contains("matmul"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn a_panic_inside_the_closure_is_returned() {
    let f = compile(
        |_xs: &[Array]| -> mlx::Result<Vec<Array>> { panic!("boom in closure") },
        false,
    )
    .unwrap();
    let a = Array::from_slice(&[1.0f32], &[1]).unwrap();
    match f.call(&[a]) {
        Err(Error::Mlx(message)) => assert!(message.contains("boom in closure"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
}
