# Sourced by scripts/test and scripts/check-platforms: lint while building. clippy-driver
# compiles each workspace crate as rustc would and lints it on the way, which is all
# `cargo clippy` does (it wraps a `cargo check` the same way). Wrapping the test build instead
# compiles every dependency once, for the tests, where a separate clippy step first checked
# them all for the lints (a third of a cold run's build time). Cargo keeps the wrapper in each
# workspace crate's fingerprint, so every cargo command that shares these builds sets it too.
# shellcheck shell=bash
RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
# `cargo clippy -- -D warnings` hands its arguments to the driver this way.
CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
