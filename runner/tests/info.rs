//! `mlxkit info`, as a user runs it: the report names the distributed backends this MLX build
//! has (issue 50), among the rest of what the build runs on.

use std::process::Command;

#[test]
fn info_names_the_distributed_backends_of_this_build() {
    let output = Command::new(env!("CARGO_BIN_EXE_mlxkit"))
        .arg("info")
        .output()
        .expect("run mlxkit info");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("distributed backends: "))
        .unwrap_or_else(|| panic!("no distributed backends line: {stdout}"));
    // Every MLX build carries the ring; the line lists what this one has, as MLX names them.
    let names: Vec<&str> = line["distributed backends: ".len()..].split(", ").collect();
    assert!(names.contains(&"ring"), "{line}");
    assert!(
        names
            .iter()
            .all(|n| ["ring", "mpi", "nccl", "jaccl"].contains(n)),
        "{line}"
    );
}
