//! The layering of `lnd`, checked from its sources: which top-level module each file refers to
//! through `crate::`. The fabric boundary sits below the engine and depends on nothing above it;
//! drivers and the simulator sit above the engine; nothing calls upward; the graph has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of a source file (`src/engine/mod.rs` -> `engine`, `src/time.rs` -> `time`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// module -> the other top-level modules its files name as `crate::x` (test-only files excluded:
/// tests may reach anywhere).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let m = module_of(&src, &f);
        if m == "lib" || f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        // Code only: not comments, and not an inline `#[cfg(test)] mod x { .. }` (the rest of
        // the file, by convention).
        let mut code = String::new();
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let t = line.trim_start();
            if t == "#[cfg(test)]"
                && lines
                    .peek()
                    .is_some_and(|n| n.trim_start().starts_with("mod ") && n.contains('{'))
            {
                break;
            }
            if !t.starts_with("//") {
                code.push_str(line);
                code.push('\n');
            }
        }
        let deps = g.entry(m.clone()).or_default();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != m {
                deps.insert(name);
            }
        }
    }
    g
}

#[test]
fn the_boundary_depends_on_nothing_above_it() {
    let g = graph();
    let fabric = &g["fabric"];
    for above in ["engine", "driver", "sim", "sys"] {
        assert!(!fabric.contains(above), "fabric uses {above}: {fabric:?}");
    }
    // The stream boundary (below socklnd) is held to the same rule as the fabric (below o2ib).
    let stream = &g["stream"];
    for above in ["engine", "driver", "sim", "sys", "sock", "fabric", "iface"] {
        assert!(!stream.contains(above), "stream uses {above}: {stream:?}");
    }
    let engine = &g["engine"];
    for above in ["driver", "sim", "sys"] {
        assert!(!engine.contains(above), "engine uses {above}: {engine:?}");
    }
    for low in ["wire", "time", "wheel", "mem"] {
        for above in [
            "engine", "driver", "sim", "fabric", "iface", "stream", "sock",
        ] {
            assert!(!g[low].contains(above), "{low} uses {above}: {:?}", g[low]);
        }
    }
}

/// The LND interface is what LNet sees of any LND: it names no LND's machinery (the engine
/// implements it, not the reverse), only the bottom layers.
#[test]
fn the_lnd_interface_names_no_lnd() {
    let g = graph();
    let iface = &g["iface"];
    for above in [
        "engine", "fabric", "driver", "sim", "sys", "slots", "handle", "stream", "sock",
    ] {
        assert!(!iface.contains(above), "iface uses {above}: {iface:?}");
    }
}

#[test]
fn no_module_cycle() {
    let g = graph();
    // Kahn's algorithm: every module must come out.
    let mut indeg: BTreeMap<&str, usize> = g.keys().map(|k| (k.as_str(), 0)).collect();
    for deps in g.values() {
        for d in deps {
            if let Some(n) = indeg.get_mut(d.as_str()) {
                *n += 1;
            }
        }
    }
    let mut ready: Vec<&str> = indeg
        .iter()
        .filter(|(_, &n)| n == 0)
        .map(|(k, _)| *k)
        .collect();
    let mut seen = 0;
    while let Some(m) = ready.pop() {
        seen += 1;
        for d in &g[m] {
            if let Some(n) = indeg.get_mut(d.as_str()) {
                *n -= 1;
                if *n == 0 {
                    ready.push(d.as_str());
                }
            }
        }
    }
    assert_eq!(seen, g.len(), "a cycle among lnd's modules: {g:?}");
}
