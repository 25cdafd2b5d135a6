//! Helpers shared by lnd's integration tests (each test file that needs them says `mod common;`).

use std::path::{Path, PathBuf};

/// The directory `tests/corpus/<name>` and the names of its `.bin` files, sorted: what a corpus
/// replay compares with its table of expectations before replaying each file.
pub fn corpus_bins(name: &str) -> (PathBuf, Vec<String>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(name);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    files.sort();
    (dir, files)
}
