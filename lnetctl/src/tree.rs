//! One document tree for every answer lnetctl prints. Real lnetctl builds a cYAML tree and prints
//! it as YAML, or as JSON with `--json` (liblnetconfig's cYAML_print_tree / cYAML_dump); we do the
//! same, so the two forms cannot drift: a key, its place and its value are decided once, when the
//! tree is built.
//!
//! The YAML layouts are lnetctl's two printers' ([`Style`]): its cYAML tree printer (cyaml.c,
//! `global show`, `routing show`, `stats show`), and libyaml's emitter re-dumping what the kernel
//! sent over netlink, with indent 6 for `net`, `route` and `peer show` and the default 2 for
//! `ping` (lnetctl.c; LNET_DEFAULT_INDENT in liblnetconfig.h).
//! A string that a YAML reader would misread (one with `: ` inside, a leading indicator, or one
//! that YAML 1.2 or 1.1 reads as a number, a boolean or null) is double-quoted, so that `yaml.safe_load` and
//! friends read what we meant; lnetctl prints its error texts bare, which no YAML reader takes.

use std::fmt::Write;

/// A scalar: lnetctl prints integers and strings; netlink-era flags are booleans.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scalar {
    /// No value: `key:` alone (lnetctl's `manage: - ping:`), `null` in JSON.
    Null,
    Int(i64),
    /// A number already formatted (`2.5`): bare in YAML and in JSON.
    Num(String),
    Bool(bool),
    Str(String),
}

/// A node of the document: a scalar, a mapping (keys in print order) or a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Scalar(Scalar),
    Map(Vec<(String, Node)>),
    List(Vec<Node>),
}

/// `Node::Scalar` from each type lnetctl prints as a scalar, with that type's conversion.
macro_rules! scalar_from {
    ($($t:ty => |$v:ident| $scalar:expr;)*) => {$(
        impl From<$t> for Node {
            fn from($v: $t) -> Node {
                Node::Scalar($scalar)
            }
        }
    )*};
}
scalar_from! {
    i64 => |v| Scalar::Int(v);
    i32 => |v| Scalar::Int(v.into());
    u16 => |v| Scalar::Int(v.into());
    u32 => |v| Scalar::Int(v.into());
    // Counters beyond i64 cannot happen in practice; saturate rather than wrap.
    u64 => |v| Scalar::Int(i64::try_from(v).unwrap_or(i64::MAX));
    usize => |v| Scalar::Int(i64::try_from(v).unwrap_or(i64::MAX));
    bool => |v| Scalar::Bool(v);
    &str => |v| Scalar::Str(v.to_string());
    String => |v| Scalar::Str(v);
    &String => |v| Scalar::Str(v.clone());
}
impl From<Map> for Node {
    fn from(m: Map) -> Node {
        Node::Map(m.0)
    }
}
impl<T: Into<Node>> From<Vec<T>> for Node {
    fn from(v: Vec<T>) -> Node {
        Node::List(v.into_iter().map(Into::into).collect())
    }
}

/// A struct field's value as a node (what [`fields!`] adds).
pub(crate) fn field<T: Clone + Into<Node>>(v: &T) -> Node {
    v.clone().into()
}

/// `fields!(map, s => a, b, "c d" = c_d, ?e)`: `map` with `s`'s fields added in the order
/// listed, each under its own name, or under lnetctl's key where that differs (`"key" =
/// field`); a `?` field is an `Option`, added only when it is `Some`. lnetctl's key tables are
/// lists of names: one line each, not a `.with("key", s.key)` call per key.
macro_rules! fields {
    ($m:expr, $s:expr => $($rest:tt)*) => { fields!(@ $m, $s; $($rest)*) };
    (@ $m:expr, $s:expr;) => { $m };
    (@ $m:expr, $s:expr; $k:literal = ? $f:ident $(, $($rest:tt)*)?) => {
        fields!(@ $m.with_opt($k, $s.$f.as_ref().map($crate::tree::field)), $s; $($($rest)*)?)
    };
    (@ $m:expr, $s:expr; $k:literal = $f:ident $(, $($rest:tt)*)?) => {
        fields!(@ $m.with($k, $crate::tree::field(&$s.$f)), $s; $($($rest)*)?)
    };
    (@ $m:expr, $s:expr; ? $f:ident $(, $($rest:tt)*)?) => {
        fields!(@ $m.with_opt(stringify!($f), $s.$f.as_ref().map($crate::tree::field)), $s; $($($rest)*)?)
    };
    (@ $m:expr, $s:expr; $f:ident $(, $($rest:tt)*)?) => {
        fields!(@ $m.with(stringify!($f), $crate::tree::field(&$s.$f)), $s; $($($rest)*)?)
    };
}
pub(crate) use fields;

/// A mapping under construction, in print order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Map(pub Vec<(String, Node)>);

impl Map {
    pub fn new() -> Map {
        Map::default()
    }

    /// Adds `key: value`.
    pub fn with(mut self, key: &str, value: impl Into<Node>) -> Map {
        self.0.push((key.to_string(), value.into()));
        self
    }

    /// Adds `key: value` when there is a value.
    pub fn with_opt<T: Into<Node>>(self, key: &str, value: Option<T>) -> Map {
        match value {
            Some(v) => self.with(key, v),
            None => self,
        }
    }

    /// Adds `key: value` in place.
    pub fn push(&mut self, key: &str, value: impl Into<Node>) {
        self.0.push((key.to_string(), value.into()));
    }

    /// Adds each `(name, count)` pair as its own key.
    pub fn counters<'a>(mut self, pairs: impl IntoIterator<Item = (&'a String, &'a u64)>) -> Map {
        for (k, v) in pairs {
            self.push(k, *v);
        }
        self
    }
}

// ------------------------------------------------------------------------------------ YAML

/// Which of lnetctl's printers a document is laid out as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// cYAML: a mapping's children four columns right of its key; a sequence under a
    /// top-level key has its `- ` at column 4, under any other key two columns right of the
    /// key; the first key of an item shares the `- ` line.
    Cyaml,
    /// libyaml with indent N: a sequence is indentless (its `-` in its key's column); an item
    /// mapping's first key follows `-` and N-1 spaces; a mapping's children N columns right.
    Libyaml(usize),
}

/// The net, route and peer shows (and those sections of an export).
pub const NETLINK: Style = Style::Libyaml(6);
/// `ping` and `discover`.
pub const PING: Style = Style::Libyaml(2);

/// The document in cYAML's layout.
pub fn to_yaml(doc: &Map) -> String {
    to_yaml_as(doc, Style::Cyaml)
}

/// The document in `style`.
pub fn to_yaml_as(doc: &Map, style: Style) -> String {
    let mut out = String::new();
    map_yaml(&mut out, &doc.0, 0, false, style);
    out
}

impl Style {
    /// Columns from a key to its mapping's keys.
    fn map_indent(self) -> usize {
        match self {
            Style::Cyaml => 4,
            Style::Libyaml(n) => n.max(2),
        }
    }

    /// Columns from an item's `-` to its keys (`- ` then the key in cYAML).
    fn item_indent(self) -> usize {
        match self {
            Style::Cyaml => 2,
            Style::Libyaml(n) => n.max(2),
        }
    }

    /// The `-` column of a sequence under a key at `col`.
    fn dash_under(self, col: usize) -> usize {
        match self {
            Style::Cyaml if col == 0 => 4,
            Style::Cyaml => col + 2,
            // Indentless: the `-` in its key's column.
            Style::Libyaml(_) => col,
        }
    }

    /// The `-` column of a sequence that is itself an item at `dash`.
    fn nested_dash(self, dash: usize) -> usize {
        match self {
            Style::Cyaml => dash + 4,
            Style::Libyaml(n) => dash + n.max(2),
        }
    }
}

/// Writes the entries of a mapping whose keys sit at column `col`. With `first`, the first key
/// continues a `-` already written.
/// The rest of a `key:` or `-` line for a node that fits on it (a scalar, an empty map or list),
/// the same under a key and in a list.
fn leaf_yaml(out: &mut String, node: &Node) {
    match node {
        Node::Scalar(Scalar::Null) => {}
        Node::Scalar(s) => {
            out.push(' ');
            scalar_yaml(out, s);
        }
        Node::Map(_) => out.push_str(" {}"),
        Node::List(_) => out.push_str(" []"),
    }
    out.push('\n');
}

fn map_yaml(out: &mut String, entries: &[(String, Node)], col: usize, first: bool, st: Style) {
    let mut first = first;
    for (key, value) in entries {
        if !std::mem::take(&mut first) {
            pad(out, col);
        }
        out.push_str(key);
        out.push(':');
        match value {
            Node::Map(m) if !m.is_empty() => {
                out.push('\n');
                map_yaml(out, m, col + st.map_indent(), false, st);
            }
            Node::List(items) if !items.is_empty() => {
                out.push('\n');
                list_yaml(out, items, st.dash_under(col), st);
            }
            leaf => leaf_yaml(out, leaf),
        }
    }
}

fn list_yaml(out: &mut String, items: &[Node], dash: usize, st: Style) {
    for item in items {
        pad(out, dash);
        out.push('-');
        match item {
            Node::Map(m) if !m.is_empty() => {
                pad(out, st.item_indent() - 1);
                map_yaml(out, m, dash + st.item_indent(), true, st);
            }
            Node::List(l) if !l.is_empty() => {
                out.push('\n');
                list_yaml(out, l, st.nested_dash(dash), st);
            }
            leaf => leaf_yaml(out, leaf),
        }
    }
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn scalar_yaml(out: &mut String, s: &Scalar) {
    match s {
        Scalar::Null => {}
        Scalar::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Scalar::Num(v) => out.push_str(v),
        Scalar::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Scalar::Str(v) if needs_quotes(v) => out.push_str(&yaml_quoted(v)),
        Scalar::Str(v) => out.push_str(v),
    }
}

/// Whether a plain YAML scalar would not read back as this very string.
fn needs_quotes(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return true;
    };
    let digits = |t: &str, radix: u32| !t.is_empty() && t.chars().all(|c| c.is_digit(radix));
    let unsigned = s.strip_prefix(['-', '+']).unwrap_or(s);
    s.contains(": ")
        || s.contains(" #")
        || s.ends_with(':')
        || s.starts_with(' ')
        || s.ends_with(' ')
        || s.chars().any(char::is_control)
        || "-?:,[]{}#&*!|>'\"%@`".contains(first)
        // YAML 1.2's booleans and null, and 1.1's (PyYAML and others still read `off` as false).
        || matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "~" | "yes" | "no" | "y" | "n" | "on" | "off"
        )
        || s.parse::<f64>().is_ok()
        || unsigned.strip_prefix("0x").is_some_and(|t| digits(t, 16))
        || unsigned.strip_prefix("0o").is_some_and(|t| digits(t, 8))
        || matches!(
            unsigned.to_ascii_lowercase().as_str(),
            ".inf" | ".nan"
        )
        // YAML 1.1's other numbers (1_000, 0b101, 12:30 sexagesimal), its dates
        // (2024-01-01), and its merge and value keys.
        || (unsigned.contains('_') && digits(&unsigned.replace('_', ""), 10))
        || unsigned.strip_prefix("0b").is_some_and(|t| digits(t, 2))
        || (unsigned.contains(':') && unsigned.split(':').all(|p| digits(p, 10)))
        || is_date(s)
        || s == "<<"
        || s == "="
}

/// `YYYY-MM-DD`, which YAML 1.1 readers turn into a date.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 8
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && s[5..]
            .split(['-', 'T', ' '])
            .take(2)
            .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
}

// ------------------------------------------------------------------------------------ JSON

/// The same document as JSON (two-space indentation, keys in the YAML's order).
pub fn to_json(doc: &Map) -> String {
    let mut out = String::new();
    map_json(&mut out, &doc.0, 0);
    out.push('\n');
    out
}

fn node_json(out: &mut String, node: &Node, indent: usize) {
    match node {
        Node::Scalar(Scalar::Null) => out.push_str("null"),
        Node::Scalar(Scalar::Int(v)) => {
            let _ = write!(out, "{v}");
        }
        Node::Scalar(Scalar::Num(v)) => out.push_str(v),
        Node::Scalar(Scalar::Bool(b)) => {
            let _ = write!(out, "{b}");
        }
        Node::Scalar(Scalar::Str(s)) => out.push_str(&json_string(s)),
        Node::Map(m) => map_json(out, m, indent),
        Node::List(items) if items.is_empty() => out.push_str("[]"),
        Node::List(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                pad(out, indent + 2);
                node_json(out, item, indent + 2);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(out, indent);
            out.push(']');
        }
    }
}

fn map_json(out: &mut String, entries: &[(String, Node)], indent: usize) {
    if entries.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push_str("{\n");
    for (i, (k, v)) in entries.iter().enumerate() {
        pad(out, indent + 2);
        out.push_str(&json_string(k));
        out.push_str(": ");
        node_json(out, v, indent + 2);
        out.push_str(if i + 1 < entries.len() { ",\n" } else { "\n" });
    }
    pad(out, indent);
    out.push('}');
}

/// A double-quoted YAML scalar: JSON's escapes (valid in YAML), plus DEL and the C1 controls,
/// which YAML forbids raw and JSON leaves as they are.
fn yaml_quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    for c in json_string(s).chars() {
        if ('\u{7f}'..='\u{9f}').contains(&c) {
            let _ = write!(q, "\\u{:04x}", u32::from(c));
        } else {
            q.push(c);
        }
    }
    q
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

// ------------------------------------------------------------------------------------ back

#[cfg(test)]
/// The tree of a parsed JSON value: the inverse of
/// [`to_json`] (in serde_json's key order).
pub fn from_json(v: &serde_json::Value) -> Node {
    match v {
        serde_json::Value::Null => Node::Scalar(Scalar::Null),
        serde_json::Value::Bool(b) => Node::from(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Node::from(i),
            None => Node::Scalar(Scalar::Num(n.to_string())),
        },
        serde_json::Value::String(s) => Node::from(s.as_str()),
        serde_json::Value::Array(a) => Node::List(a.iter().map(from_json).collect()),
        serde_json::Value::Object(o) => {
            Node::Map(o.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

#[cfg(test)]
/// The tree with every mapping's keys sorted: what is left to compare once key order is not
/// the question (serde_json's maps do not keep order).
pub fn canonical(n: &Node) -> Node {
    match n {
        Node::Scalar(s) => Node::Scalar(s.clone()),
        Node::List(l) => Node::List(l.iter().map(canonical).collect()),
        Node::Map(m) => {
            let mut m: Vec<(String, Node)> =
                m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect();
            m.sort_by(|a, b| a.0.cmp(&b.0));
            Node::Map(m)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `net:` with one net of `net_type` that has the one local NI `ni`.
    fn one_ni_net(net_type: &str, ni: Map) -> Map {
        let net = Map::new()
            .with("net type", net_type)
            .with("local NI(s)", vec![ni]);
        Map::new().with("net", vec![net])
    }

    fn sample() -> Map {
        let ni = Map::new()
            .with("nid", "10.0.0.1@o2ib")
            .with("status", "up")
            .with("statistics", Map::new().with("send_count", 3u64))
            .with("interfaces", Map::new().with("0", "ib0"));
        one_ni_net("o2ib", ni)
            .with("route", Vec::<Map>::new())
            .with(
                "manage",
                vec![Map::new().with(
                    "ping",
                    Map::new()
                        .with("errno", -110)
                        .with("descr", "failed to ping 10.0.0.9@o2ib: timed out"),
                )],
            )
    }

    #[test]
    fn yaml_has_lnetctl_layout() {
        assert_eq!(
            to_yaml(&sample()),
            "\
net:
    - net type: o2ib
      local NI(s):
        - nid: 10.0.0.1@o2ib
          status: up
          statistics:
              send_count: 3
          interfaces:
              0: ib0
route: []
manage:
    - ping:
          errno: -110
          descr: \"failed to ping 10.0.0.9@o2ib: timed out\"
"
        );
    }

    /// sanity-lnet test 108's expected `net show` lines, and lnetctl's ping layout (libyaml's
    /// default indent).
    #[test]
    fn libyaml_layouts_are_lnetctls() {
        let ni = Map::new()
            .with("nid", "192.168.1.10@tcp")
            .with("status", "up")
            .with("interfaces", Map::new().with("0", "eth0"));
        let doc = one_ni_net("tcp", ni);
        assert_eq!(
            to_yaml_as(&doc, NETLINK),
            "\
net:
-     net type: tcp
      local NI(s):
      -     nid: 192.168.1.10@tcp
            status: up
            interfaces:
                  0: eth0
"
        );
        let ping = Map::new()
            .with(
                "ping",
                vec![Map::new()
                    .with("primary nid", "10.0.0.2@tcp")
                    .with("Multi-Rail", true)
                    .with("peer_ni", vec![Map::new().with("nid", "10.0.0.2@tcp")])],
            )
            .with(
                "manage",
                vec![Map::new()
                    .with("ping", Node::Scalar(Scalar::Null))
                    .with("errno", -113)],
            );
        assert_eq!(
            to_yaml_as(&ping, PING),
            "\
ping:
- primary nid: 10.0.0.2@tcp
  Multi-Rail: true
  peer_ni:
  - nid: 10.0.0.2@tcp
manage:
- ping:
  errno: -113
"
        );
    }

    #[test]
    fn json_keeps_order_and_types() {
        let j = to_json(&sample());
        assert!(
            j.starts_with("{\n  \"net\": [\n    {\n      \"net type\": \"o2ib\",\n"),
            "{j}"
        );
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["net"][0]["local NI(s)"][0]["statistics"]["send_count"], 3);
        assert_eq!(v["route"], serde_json::json!([]));
        assert_eq!(canonical(&Node::from(sample())), canonical(&from_json(&v)));
    }

    #[test]
    fn strings_that_yaml_would_misread_are_quoted() {
        for s in [
            "true",
            "False",
            "12",
            "1.5",
            "-3",
            "a: b",
            "",
            " x",
            "- x",
            "0x1f",
            "x #y",
            "~",
            "off",
            "Yes",
            "1_000",
            "0b101",
            "12:30",
            "1:2:3",
            "2024-01-01",
            "<<",
            "=",
            "a\u{7f}",
        ] {
            assert!(needs_quotes(s), "{s}");
        }
        for s in [
            "10.0.0.1@o2ib",
            "up",
            "down",
            "NA",
            "o2ib1",
            "cpt[0]",
            "failed to ping x",
            "0@lo",
        ] {
            assert!(!needs_quotes(s), "{s}");
        }
        let m = Map::new().with("descr", "a: b").with("v", "true");
        assert_eq!(to_yaml(&m), "descr: \"a: b\"\nv: \"true\"\n");
        let c1 = Map::new().with("x", "a\u{85}b");
        assert_eq!(to_yaml(&c1), "x: \"a\\u0085b\"\n");
        // IPv6 NIDs and interface labels stay plain.
        for s in ["fe80::1@tcp", "eth0:1", "10.0.0.1@o2ib"] {
            assert!(!needs_quotes(s), "{s}");
        }
    }
}
