//! The docs a reader follows from the README: every relative Markdown link in README.md,
//! CONTRIBUTING.md, CHANGELOG.md, benches/README.md and docs/*.md points to a file that exists,
//! and to a heading that exists when it names one (`page.md#anchor`, anchors made as GitHub
//! makes them); and every page under docs/ is linked from the README, so none is orphaned.
//! Links inside code (spans and indented or fenced blocks) are not links and are not checked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The workspace root: this crate is `tests/` in it.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The checked pages, relative to `root`: the fixed ones and every `docs/*.md`.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = [
        "README.md",
        "CONTRIBUTING.md",
        "CHANGELOG.md",
        "benches/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root).expect("under root").to_path_buf())
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// `text` without its inline code spans (a run of backticks up to the same run).
fn strip_code_spans(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let run = b[i..].iter().take_while(|&&c| c == b'`').count();
            let fence = &line[i..i + run];
            if let Some(end) = line[i + run..].find(fence) {
                i += run + end + run;
                continue;
            }
            out.push_str(fence);
            i += run;
            continue;
        }
        let c = line[i..].chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// The Markdown lines of `text` that are prose, with their 1-based numbers: fenced blocks and
/// indented code (four spaces or a tab) left out.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        out.push((i + 1, strip_code_spans(line)));
    }
    out
}

/// Every link target of `text` with its line: inline links `[text](target "title")` and
/// reference definitions `[name]: target`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_string()));
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[') && !t.starts_with("[ ]") {
            if let Some(close) = t.find("]:") {
                if let Some(target) = t[close + 2..].split_whitespace().next() {
                    out.push((n, target.to_string()));
                }
            }
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, code spans' text kept, punctuation other
/// than `-` and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown page: one per ATX heading outside code, repeats suffixed `-1`,
/// `-2`, ... as GitHub does.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..].replace('`', ""));
        let mut a = base.clone();
        let mut k = 0;
        while seen.contains(&a) {
            k += 1;
            a = format!("{base}-{k}");
        }
        seen.insert(a);
    }
    seen
}

/// What is wrong with the relative links of `files` (relative to `root`), one line each:
/// `FILE:LINE: TARGET: why`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut bad = Vec::new();
    for file in files {
        let path = root.join(file);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                bad.push(format!("{}: cannot read: {e}", file.display()));
                continue;
            }
        };
        for (line, target) in links(&text) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file_part, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if file_part.is_empty() {
                path.clone()
            } else if file_part.starts_with('/') {
                bad.push(format!(
                    "{}:{line}: {target}: absolute path (not a link a reader can follow)",
                    file.display()
                ));
                continue;
            } else {
                path.parent()
                    .expect("a file has a directory")
                    .join(file_part)
            };
            if !dest.exists() {
                bad.push(format!("{}:{line}: {target}: no such file", file.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if dest.extension().is_none_or(|x| x != "md") {
                continue;
            }
            let dest_text = std::fs::read_to_string(&dest).unwrap_or_default();
            if !anchors(&dest_text).contains(anchor) {
                bad.push(format!(
                    "{}:{line}: {target}: no heading with anchor '#{anchor}'",
                    file.display()
                ));
            }
        }
    }
    bad
}

#[test]
fn every_relative_docs_link_resolves() {
    let root = root();
    let files = pages(&root);
    assert!(files.len() > 4, "docs/ has pages: {files:?}");
    let bad = broken_links(&root, &files);
    assert!(bad.is_empty(), "broken docs links:\n{}", bad.join("\n"));
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let linked: HashSet<String> = links(&readme)
        .into_iter()
        .map(|(_, t)| t.split('#').next().unwrap_or("").to_string())
        .collect();
    let orphans: Vec<String> = pages(&root)
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p != "README.md" && !linked.contains(p))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages the README does not link: {orphans:?}"
    );
}

/// The checker itself: on a scratch tree it finds a missing file and a missing anchor, and
/// passes a good link, a same-page anchor, a link in code and an external URL.
#[test]
fn the_checker_finds_a_missing_file_and_a_missing_anchor() {
    let dir = std::env::temp_dir().join(format!("ulnet-docs-links-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).expect("scratch dir");
    std::fs::write(
        dir.join("docs/a.md"),
        "# Page A\n\n## The `net show` keys\n\nSee [top](#page-a) and [keys](#the-net-show-keys).\n",
    )
    .expect("write a.md");
    std::fs::write(
        dir.join("README.md"),
        "# R\n\n[a](docs/a.md), [a's keys](docs/a.md#the-net-show-keys),\n\
         [gone](docs/gone.md), [bad anchor](docs/a.md#nope), [web](https://example.org/x.md),\n\
         `[code](docs/nothing.md)`\n\n    [indented](docs/nothing.md)\n",
    )
    .expect("write README.md");
    let bad = broken_links(
        &dir,
        &[PathBuf::from("README.md"), PathBuf::from("docs/a.md")],
    );
    std::fs::remove_dir_all(&dir).expect("remove scratch dir");
    assert_eq!(
        bad,
        vec![
            "README.md:4: docs/gone.md: no such file".to_string(),
            "README.md:4: docs/a.md#nope: no heading with anchor '#nope'".to_string(),
        ]
    );
}

/// The pages under docs/ written for contributors, not shipped in the .deb.
const CONTRIBUTOR_PAGES: &[&str] = &["docs/architecture.md", "docs/tcp-fabric.md"];

/// The .deb ships the admin's pages: `packaging/doc-pages` (what build-deb.sh installs and
/// check-deb.sh checks) lists exactly the pages under docs/ but the contributor's architecture.
#[test]
fn every_admin_page_ships_in_the_deb() {
    let root = root();
    let list = std::fs::read_to_string(root.join("packaging/doc-pages")).expect("doc-pages");
    let mut shipped: Vec<String> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    shipped.sort();
    let mut admin: Vec<String> = pages(&root)
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.starts_with("docs/") && !CONTRIBUTOR_PAGES.contains(&p.as_str()))
        .collect();
    admin.sort();
    assert_eq!(shipped, admin, "packaging/doc-pages against docs/*.md");
}
