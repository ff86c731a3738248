//! Shared by the test files: a rich valid file, and the allocator that records the largest
//! single allocation, so a test can check that a hostile file never makes the reader allocate
//! what the file only claims.

#![allow(unsafe_code, dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use gguf::{GgmlType, MetaValue, Writer};

pub struct LargestAllocation;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping only
// reads a size and touches a const-initialized thread-local cell, which never allocates.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns its result with the largest allocation it made on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

/// The most a parse of `len` bytes may allocate at once: an array reserves one `MetaValue` per
/// element, and the smallest element takes one byte of file, so no reservation exceeds
/// `size_of::<MetaValue>()` per byte of file; the slack covers error messages and small
/// buffers.
pub fn allocation_bound(len: usize) -> usize {
    std::mem::size_of::<MetaValue>() * len + 4096
}

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
}

/// Every value type once, a nested array, and tensors of three types.
pub fn rich_file() -> Writer {
    Writer::default()
        .meta("general.architecture", MetaValue::String("llama".into()))
        .meta("u8", MetaValue::U8(7))
        .meta("i8", MetaValue::I8(-7))
        .meta("u16", MetaValue::U16(700))
        .meta("i16", MetaValue::I16(-700))
        .meta("u32", MetaValue::U32(70_000))
        .meta("i32", MetaValue::I32(-70_000))
        .meta("f32", MetaValue::F32(0.5))
        .meta("bool", MetaValue::Bool(true))
        .meta("u64", MetaValue::U64(1 << 40))
        .meta("i64", MetaValue::I64(-(1 << 40)))
        .meta("f64", MetaValue::F64(-0.25))
        .meta(
            "tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .meta(
            "nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(2)]),
                MetaValue::Array(vec![MetaValue::I32(3)]),
            ]),
        )
        .tensor("q8", &[32, 2], GgmlType::Q8_0.id(), vec![1; 68])
        .tensor("f32", &[8], GgmlType::F32.id(), vec![2; 32])
        .tensor("f16", &[4, 2, 2], GgmlType::F16.id(), vec![3; 32])
}
