//! Reference dequantization, transcribed loop for loop from GGML's `dequantize_row_*`
//! (ggml-quants.c), evaluated in f64. Deliberately shares no code with the crate.

// Index loops kept as in the C source, so the transcription can be checked line by line.
#![allow(clippy::needless_range_loop)]

use half::f16;

fn h(b: &[u8], at: usize) -> f64 {
    f64::from(f16::from_le_bytes([b[at], b[at + 1]]).to_f32())
}

pub fn dequantize(type_name: &str, data: &[u8]) -> Vec<f64> {
    let size = super::block_bytes(type_name);
    let mut y = Vec::new();
    for x in data.chunks_exact(size) {
        match type_name {
            "Q4_0" => q4_0(x, &mut y),
            "Q4_1" => q4_1(x, &mut y),
            "Q5_0" => q5_0(x, &mut y),
            "Q5_1" => q5_1(x, &mut y),
            "Q8_0" => q8_0(x, &mut y),
            "Q2_K" => q2_k(x, &mut y),
            "Q3_K" => q3_k(x, &mut y),
            "Q4_K" => q4_k(x, &mut y),
            "Q5_K" => q5_k(x, &mut y),
            "Q6_K" => q6_k(x, &mut y),
            other => panic!("no reference for {other}"),
        }
    }
    y
}

fn q4_0(x: &[u8], y: &mut Vec<f64>) {
    let d = h(x, 0);
    let qs = &x[2..18];
    let mut out = [0.0; 32];
    for j in 0..16 {
        let x0 = i32::from(qs[j] & 0x0F) - 8;
        let x1 = i32::from(qs[j] >> 4) - 8;
        out[j] = f64::from(x0) * d;
        out[j + 16] = f64::from(x1) * d;
    }
    y.extend(out);
}

fn q4_1(x: &[u8], y: &mut Vec<f64>) {
    let (d, m) = (h(x, 0), h(x, 2));
    let qs = &x[4..20];
    let mut out = [0.0; 32];
    for j in 0..16 {
        out[j] = f64::from(qs[j] & 0x0F) * d + m;
        out[j + 16] = f64::from(qs[j] >> 4) * d + m;
    }
    y.extend(out);
}

fn q5_0(x: &[u8], y: &mut Vec<f64>) {
    let d = h(x, 0);
    let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
    let qs = &x[6..22];
    let mut out = [0.0; 32];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        let x0 = ((u32::from(qs[j]) & 0x0F) | xh_0) as i32 - 16;
        let x1 = ((u32::from(qs[j]) >> 4) | xh_1) as i32 - 16;
        out[j] = f64::from(x0) * d;
        out[j + 16] = f64::from(x1) * d;
    }
    y.extend(out);
}

fn q5_1(x: &[u8], y: &mut Vec<f64>) {
    let (d, m) = (h(x, 0), h(x, 2));
    let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
    let qs = &x[8..24];
    let mut out = [0.0; 32];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        let x0 = (u32::from(qs[j]) & 0x0F) | xh_0;
        let x1 = (u32::from(qs[j]) >> 4) | xh_1;
        out[j] = f64::from(x0) * d + m;
        out[j + 16] = f64::from(x1) * d + m;
    }
    y.extend(out);
}

fn q8_0(x: &[u8], y: &mut Vec<f64>) {
    let d = h(x, 0);
    for &q in &x[2..34] {
        y.push(f64::from(q as i8) * d);
    }
}

fn q2_k(x: &[u8], y: &mut Vec<f64>) {
    let scales = &x[0..16];
    let qs = &x[16..80];
    let (d, min) = (h(x, 80), h(x, 82));
    let mut is = 0;
    for n in (0..256).step_by(128) {
        let q = &qs[n / 4..];
        let mut shift = 0;
        for _ in 0..4 {
            let sc = scales[is];
            is += 1;
            let (dl, ml) = (d * f64::from(sc & 0xF), min * f64::from(sc >> 4));
            for l in 0..16 {
                y.push(dl * f64::from((q[l] >> shift) & 3) - ml);
            }
            let sc = scales[is];
            is += 1;
            let (dl, ml) = (d * f64::from(sc & 0xF), min * f64::from(sc >> 4));
            for l in 0..16 {
                y.push(dl * f64::from((q[l + 16] >> shift) & 3) - ml);
            }
            shift += 2;
        }
    }
}

fn q3_k(x: &[u8], y: &mut Vec<f64>) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let hmask = &x[0..32];
    let qs = &x[32..96];
    let raw = &x[96..108];
    let d_all = h(x, 108);
    let word =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    let mut aux = [word(0), word(1), word(2), 0];
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4);
    aux[3] = ((aux[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4);
    aux[0] = (aux[0] & KMASK2) | ((tmp & KMASK1) << 4);
    aux[1] = (aux[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4);
    let scales: Vec<i8> = aux
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .map(|b| b as i8)
        .collect();
    let mut is = 0;
    let mut m = 1u8;
    for n in (0..256).step_by(128) {
        let q = &qs[n / 4..];
        let mut shift = 0;
        for _ in 0..4 {
            let dl = d_all * f64::from(i32::from(scales[is]) - 32);
            is += 1;
            for l in 0..16 {
                let v = i32::from((q[l] >> shift) & 3) - if hmask[l] & m != 0 { 0 } else { 4 };
                y.push(dl * f64::from(v));
            }
            let dl = d_all * f64::from(i32::from(scales[is]) - 32);
            is += 1;
            for l in 0..16 {
                let v = i32::from((q[l + 16] >> shift) & 3)
                    - if hmask[l + 16] & m != 0 { 0 } else { 4 };
                y.push(dl * f64::from(v));
            }
            shift += 2;
            m = m.wrapping_shl(1);
        }
    }
}

fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn q4_k(x: &[u8], y: &mut Vec<f64>) {
    let (d, min) = (h(x, 0), h(x, 2));
    let scales = &x[4..16];
    let mut q = &x[16..144];
    let mut is = 0;
    for _ in (0..256).step_by(64) {
        let (sc, m) = get_scale_min_k4(is, scales);
        let (d1, m1) = (d * f64::from(sc), min * f64::from(m));
        let (sc, m) = get_scale_min_k4(is + 1, scales);
        let (d2, m2) = (d * f64::from(sc), min * f64::from(m));
        for l in 0..32 {
            y.push(d1 * f64::from(q[l] & 0xF) - m1);
        }
        for l in 0..32 {
            y.push(d2 * f64::from(q[l] >> 4) - m2);
        }
        q = &q[32..];
        is += 2;
    }
}

fn q5_k(x: &[u8], y: &mut Vec<f64>) {
    let (d, min) = (h(x, 0), h(x, 2));
    let scales = &x[4..16];
    let qh = &x[16..48];
    let mut ql = &x[48..176];
    let mut is = 0;
    let (mut u1, mut u2) = (1u8, 2u8);
    for _ in (0..256).step_by(64) {
        let (sc, m) = get_scale_min_k4(is, scales);
        let (d1, m1) = (d * f64::from(sc), min * f64::from(m));
        let (sc, m) = get_scale_min_k4(is + 1, scales);
        let (d2, m2) = (d * f64::from(sc), min * f64::from(m));
        for l in 0..32 {
            let v = (ql[l] & 0xF) + if qh[l] & u1 != 0 { 16 } else { 0 };
            y.push(d1 * f64::from(v) - m1);
        }
        for l in 0..32 {
            let v = (ql[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
            y.push(d2 * f64::from(v) - m2);
        }
        ql = &ql[32..];
        is += 2;
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

fn q6_k(x: &[u8], y: &mut Vec<f64>) {
    let d = h(x, 208);
    let mut ql = &x[0..128];
    let mut qh = &x[128..192];
    let mut sc = &x[192..208];
    for _ in (0..256).step_by(128) {
        let mut out = [0.0; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let s = |i: usize| f64::from(sc[i] as i8);
            out[l] = d * s(is) * f64::from(q1);
            out[l + 32] = d * s(is + 2) * f64::from(q2);
            out[l + 64] = d * s(is + 4) * f64::from(q3);
            out[l + 96] = d * s(is + 6) * f64::from(q4);
        }
        y.extend(out);
        ql = &ql[64..];
        qh = &qh[32..];
        sc = &sc[8..];
    }
}
