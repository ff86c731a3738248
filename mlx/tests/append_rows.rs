//! `fast::append_rows` writes each row's new tokens into that row's buffers exactly as a slice
//! update per row would, for strided inputs, byte dtypes, and buffers someone else still holds
//! (which must not change), and declines what it cannot take.

mod common;

use mlx::fast::{AppendedRows, append_rows};
use mlx::{Array, Dtype, SliceSpec};

/// Each row's buffer after writing its slice of `update` at `offsets[row]`, by slice updates.
fn by_slice_updates(update: &Array, buffers: &[Array], offsets: &[usize]) -> Vec<Array> {
    buffers
        .iter()
        .zip(offsets)
        .enumerate()
        .map(|(row, (buffer, &at))| {
            let r = row as i32;
            let new = update.slice_axis(0, r, r + 1).unwrap();
            let tokens = new.shape()[2];
            let spec = SliceSpec::along(&buffer.shape(), 2, at as i32, at as i32 + tokens);
            buffer.slice_update(&new, &spec).unwrap()
        })
        .collect()
}

fn buffers(rows: usize, heads: i32, capacity: i32, dim: i32, seed: u64) -> Vec<Array> {
    (0..rows)
        .map(|r| common::array(&[1, heads, capacity, dim], seed + r as u64).1)
        .collect()
}

fn same(a: &Array, b: &Array, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shape");
    let (a, b) = (a.astype(Dtype::F32).unwrap(), b.astype(Dtype::F32).unwrap());
    let bits = |x: &Array| -> Vec<u32> {
        x.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&a), bits(&b), "{what}");
}

/// Row `row`'s histories are the first `len` slots of its expected buffers.
fn same_history(
    appended: &AppendedRows,
    row: usize,
    (keys, values): (&[Array], &[Array]),
    len: i32,
) {
    same(
        &appended.key_history[row],
        &keys[row].slice_axis(2, 0, len).unwrap(),
        "key history",
    );
    same(
        &appended.value_history[row],
        &values[row].slice_axis(2, 0, len).unwrap(),
        "value history",
    );
}

#[test]
fn rows_land_where_slice_updates_put_them() {
    let (heads, capacity, key_dim, value_dim) = (3, 16, 8, 4);
    let offsets = [0usize, 5, 13];
    for tokens in [1, 3] {
        // `[rows, tokens, heads, d]` as projections produce it, viewed as `[rows, heads, tokens, d]`.
        let keys = common::array(&[3, tokens, heads, key_dim], 7)
            .1
            .transpose(&[0, 2, 1, 3])
            .unwrap();
        let values = common::array(&[3, heads, tokens, value_dim], 8).1;
        let key_buffers = buffers(3, heads, capacity, key_dim, 100);
        let value_buffers = buffers(3, heads, capacity, value_dim, 200);
        let expected_keys = by_slice_updates(&keys, &key_buffers, &offsets);
        let expected_values = by_slice_updates(&values, &value_buffers, &offsets);
        mlx::eval(expected_keys.iter().chain(&expected_values)).unwrap();

        let appended = append_rows(
            &keys,
            &values,
            &key_buffers.iter().collect::<Vec<_>>(),
            &value_buffers.iter().collect::<Vec<_>>(),
            &offsets,
            &offsets.map(|o| o + tokens as usize),
        )
        .unwrap()
        .expect("the kernel takes f32 rows on the CPU");
        for row in 0..3 {
            let len = (offsets[row] + tokens as usize) as i32;
            same(
                &appended.key_buffers[row],
                &expected_keys[row],
                "key buffer",
            );
            same(
                &appended.value_buffers[row],
                &expected_values[row],
                "value buffer",
            );
            same_history(&appended, row, (&expected_keys, &expected_values), len);
            // The buffers handed in are still held here, so they were copied, not written.
            same(
                &key_buffers[row],
                &common::array(&[1, heads, capacity, key_dim], 100 + row as u64).1,
                "a held buffer is left as it was",
            );
        }
    }
}

#[test]
fn unheld_buffers_are_written_in_place_and_histories_follow() {
    // Two steps in a row with nothing else holding the buffers: the second writes into the
    // first's outputs (donated), and its histories see both steps' tokens.
    let (heads, capacity, dim) = (2, 8, 4);
    let mut keys_now = buffers(2, heads, capacity, dim, 300);
    let mut values_now = buffers(2, heads, capacity, dim, 400);
    let mut expected_keys = keys_now.clone();
    let mut expected_values = values_now.clone();
    mlx::eval(keys_now.iter().chain(&values_now)).unwrap();
    let mut offsets = [1usize, 4];
    for step in 0..3u64 {
        let keys = common::array(&[2, heads, 1, dim], 500 + step).1;
        let values = common::array(&[2, heads, 1, dim], 600 + step).1;
        expected_keys = by_slice_updates(&keys, &expected_keys, &offsets);
        expected_values = by_slice_updates(&values, &expected_values, &offsets);
        mlx::eval(expected_keys.iter().chain(&expected_values)).unwrap();
        let appended = append_rows(
            &keys,
            &values,
            &keys_now.iter().collect::<Vec<_>>(),
            &values_now.iter().collect::<Vec<_>>(),
            &offsets,
            &offsets.map(|o| o + 1),
        )
        .unwrap()
        .expect("applies");
        drop((keys_now, values_now));
        mlx::eval(appended.key_history.iter().chain(&appended.value_history)).unwrap();
        for (row, offset) in offsets.iter().enumerate() {
            let len = *offset as i32 + 1;
            same_history(&appended, row, (&expected_keys, &expected_values), len);
        }
        keys_now = appended.key_buffers;
        values_now = appended.value_buffers;
        for o in &mut offsets {
            *o += 1;
        }
    }
    for row in 0..2 {
        same(&keys_now[row], &expected_keys[row], "key buffer");
        same(&values_now[row], &expected_values[row], "value buffer");
    }
}

#[test]
fn byte_rows_are_copied_as_bytes() {
    let (heads, capacity, width) = (2, 6, 10);
    let codes = |shape: &[i32], seed: u64| -> Array {
        let n: i32 = shape.iter().product();
        let data: Vec<u8> = common::values(n as usize, seed)
            .iter()
            .map(|v| ((v + 1.0) * 127.0) as u8)
            .collect();
        Array::from_slice(&data, shape).unwrap()
    };
    let keys = codes(&[2, heads, 2, width], 1);
    let values = codes(&[2, heads, 2, width], 2);
    let key_buffers = vec![codes(&[1, heads, capacity, width], 3); 2];
    let value_buffers = vec![codes(&[1, heads, capacity, width], 4); 2];
    let offsets = [0usize, 4];
    let appended = append_rows(
        &keys,
        &values,
        &key_buffers.iter().collect::<Vec<_>>(),
        &value_buffers.iter().collect::<Vec<_>>(),
        &offsets,
        &[2, 6],
    )
    .unwrap()
    .expect("applies to bytes");
    let expected = by_slice_updates(&keys, &key_buffers, &offsets);
    for (written, expected) in appended.key_buffers.iter().zip(&expected) {
        assert_eq!(
            written.to_vec::<u8>().unwrap(),
            expected.to_vec::<u8>().unwrap()
        );
    }
    let expected = by_slice_updates(&values, &value_buffers, &offsets);
    assert_eq!(
        appended.value_history[1].to_vec::<u8>().unwrap(),
        expected[1]
            .slice_axis(2, 0, 6)
            .unwrap()
            .to_vec::<u8>()
            .unwrap()
    );
}

#[test]
fn a_ring_views_every_slot_it_uses() {
    // A sliding window that has wrapped writes slot 1 and attends all 4 slots.
    let keys = common::array(&[1, 2, 1, 4], 1).1;
    let buffer = common::array(&[1, 2, 4, 4], 2).1;
    let expected = by_slice_updates(&keys, std::slice::from_ref(&buffer), &[1]);
    let appended = append_rows(&keys, &keys, &[&buffer], &[&buffer], &[1], &[4])
        .unwrap()
        .expect("applies");
    same(&appended.key_history[0], &expected[0], "the whole ring");
}

#[test]
fn what_does_not_fit_is_declined() {
    let keys = common::array(&[2, 2, 1, 4], 1).1;
    let buffer = common::array(&[1, 2, 4, 4], 2).1;
    let two = [&buffer, &buffer];
    let declined = |keys: &Array, values: &Array, k: &[&Array], v: &[&Array], at: &[usize]| {
        let lengths: Vec<usize> = at.iter().map(|a| a + 1).collect();
        append_rows(keys, values, k, v, at, &lengths)
            .unwrap()
            .is_none()
    };
    assert!(declined(&keys, &keys, &two, &two, &[0, 4]), "past the end");
    assert!(declined(&keys, &keys, &two[..1], &two[..1], &[0]), "rows");
    let wide = common::array(&[1, 2, 4, 8], 3).1;
    assert!(
        declined(&keys, &keys, &[&wide, &wide], &two, &[0, 0]),
        "width"
    );
    let half = keys.astype(Dtype::F16).unwrap();
    assert!(declined(&half, &half, &two, &two, &[0, 0]), "dtype");
    assert!(declined(&keys, &half, &two, &two, &[0, 0]), "mixed dtypes");
    for lengths in [[0, 1], [1, 5]] {
        assert!(
            append_rows(&keys, &keys, &two, &two, &[0, 0], &lengths)
                .unwrap()
                .is_none(),
            "a history of {lengths:?} slots"
        );
    }
}
