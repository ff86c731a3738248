//! The `mlxkit` binary's allocator options, read back from jemalloc's own report of them (its
//! `stats_print` option prints every option in force when the process exits).

#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

/// jemalloc's report of the options in force when `mlxkit --version` exits.
fn option_report() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .arg("--version")
        .env("MALLOC_CONF", "stats_print:true")
        .output()
        .expect("run mlxkit --version");
    assert!(output.status.success(), "mlxkit --version failed");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Fails naming the options jemalloc reported, when `expected` is not among them.
fn assert_option(report: &str, expected: &str) {
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

#[test]
fn the_binary_asks_the_kernel_for_huge_pages() {
    let report = option_report();
    // jemalloc turns the option off by itself where the kernel has no transparent huge pages.
    let expected = if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        r#"opt.thp: "always""#
    } else {
        r#"opt.thp: "not supported""#
    };
    assert_option(&report, expected);
}

/// One arena and a purging thread: what a server that unloads models needs to give memory
/// back (see `main.rs`).
#[test]
fn the_binary_keeps_one_arena_and_purges_in_the_background() {
    let report = option_report();
    assert_option(&report, "opt.narenas: 1\n");
    assert_option(&report, "opt.background_thread: true");
}
