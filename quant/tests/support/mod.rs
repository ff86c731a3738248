//! Test support: a tiny GGUF writer, a safetensors writer, random block builders and a
//! reference dequantizer written straight from GGML's C loops, in f64.

#![allow(dead_code)]

pub mod gguf_writer;
pub mod reference;
pub mod safetensors_writer;

use half::f16;

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// Little-endian bytes of an f16 scale in [lo, hi).
    pub fn f16_bytes(&mut self, lo: f32, hi: f32) -> [u8; 2] {
        f16::from_f32(self.uniform(lo, hi)).to_le_bytes()
    }
}

/// Random but valid block data: random integer bytes, with the f16 fields set to finite scales
/// (the mins of Q4_1/Q5_1 negative, as real files have them).
pub fn random_blocks(type_name: &str, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..blocks {
        let mut block = rng.bytes(block_bytes(type_name));
        let mut set = |at: usize, value: [u8; 2]| block[at..at + 2].copy_from_slice(&value);
        match type_name {
            "Q4_0" | "Q5_0" | "Q8_0" => set(0, rng.f16_bytes(0.001, 0.05)),
            "Q4_1" | "Q5_1" => {
                set(0, rng.f16_bytes(0.001, 0.05));
                set(2, rng.f16_bytes(-0.5, 0.0));
            }
            "Q2_K" => {
                set(80, rng.f16_bytes(0.001, 0.05));
                set(82, rng.f16_bytes(0.001, 0.05));
            }
            "Q3_K" => set(108, rng.f16_bytes(0.001, 0.05)),
            "Q4_K" | "Q5_K" => {
                set(0, rng.f16_bytes(0.001, 0.05));
                set(2, rng.f16_bytes(0.001, 0.05));
            }
            "Q6_K" => set(208, rng.f16_bytes(0.001, 0.05)),
            other => panic!("no block builder for {other}"),
        }
        out.extend(block);
    }
    out
}

pub fn block_bytes(type_name: &str) -> usize {
    match type_name {
        "Q4_0" => 18,
        "Q4_1" => 20,
        "Q5_0" => 22,
        "Q5_1" => 24,
        "Q8_0" => 34,
        "Q2_K" => 84,
        "Q3_K" => 110,
        "Q4_K" => 144,
        "Q5_K" => 176,
        "Q6_K" => 210,
        other => panic!("unknown type {other}"),
    }
}

pub fn block_elements(type_name: &str) -> usize {
    if type_name.ends_with("_K") { 256 } else { 32 }
}

pub fn type_id(type_name: &str) -> u32 {
    match type_name {
        "F32" => 0,
        "F16" => 1,
        "Q4_0" => 2,
        "Q4_1" => 3,
        "Q5_0" => 6,
        "Q5_1" => 7,
        "Q8_0" => 8,
        "Q2_K" => 10,
        "Q3_K" => 11,
        "Q4_K" => 12,
        "Q5_K" => 13,
        "Q6_K" => 14,
        "BF16" => 30,
        other => panic!("unknown type {other}"),
    }
}

pub const BLOCK_TYPES: [&str; 10] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
];

/// Asserts `actual` equals the f64 `reference` to f32 rounding (half an ulp, plus one for the
/// single rounding GGML's f32 arithmetic may add).
pub fn assert_close_to_reference(what: &str, actual: &[f32], reference: &[f64]) {
    assert_eq!(actual.len(), reference.len(), "{what}: lengths differ");
    for (i, (&a, &r)) in actual.iter().zip(reference).enumerate() {
        let tolerance = r.abs() * f64::from(f32::EPSILON) + f64::from(f32::MIN_POSITIVE);
        assert!(
            (f64::from(a) - r).abs() <= tolerance,
            "{what}: element {i} is {a}, reference {r}"
        );
    }
}

/// A unique scratch directory.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}
