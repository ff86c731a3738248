//! Memory accounting. One test per binary: active memory is process-wide.

use mlx::{Dtype, memory, random};

#[test]
fn dropping_arrays_returns_active_memory_to_baseline() {
    // Warm up MLX's lazily created state so the baseline is stable.
    let warm = random::uniform(&[16], Dtype::F32, &random::key(0).unwrap()).unwrap();
    warm.eval().unwrap();
    drop(warm);
    memory::clear_cache().unwrap();
    let baseline = memory::active_memory().unwrap();

    let key = random::key(1).unwrap();
    let a = random::uniform(&[512, 512], Dtype::F32, &key).unwrap();
    let b = a.matmul(&a).unwrap().add(1.0).unwrap();
    b.eval().unwrap();
    let held = memory::active_memory().unwrap();
    assert!(
        held >= baseline + 2 * 512 * 512 * 4,
        "active memory {held} should hold two 1 MiB arrays over {baseline}"
    );
    assert!(memory::peak_memory().unwrap() >= held);

    drop(a);
    drop(b);
    drop(key);
    assert_eq!(memory::active_memory().unwrap(), baseline);
    assert!(
        memory::cache_memory().unwrap() > 0,
        "freed buffers are pooled"
    );
    memory::clear_cache().unwrap();
    assert_eq!(memory::cache_memory().unwrap(), 0);

    memory::reset_peak_memory().unwrap();
    assert_eq!(
        memory::peak_memory().unwrap(),
        memory::active_memory().unwrap()
    );
    let previous = memory::set_cache_limit(1 << 20).unwrap();
    assert_eq!(memory::set_cache_limit(previous).unwrap(), 1 << 20);
}
