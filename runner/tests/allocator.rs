//! The `mlxkit` binary's allocator options, read back from jemalloc's own report of them (its
//! `stats_print` option prints every option in force when the process exits).

#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

#[test]
fn the_binary_asks_the_kernel_for_huge_pages() {
    let output = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .arg("--version")
        .env("MALLOC_CONF", "stats_print:true")
        .output()
        .expect("run mlxkit --version");
    assert!(output.status.success(), "mlxkit --version failed");
    let report = String::from_utf8_lossy(&output.stderr);
    // jemalloc turns the option off by itself where the kernel has no transparent huge pages.
    let expected = if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        r#"opt.thp: "always""#
    } else {
        r#"opt.thp: "not supported""#
    };
    assert!(
        report.contains(expected),
        "jemalloc's report lacks `{expected}`:\n{}",
        report
            .lines()
            .filter(|l| l.contains("opt."))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
