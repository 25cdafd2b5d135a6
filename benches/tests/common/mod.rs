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
