//! What the bench binaries' tests share.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `lnet-router`, built next to the bench binary `exe` by `cargo test` at the workspace root.
pub fn router_bin(exe: &str) -> PathBuf {
    let p = Path::new(exe).with_file_name("lnet-router");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p router` (or run `cargo test` at the \
         workspace root)",
        p.display()
    );
    p
}

/// Runs `cmd`, which must succeed; its standard output.
pub fn stdout_of_success(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// Runs `lnet_perf ARGS --via-router <lnet-router>` (client and server through a real router
/// daemon; `args` split at white space), which must succeed; its standard output.
#[allow(dead_code)] // router_storm.rs runs its own binary
pub fn lnet_perf_via_router(args: &str) -> String {
    let perf = env!("CARGO_BIN_EXE_lnet_perf");
    stdout_of_success(
        Command::new(perf)
            .args(args.split_whitespace())
            .arg("--via-router")
            .arg(router_bin(perf)),
    )
}
