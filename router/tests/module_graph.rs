//! The layering of `router`, checked from its sources (the twin of `lnd/tests/module_graph.rs`,
//! at file level): every `crate::`, `super::`, `self::` and child-module path a file names, in
//! code and in `use` trees, is resolved to the file that defines the item, through the
//! re-exports of `lib.rs` and of a module's `mod.rs` (`crate::NiIndex` names the file that
//! defines `NiIndex`, not `lib.rs`). On that graph:
//!
//! - no cycle between files (a cycle is printed with the path that makes each step);
//! - every file has a layer in [`LAYERS`], and no file names one in a layer above its own;
//! - the LNet core and forwarding name nothing of `lnd::engine`, `lnd::fabric` or `lnd::driver`
//!   beyond the files of [`NOT_YET_ON_THE_LND_TRAIT`].
//!
//! Test-only code is left out (`#[cfg(test)]` items and the files they declare: tests may reach
//! anywhere), as are comments and string literals. `lnetctl`'s files are checked for cycles too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers of `router`, bottom first: a file may name files of its own layer or below.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    /// The LNet node and what it is built from: its types, peers, credits, routes, gateways,
    /// health, ping service, counters and tunables.
    Core,
    /// What a router adds to move other nodes' messages: forwards, handovers, router buffers.
    Forwarding,
    /// Running nodes: one NI's loop with its driver, the relay between NI threads, the pool of
    /// large buffers, the verbs glue, the simulator's hosts.
    Runtime,
    /// lnet_selftest over a node.
    Selftest,
    /// The control protocol, its views of a node, its service, client and server.
    Control,
    /// The daemon: its configuration, and the daemon itself (`daemon/`; main.rs, the binary,
    /// is not in this graph).
    Daemon,
}

/// Where each file of `router/src` sits (module path; `node::bulk` is `src/node/bulk.rs`). A
/// file missing here fails the test: a new file must be placed. Facades (`lib.rs`,
/// `control/mod.rs`, `selftest/mod.rs`: files of `mod` and `use` items only, the crate's API
/// paths) have no layer: a path through them is resolved to the file that defines the item.
const LAYERS: &[(&str, Layer)] = &[
    ("ids", Layer::Core),
    ("error", Layer::Core),
    ("text", Layer::Core),
    ("config", Layer::Core),
    ("globals", Layer::Core),
    ("stats", Layer::Core),
    ("peer", Layer::Core),
    ("ping", Layer::Core),
    ("health", Layer::Core),
    ("alive", Layer::Core),
    ("routes", Layer::Core),
    ("gateway", Layer::Core),
    ("node", Layer::Core),
    ("node::bulk", Layer::Core),
    ("node::bulk_state", Layer::Core),
    ("node::fwd_state", Layer::Core),
    ("node::paths", Layer::Core),
    ("node::peers", Layer::Core),
    ("node::pinger", Layer::Core),
    ("node::pings", Layer::Core),
    ("node::receive", Layer::Core),
    ("node::send", Layer::Core),
    ("node::recovery", Layer::Core),
    ("node::timers", Layer::Core),
    // The public types forwarding is counted and handed over with (the peer table's router
    // credit queue holds their keys): core.
    ("forward", Layer::Core),
    // The pipeline, stage by stage: above the core it runs on (the node's struct holds its
    // state through `node::fwd_state`).
    ("node::forwarding", Layer::Forwarding),
    // Which LND each NI runs (o2ib) and how a fabric driver reaches it: above the core.
    ("o2ib", Layer::Runtime),
    ("sock", Layer::Runtime),
    ("runtime", Layer::Runtime),
    ("relay", Layer::Runtime),
    ("bulk_pool", Layer::Runtime),
    ("rdma", Layer::Runtime),
    ("sim_node", Layer::Runtime),
    ("sim_storm", Layer::Runtime),
    ("selftest::wire", Layer::Selftest),
    ("selftest::wire::messages", Layer::Selftest),
    ("selftest::wire::codec", Layer::Selftest),
    ("selftest::wire::framework", Layer::Selftest),
    ("selftest::wire::bodies", Layer::Selftest),
    ("selftest::wire::patterns", Layer::Selftest),
    ("selftest::pattern", Layer::Selftest),
    ("selftest::srpc", Layer::Selftest),
    ("selftest::console_types", Layer::Selftest),
    ("selftest::service", Layer::Selftest),
    ("selftest::service::client", Layer::Selftest),
    ("selftest::console", Layer::Selftest),
    ("control::protocol", Layer::Control),
    ("control::capture", Layer::Control),
    ("control::client", Layer::Control),
    ("control::views", Layer::Control),
    ("control::service", Layer::Control),
    ("control::server", Layer::Control),
    // Applies an imported Lustre configuration to the daemon's (`yaml_config::DaemonConfig`);
    // built with the daemon only.
    ("control::import", Layer::Daemon),
    ("yaml_config::model", Layer::Daemon),
    ("yaml_config::raw", Layer::Daemon),
    ("yaml_config::lowering", Layer::Daemon),
    ("yaml_config::errors", Layer::Daemon),
    // The lnet-router daemon as a library module (its binary, main.rs, is not in this graph).
    ("daemon", Layer::Daemon),
    ("daemon::args", Layer::Daemon),
    ("daemon::notify", Layer::Daemon),
    ("daemon::signals", Layer::Daemon),
    ("daemon::fabric", Layer::Daemon),
    ("daemon::config", Layer::Daemon),
    ("daemon::state", Layer::Daemon),
    ("daemon::capture", Layer::Daemon),
    ("daemon::selftest", Layer::Daemon),
    ("daemon::events", Layer::Daemon),
    ("daemon::handovers", Layer::Daemon),
    ("daemon::ni_loop", Layer::Daemon),
    ("daemon::ni_set", Layer::Daemon),
    ("daemon::fan_out", Layer::Daemon),
    ("daemon::serve", Layer::Daemon),
    ("daemon::metrics", Layer::Daemon),
    ("daemon::metrics::snapshot", Layer::Daemon),
    ("daemon::metrics::encode", Layer::Daemon),
    ("daemon::metrics::http", Layer::Daemon),
    ("daemon::metrics::scrape", Layer::Daemon),
];

/// Files of the LNet core and forwarding allowed to name `lnd::engine`, `lnd::fabric` or
/// `lnd::driver`: none since LNet talks to its LNDs through `lnd::iface::Lnd` (issue 33 item 1).
/// A file that names them fails the test; the layer that knows an NI's LND is `o2ib` (Runtime).
const NOT_YET_ON_THE_LND_TRAIT: &[&str] = &[];

/// The `lnd` modules the LNet core and forwarding may not name.
const LND_BELOW_THE_TRAIT: &[&str] = &["engine", "fabric", "driver", "stream", "sock"];

// ------------------------------------------------------------------------------- lexing

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of Rust source that matter here: identifiers (keywords included), `::` and
/// single punctuation. Comments, string, byte-string and char literals and lifetimes are
/// dropped; numbers come out as identifiers (harmless).
fn lex(src: &str) -> Vec<Tok> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if (c == 'r' || (c == 'b' && next == Some('r'))) && {
            let s = if c == 'b' { i + 2 } else { i + 1 };
            let mut j = s;
            while b.get(j) == Some(&'#') {
                j += 1;
            }
            b.get(j) == Some(&'"') && (i == 0 || !ident(b[i - 1]))
        } {
            // A raw string: r"..", r#".."#, br"..".
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while b[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == 'b' && next == Some('"') {
            i += 1; // the string itself next turn
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < b.len() && ident(b[i]) {
                    i += 1;
                }
            }
        } else if ident(c) {
            let s = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            out.push(Tok::Ident(b[s..i].iter().collect()));
        } else if c == ':' && next == Some(':') {
            out.push(Tok::Path);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
            i += 1;
        }
    }
    out
}

fn is(t: Option<&Tok>, s: &str) -> bool {
    matches!(t, Some(Tok::Ident(x)) if x == s)
}

fn punct(t: Option<&Tok>, c: char) -> bool {
    matches!(t, Some(Tok::Punct(x)) if *x == c)
}

/// The end (exclusive) of the item starting at `i`: after the `;` that ends it, or after the
/// `}` that closes its first top-level block.
fn item_end(t: &[Tok], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < t.len() {
        match &t[i] {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return i + 1,
            Tok::Punct('{') if depth == 0 => {
                let mut d = 0;
                while i < t.len() {
                    match &t[i] {
                        Tok::Punct('{') => d += 1,
                        Tok::Punct('}') => {
                            d -= 1;
                            if d == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    t.len()
}

/// The tokens without `#[cfg(test)]` items (with the attributes around them).
fn strip_test_items(t: Vec<Tok>) -> Vec<Tok> {
    let cfg_test = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i..].starts_with(&cfg_test) {
            i += cfg_test.len();
            // Other attributes of the same item.
            while punct(t.get(i), '#') && punct(t.get(i + 1), '[') {
                let mut d = 0;
                i += 1;
                loop {
                    match t.get(i) {
                        Some(Tok::Punct('[')) => d += 1,
                        Some(Tok::Punct(']')) => {
                            d -= 1;
                            if d == 0 {
                                i += 1;
                                break;
                            }
                        }
                        None => break,
                        _ => {}
                    }
                    i += 1;
                }
            }
            i = item_end(&t, i);
        } else {
            out.push(t[i].clone());
            i += 1;
        }
    }
    out
}

// ------------------------------------------------------------------------------- parsing

/// A path as written: its segments, and where it came from (for messages).
#[derive(Clone, Debug)]
struct Written {
    segs: Vec<String>,
    /// A `pub`/`pub(..)` use: a re-export.
    reexport: bool,
    /// The name it is known by here (its last segment, or the `as` alias).
    alias: Option<String>,
}

fn parse_use_tree(
    t: &[Tok],
    i: &mut usize,
    prefix: Vec<String>,
    reexport: bool,
    out: &mut Vec<Written>,
) {
    let mut segs = prefix;
    loop {
        match t.get(*i) {
            Some(Tok::Path) => *i += 1,
            Some(Tok::Ident(s)) if s == "as" => {
                *i += 1;
                let alias = match t.get(*i) {
                    Some(Tok::Ident(a)) => a.clone(),
                    _ => String::new(),
                };
                *i += 1;
                out.push(Written {
                    segs: segs.clone(),

                    reexport,
                    alias: Some(alias),
                });
                return;
            }
            Some(Tok::Ident(s)) => {
                if s == "self" && !segs.is_empty() {
                    // `a::{self, ..}`: `a` itself.
                    *i += 1;
                    continue;
                }
                segs.push(s.clone());
                *i += 1;
            }
            Some(Tok::Punct('*')) => {
                *i += 1;
                segs.push("*".into());
                out.push(Written {
                    segs,

                    reexport,
                    alias: None,
                });
                return;
            }
            Some(Tok::Punct('{')) => {
                *i += 1;
                loop {
                    match t.get(*i) {
                        Some(Tok::Punct('}')) => {
                            *i += 1;
                            return;
                        }
                        Some(Tok::Punct(',')) => *i += 1,
                        None => return,
                        _ => parse_use_tree(t, i, segs.clone(), reexport, out),
                    }
                }
            }
            _ => {
                let alias = segs.last().cloned();
                out.push(Written {
                    segs,

                    reexport,
                    alias,
                });
                return;
            }
        }
    }
}

/// One source file: its module path, its non-test child modules, and the paths it writes.
struct SrcFile {
    path: PathBuf,
    module: Vec<String>,
    /// The directory its child modules' files are in.
    child_dir: PathBuf,
    children: BTreeSet<String>,
    /// Names defined at its top level (`struct X`, `fn x`, `mod x { .. }`, ...).
    defines: BTreeSet<String>,
    /// Only `mod x;` and `use` items: the API paths of the files below it.
    facade: bool,
    written: Vec<Written>,
}

fn parse_file(path: &Path, module: Vec<String>, child_dir: PathBuf) -> SrcFile {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t = strip_test_items(lex(&text));
    let mut children = BTreeSet::new();
    let mut defines = BTreeSet::new();
    let mut written = Vec::new();
    let mut facade = true;
    let mut depth = 0;
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth -= 1,
            Tok::Ident(k) if depth == 0 && k == "mod" => {
                if let Some(Tok::Ident(name)) = t.get(i + 1) {
                    if punct(t.get(i + 2), ';') {
                        children.insert(name.clone());
                    } else {
                        defines.insert(name.clone());
                        facade = false;
                    }
                }
            }
            Tok::Ident(k) if depth == 0 && (k == "impl" || k == "macro_rules") => facade = false,
            Tok::Ident(k)
                if depth == 0
                    && [
                        "struct", "enum", "fn", "const", "static", "type", "trait", "union",
                    ]
                    .contains(&k.as_str()) =>
            {
                if let Some(Tok::Ident(name)) = t.get(i + 1) {
                    defines.insert(name.clone());
                }
                facade = false;
            }
            Tok::Ident(k) if k == "use" && !punct(t.get(i.wrapping_sub(1)), '.') => {
                // `pub use`, `pub(crate) use`, `pub(in ..) use`.
                let reexport =
                    is(t.get(i.wrapping_sub(1)), "pub") || punct(t.get(i.wrapping_sub(1)), ')');
                let mut j = i + 1;
                parse_use_tree(&t, &mut j, Vec::new(), reexport, &mut written);
                i = j;
                continue;
            }
            Tok::Ident(k) if matches!(t.get(i + 1), Some(Tok::Path)) => {
                // A path in code: `crate::`, `super::`, `self::`, a child module, or an extern
                // crate; only its start (`a::b::C`), not a continuation.
                let cont = matches!(t.get(i.wrapping_sub(1)), Some(Tok::Path))
                    || punct(t.get(i.wrapping_sub(1)), '.');
                if !cont && k != "Self" {
                    let mut segs = vec![k.clone()];
                    let mut j = i + 1;
                    while matches!(t.get(j), Some(Tok::Path)) {
                        match t.get(j + 1) {
                            Some(Tok::Ident(s)) => {
                                segs.push(s.clone());
                                j += 2;
                            }
                            _ => break,
                        }
                    }
                    written.push(Written {
                        segs,

                        reexport: false,
                        alias: None,
                    });
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    SrcFile {
        path: path.to_path_buf(),
        module,
        child_dir,
        children,
        defines,
        facade,
        written,
    }
}

/// A crate's files by module path (`""` is the root), found from the root's `mod` items.
struct Crate {
    name: &'static str,
    files: BTreeMap<String, SrcFile>,
}

fn key(m: &[String]) -> String {
    m.join("::")
}

impl Crate {
    fn load(name: &'static str, src: &Path, root: &str) -> Crate {
        let mut files = BTreeMap::new();
        let mut todo = vec![parse_file(&src.join(root), Vec::new(), src.to_path_buf())];
        while let Some(f) = todo.pop() {
            for c in &f.children {
                let flat = f.child_dir.join(format!("{c}.rs"));
                let (p, dir) = if flat.exists() {
                    (flat, f.child_dir.join(c))
                } else {
                    (f.child_dir.join(c).join("mod.rs"), f.child_dir.join(c))
                };
                let mut m = f.module.clone();
                m.push(c.clone());
                todo.push(parse_file(&p, m, dir));
            }
            files.insert(key(&f.module), f);
        }
        Crate { name, files }
    }

    fn is_module(&self, m: &[String]) -> bool {
        self.files.contains_key(&key(m))
    }

    /// A written path made absolute from the crate root, or `Err` with the whole path for an
    /// extern crate's (`lnd::engine::X`).
    fn absolute(&self, from: &SrcFile, w: &Written) -> Result<Vec<String>, Vec<String>> {
        let mut segs = w.segs.as_slice();
        let mut base: Vec<String>;
        match segs.first().map(String::as_str) {
            Some("crate") => {
                base = Vec::new();
                segs = &segs[1..];
            }
            Some("self") => {
                base = from.module.clone();
                segs = &segs[1..];
            }
            Some("super") => {
                base = from.module.clone();
                while segs.first().is_some_and(|s| s == "super") {
                    base.pop();
                    segs = &segs[1..];
                }
            }
            Some(c) if from.children.contains(c) => base = from.module.clone(),
            _ => return Err(w.segs.clone()),
        }
        base.extend(segs.iter().cloned());
        Ok(base)
    }

    /// The file that defines what `path` names (or the extern path it re-exports).
    fn resolve(&self, path: &[String], depth: usize) -> Result<String, Vec<String>> {
        assert!(
            depth < 16,
            "{}: re-exports loop at {}",
            self.name,
            path.join("::")
        );
        let mut cur: Vec<String> = Vec::new();
        let mut i = 0;
        while i < path.len() && path[i] != "*" {
            let mut m = cur.clone();
            m.push(path[i].clone());
            if !self.is_module(&m) {
                break;
            }
            cur = m;
            i += 1;
        }
        let f = &self.files[&key(&cur)];
        if i == path.len() || path[i] == "*" || f.defines.contains(&path[i]) {
            return Ok(key(&cur));
        }
        let name = &path[i];
        for w in f.written.iter().filter(|w| w.reexport) {
            let glob = w.segs.last().is_some_and(|s| s == "*");
            if !glob && w.alias.as_deref() != Some(name.as_str()) {
                continue;
            }
            let target = match self.absolute(f, w) {
                Ok(t) => t,
                Err(ext) if !glob => return Err(ext),
                Err(_) => continue,
            };
            let mut t: Vec<String> = target;
            if glob {
                t.pop();
                // Only if the glob's module has the name.
                let Ok(g) = self.resolve(&t, depth + 1) else {
                    continue;
                };
                let gf = &self.files[&g];
                let has = gf.defines.contains(name)
                    || gf.written.iter().any(|w| {
                        w.reexport
                            && (w.alias.as_deref() == Some(name)
                                || w.segs.last().is_some_and(|s| s == "*"))
                    });
                if !has || g != key(&t) {
                    continue;
                }
                t.push(name.clone());
            }
            t.extend(path[i + 1..].iter().cloned());
            return self.resolve(&t, depth + 1);
        }
        Ok(key(&cur))
    }

    /// file -> file -> the first path written that makes the edge; and file -> the extern
    /// paths it names (directly or through a re-export).
    fn graph(&self) -> (Graph, BTreeMap<String, BTreeSet<String>>) {
        let mut g: Graph = BTreeMap::new();
        let mut ext: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (k, f) in &self.files {
            if k.is_empty() {
                continue;
            }
            let edges = g.entry(k.clone()).or_default();
            for w in &f.written {
                let shown = w.segs.join("::");
                let target = match self.absolute(f, w) {
                    Ok(abs) => self.resolve(&abs, 0),
                    Err(e) => Err(e),
                };
                match target {
                    Ok(to) => {
                        if to.is_empty() {
                            assert!(
                                self.name != "router",
                                "{}: `{shown}` names nothing lib.rs defines or re-exports",
                                f.path.display()
                            );
                        } else if &to != k {
                            edges.entry(to).or_insert(shown);
                        }
                    }
                    Err(e) => {
                        ext.entry(k.clone()).or_default().insert(e.join("::"));
                    }
                }
            }
        }
        (g, ext)
    }
}

/// file -> file it names -> the first path written that makes the edge.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn router() -> Crate {
    Crate::load(
        "router",
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "lib.rs",
    )
}

/// Every cycle of the graph (one per strongly connected component), as `a -> b -> .. -> a`
/// with the path written for each step.
fn cycles(g: &Graph) -> Vec<String> {
    // Tarjan's strongly connected components.
    struct S<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        sccs: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let l = s.low[w].min(s.low[v]);
                s.low.insert(v, l);
            } else if s.on.contains(w) {
                let l = s.index[w].min(s.low[v]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                c.push(w);
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                s.sccs.push(c);
            }
        }
    }
    let mut s = S {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    // One cycle through each component: a shortest way back to its first file.
    let mut out = Vec::new();
    for c in s.sccs {
        let inside: BTreeSet<&str> = c.iter().copied().collect();
        let start = *inside.iter().next().unwrap();
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut end = None;
        'bfs: while let Some(v) = queue.pop_front() {
            for w in g[v]
                .keys()
                .map(String::as_str)
                .filter(|w| inside.contains(w))
            {
                if w == start {
                    end = Some(v);
                    break 'bfs;
                }
                if !prev.contains_key(w) {
                    prev.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut way = vec![start];
        let mut v = end.unwrap();
        while v != start {
            way.push(v);
            v = prev[v];
        }
        way[1..].reverse();
        way.push(start);
        let steps: Vec<String> = way
            .windows(2)
            .map(|p| format!("{} -> {} (`{}`)", p[0], p[1], g[p[0]][p[1]]))
            .collect();
        let mut files = c.clone();
        files.sort_unstable();
        out.push(format!(
            "cycle through {} files {files:?}; one: {}",
            c.len(),
            steps.join(", ")
        ));
    }
    out
}

#[test]
fn no_file_cycle_in_router() {
    let (g, _) = router().graph();
    let c = cycles(&g);
    assert!(c.is_empty(), "router:\n{}", c.join("\n"));
}

#[test]
fn no_file_cycle_in_lnetctl() {
    // lnetctl's root is main.rs, which holds the CLI itself: its files' uses of it (`crate::exit`)
    // are not edges here, only those between its modules.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lnetctl/src");
    let (g, _) = Crate::load("lnetctl", &src, "main.rs").graph();
    assert!(g.len() > 3, "lnetctl's modules not found: {:?}", g.keys());
    let c = cycles(&g);
    assert!(c.is_empty(), "lnetctl:\n{}", c.join("\n"));
}

fn layer_of(m: &str) -> Option<Layer> {
    LAYERS.iter().find(|(k, _)| *k == m).map(|(_, l)| *l)
}

#[test]
fn every_file_has_a_layer_and_nothing_names_one_above_it() {
    let c = router();
    let (mut g, _) = c.graph();
    g.retain(|m, _| !c.files[m].facade);
    let unplaced: Vec<&String> = g.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "files without a layer (add them to LAYERS): {unplaced:?}"
    );
    let mut upward = Vec::new();
    for (from, edges) in &g {
        let lf = layer_of(from).unwrap();
        for (to, written) in edges {
            let Some(lt) = layer_of(to) else {
                panic!("{from} names the facade {to} as if it defined `{written}`")
            };
            if lt > lf {
                upward.push(format!("{from} ({lf:?}) names {to} ({lt:?}): `{written}`"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "upward references:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_lnet_core_and_forwarding_name_no_lnd_internals() {
    let (g, ext) = router().graph();
    let mut naming: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for m in g.keys() {
        if layer_of(m).is_some_and(|l| l > Layer::Forwarding) {
            continue;
        }
        let hits: Vec<&String> = ext
            .get(m)
            .into_iter()
            .flatten()
            .filter(|p| {
                let s: Vec<&str> = p.split("::").collect();
                s.first() == Some(&"lnd")
                    && s.get(1).is_some_and(|x| LND_BELOW_THE_TRAIT.contains(x))
            })
            .collect();
        if !hits.is_empty() {
            naming.insert(m.as_str(), hits);
        }
    }
    let new: Vec<String> = naming
        .iter()
        .filter(|(m, _)| !NOT_YET_ON_THE_LND_TRAIT.contains(m))
        .map(|(m, h)| format!("{m}: {h:?}"))
        .collect();
    assert!(
        new.is_empty(),
        "core or forwarding files naming lnd's engine, fabric or driver:\n{}",
        new.join("\n")
    );
    let stale: Vec<&&str> = NOT_YET_ON_THE_LND_TRAIT
        .iter()
        .filter(|m| !naming.contains_key(**m))
        .collect();
    assert!(
        stale.is_empty(),
        "in NOT_YET_ON_THE_LND_TRAIT but naming none of them now (take them out): {stale:?}"
    );
}

/// docs/architecture.md walks one routed 1 MiB PUT through the code: every
/// `path/to/file.rs::function` it names must be a function of that file (so a rename that
/// leaves the walk wrong fails here), and the walk stays short enough to read.
#[test]
fn docs_walk_names_functions_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let start = doc
        .find("## One routed 1 MiB PUT, file by file")
        .expect("the walk's section");
    let walk = &doc[start..];
    let walk = &walk[..walk[3..].find("\n## ").map_or(walk.len(), |i| i + 3)];
    let steps = walk
        .lines()
        .filter(|l| {
            let t = l.trim_start();
            t.split_once(". ")
                .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .count();
    assert!((1..=12).contains(&steps), "{steps} steps");
    let mut named = 0;
    let mut missing = Vec::new();
    for piece in walk.split('`') {
        let Some((file, func)) = piece.split_once(".rs::") else {
            continue;
        };
        if !(file.starts_with("router/") || file.starts_with("lnd/")) {
            continue;
        }
        named += 1;
        let src = std::fs::read_to_string(root.join(format!("{file}.rs")))
            .unwrap_or_else(|e| panic!("{file}.rs: {e}"));
        let found = src.match_indices(&format!("fn {func}")).any(|(i, m)| {
            src[i + m.len()..]
                .chars()
                .next()
                .is_some_and(|c| c == '(' || c == '<')
        });
        if !found {
            missing.push(format!("{file}.rs::{func}"));
        }
    }
    assert!(named >= 20, "the walk names {named} functions");
    assert!(
        missing.is_empty(),
        "the walk names functions that do not exist: {missing:?}"
    );
}
