//! `lnetctl import`: the document goes to the daemon, which checks it as its configuration
//! file is checked and applies it item by item (router::control::import). One part stays
//! here: the `peer:` section. ulnet has nothing to apply from it (a peer with one NI is made
//! when first used; Multi-Rail peers are refused), and a plain export of a big router lists
//! thousands of peers with their credits and counters, more than a control request carries.
//! So lnetctl checks it (refusing a Multi-Rail peer with its line, as the daemon would) and
//! sends the rest.

/// The document without its `peer:` section.
#[derive(Debug, PartialEq, Eq)]
pub struct Stripped {
    pub text: String,
    /// Peers the section listed (each already as the document says: nothing to do).
    pub peers: u32,
    /// The document's line number of each line of `text`, to name lines in the daemon's
    /// errors as the user's file has them.
    pub lines: Vec<usize>,
}

impl Stripped {
    /// The daemon's error, its `import:LINE` as `ORIGIN:LINE` of the user's file.
    pub fn locate(&self, message: &str, origin: &str) -> String {
        let Some(rest) = message.strip_prefix("import:") else {
            return message.to_string();
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        match digits.parse::<usize>() {
            Ok(n) if n >= 1 => {
                let line = self.lines.get(n - 1).copied().unwrap_or(n);
                format!("{origin}:{line}{}", &rest[digits.len()..])
            }
            _ => format!("{origin}:{rest}"),
        }
    }
}

/// `lnetctl net add`'s options, sent as the one-NI `net:` document an import of it would be
/// (the daemon checks it as its configuration file: the interface's address, the tunables'
/// ranges, the fabric), so that `net add` and `import` add an NI the same way.
pub struct NiToAdd {
    pub net: Option<String>,
    pub interface: Option<String>,
    pub nid: Option<String>,
    /// (key, value) of the NI's `tunables:`; `None` leaves the default.
    pub tunables: [(&'static str, Option<u32>); 4],
    /// `lnd tunables: conns_per_peer` (`--conns-per-peer`); `None` leaves the default.
    pub conns_per_peer: Option<u32>,
    pub fabric: Option<String>,
    pub listen: Option<String>,
}

impl NiToAdd {
    /// The document, or why the options cannot make one (lnetctl's own messages).
    pub fn document(&self) -> Result<String, String> {
        // Every value the user gave is a double-quoted scalar (a JSON string is one), so no
        // text of theirs can be read as YAML structure.
        let q = |v: &str| serde_json::to_string(v.trim()).unwrap_or_default();
        let net = match (&self.net, &self.nid) {
            (Some(_), Some(_)) => return Err("--net is invalid with --nid option".into()),
            (Some(n), None) => n.trim().to_string(),
            (None, Some(nid)) => match nid.trim().rsplit_once('@') {
                Some((_, net)) if !net.is_empty() => net.to_string(),
                _ => return Err(format!("bad NID '{}'", nid.trim())),
            },
            (None, None) => {
                return Err("missing mandatory parameters in NI config: 'network'".into())
            }
        };
        if self.nid.is_none() && self.interface.is_none() {
            return Err("creating a local NI needs at least one interface".into());
        }
        if let Some(i) = &self.interface {
            if i.contains(',') || i.contains('[') {
                return Err(format!(
                    "bad interface list '{}': ulnet takes one interface per NI (no Multi-Rail, \
                     no CPT list)",
                    i.trim()
                ));
            }
        }
        let mut y = format!("net:\n    - net type: {}\n", q(&net));
        if let Some(f) = &self.fabric {
            y += &format!("      fabric: {}\n", q(f));
        }
        y += "      local NI(s):\n";
        let mut first = true;
        let mut item = |y: &mut String, line: String| {
            y.push_str(if first { "        - " } else { "          " });
            y.push_str(&line);
            y.push('\n');
            first = false;
        };
        if let Some(nid) = &self.nid {
            item(&mut y, format!("nid: {}", q(nid)));
        }
        if let Some(i) = &self.interface {
            item(&mut y, "interfaces:".to_string());
            y += &format!("                0: {}\n", q(i));
        }
        if let Some(l) = &self.listen {
            item(&mut y, format!("listen: {}", q(l)));
        }
        let given: Vec<_> = self
            .tunables
            .iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        if !given.is_empty() {
            item(&mut y, "tunables:".to_string());
            for (k, v) in given {
                y += &format!("                {k}: {v}\n");
            }
        }
        if let Some(n) = self.conns_per_peer {
            item(&mut y, "lnd tunables:".to_string());
            y += &format!("                conns_per_peer: {n}\n");
        }
        Ok(y)
    }
}

/// The key of a line that starts a top-level section (column 0, not `-`, `#` or blank), and
/// what follows its colon; `None` for every other line.
fn top_level(line: &str) -> Option<(&str, &str)> {
    let starts = line
        .chars()
        .next()
        .is_some_and(|c| !matches!(c, ' ' | '\t' | '-' | '#' | '\n' | '\r'));
    starts.then(|| {
        let (key, value) = line.split_once(':').unwrap_or((line, ""));
        (key.trim(), value)
    })
}

/// What `import --exec` does with the section being read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    /// Sent on to the daemon (`net:`).
    Kept,
    /// Run here (`ping:`, `discover:`).
    Exec,
    /// Dropped (`global:` does nothing under --exec).
    Skipped,
}

/// What `import --exec` runs: the NIDs of the document's `ping:` and `discover:` sections, in
/// order, their `timeout:` (the last one given), and the rest of the document to apply.
#[derive(Debug, PartialEq, Eq)]
pub struct ExecDoc {
    /// The document with the `ping:`, `discover:` and `global:` sections blanked (empty lines,
    /// so that the daemon's errors still name the user's lines): its `net:` items are added,
    /// as lnetctl does under --exec.
    pub rest: String,
    pub nids: Vec<String>,
    pub timeout: Option<u64>,
}

/// `import --exec` (sanity-lnet test 350's documents: `ping:` / `discover:` with `nids:` as a
/// numbered map or a list, and `timeout:`). As lnetctl: `net:` items are still added,
/// `global:` does nothing, and any other section is refused (lnetctl says `invalid key`).
/// A value written in flow style (`ping: {nids: [..]}`) is refused rather than misread.
pub fn take_exec_sections(text: &str) -> Result<ExecDoc, String> {
    let mut rest = String::with_capacity(text.len());
    let mut nids = Vec::new();
    let mut timeout = None;
    let mut section = Section::Kept;
    // The indent of the `nids:` key while its entries are read.
    let mut nids_indent: Option<usize> = None;
    let unquote = |v: &str| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string();
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let line_no = i + 1;
        // A comment: from ` #` (or a leading `#`) to the end of the line.
        let line = match raw.find(" #") {
            Some(at) => &raw[..at],
            None if raw.trim_start().starts_with('#') => "",
            None => raw.trim_end_matches(['\n', '\r']),
        };
        if let Some((key, value)) = top_level(line) {
            nids_indent = None;
            section = match key {
                "ping" | "discover" if !value.trim().is_empty() => {
                    return Err(format!(
                        "line {line_no}: '{key}:' in flow style; write its nids: as a block \
                         (as lnetctl export does)"
                    ));
                }
                "ping" | "discover" => Section::Exec,
                "global" => Section::Skipped,
                "net" => Section::Kept,
                other => {
                    return Err(format!(
                        "line {line_no}: '{other}:' is not run by --exec (only ping, discover \
                         and net; lnetctl: invalid key)"
                    ))
                }
            };
        }
        if section == Section::Kept {
            rest.push_str(raw);
            continue;
        }
        // A blank line in its place keeps the user's line numbers.
        rest.push('\n');
        if section == Section::Skipped {
            continue;
        }
        let body = line.trim_end();
        let entry = body.trim_start();
        if entry.is_empty() {
            continue;
        }
        let indent = body.len() - entry.len();
        let item = entry.trim_start_matches('-').trim_start();
        // `key: value` with a key that is not a number is a key of the section.
        let keyed = item
            .split_once(':')
            .map(|(k, v)| (unquote(k), v))
            .filter(|(k, _)| !k.chars().all(|c| c.is_ascii_digit()));
        if let Some(k) = nids_indent {
            if keyed.is_none() && (indent > k || entry.starts_with('-')) {
                // `0: NID`, `"0": NID` (a map) or `- NID` (a list).
                let value = match item.split_once(':') {
                    Some((_, v)) => v,
                    None => item,
                };
                let v = unquote(value);
                if !v.is_empty() {
                    nids.push(v);
                }
                continue;
            }
            nids_indent = None;
        }
        match keyed {
            Some((k, v)) if k == "nids" => {
                nids_indent = Some(indent);
                let v = v.trim();
                if v.starts_with('{') {
                    return Err(format!(
                        "line {line_no}: 'nids:' in flow style as a map; list the NIDs"
                    ));
                }
                // `nids: [a, b]` or `nids: a,b` on one line.
                for n in v.trim_matches(|c| c == '[' || c == ']').split(',') {
                    let n = unquote(n);
                    if !n.is_empty() {
                        nids.push(n);
                    }
                }
            }
            Some((k, v)) if k == "timeout" => match unquote(v).parse::<u64>() {
                Ok(t) => timeout = Some(t),
                Err(_) => {
                    return Err(format!("line {line_no}: bad timeout '{}'", v.trim()));
                }
            },
            // `source`, `force` and the like: not used.
            _ => {}
        }
    }
    Ok(ExecDoc {
        rest,
        nids,
        timeout,
    })
}

/// Takes the top-level `peer:` section out of `text`. A section is a line that starts a
/// top-level key (column 0, not `-`, `#` or a space) and what follows until the next one; a
/// peer item is a `- primary nid:` line, and its NIs are the `- nid:` lines after it. A peer
/// with more than one NI is refused, naming `origin` and its line.
pub fn strip_peers(text: &str, origin: &str) -> Result<Stripped, String> {
    let mut out = String::with_capacity(text.len());
    let mut lines = Vec::new();
    let mut in_peer = false;
    let mut peers = 0u32;
    // (line, primary nid, NIs seen) of the peer item being read.
    let mut item: Option<(usize, String, u32)> = None;
    let check = |item: &Option<(usize, String, u32)>| match item {
        Some((line, nid, nis)) if *nis > 1 => Err(format!(
            "{origin}:{line}: peer {nid}: Multi-Rail peers with several NIs are not supported \
             by ulnet (one NI per peer; remove this 'peer:' entry)"
        )),
        _ => Ok(()),
    };
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if let Some((key, _)) = top_level(line) {
            check(&item)?;
            item = None;
            in_peer = key == "peer";
            if in_peer {
                continue;
            }
        }
        if !in_peer {
            out.push_str(line);
            lines.push(i + 1);
            continue;
        }
        let entry = line.trim_start().trim_start_matches('-').trim_start();
        if let Some(nid) = entry.strip_prefix("primary nid:") {
            check(&item)?;
            peers += 1;
            item = Some((i + 1, nid.trim().to_string(), 0));
        } else if line.trim_start().starts_with('-') && entry.starts_with("nid:") {
            if let Some(it) = item.as_mut() {
                it.2 += 1;
            }
        }
    }
    check(&item)?;
    Ok(Stripped {
        text: out,
        peers,
        lines,
    })
}

/// At most this many route items go in one part of a document sent in parts: the daemon
/// judges each and applies them as one change, so a part is its unit of work; between parts
/// it serves its other clients as at any time.
pub const ROUTES_PER_PART: usize = 2000;

/// A part's route items stop growing at this much text, so that the request carrying it
/// (the text JSON-escaped) stays well inside the daemon's 1 MiB cap, however long its items.
pub const PART_BYTES: usize = 256 * 1024;

/// One piece of a document sent to the daemon as an import of its own.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    /// Its text, its lines' numbers in the document, the `peer:` items it dropped.
    pub body: Stripped,
    /// The document's `net:` section(s) read so far, on a part of route items cut out of a
    /// bigger document: under `--show` (where nothing is added) the daemon judges the routes
    /// as if those NIs were there.
    pub nets: Option<String>,
}

/// Why [`split_document`] stopped early.
#[derive(Debug, PartialEq, Eq)]
pub enum SplitError {
    /// The input cannot be read, is not a document, or has a Multi-Rail peer: the message.
    Input(String),
    /// `send` refused a part (it said why).
    Stopped,
}

/// Lines of the document with their numbers, each ending in a newline.
#[derive(Default)]
struct Lines {
    text: String,
    lines: Vec<usize>,
}

impl Lines {
    fn push(&mut self, no: usize, line: &str) {
        self.text.push_str(line);
        if !line.ends_with('\n') {
            self.text.push('\n');
        }
        self.lines.push(no);
    }

    fn part(self, peers: u32, nets: Option<String>) -> Part {
        Part {
            body: Stripped {
                text: self.text,
                peers,
                lines: self.lines,
            },
            nets,
        }
    }

    /// `a` and `b` as one, in document order.
    fn merge(a: Lines, b: Lines) -> Lines {
        let mut out = Lines::default();
        let mut ai = a.text.split_inclusive('\n').zip(a.lines).peekable();
        let mut bi = b.text.split_inclusive('\n').zip(b.lines).peekable();
        loop {
            let take_a = match (ai.peek(), bi.peek()) {
                (Some(x), Some(y)) => x.1 < y.1,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return out,
            };
            let (line, no) = if take_a { ai.next() } else { bi.next() }.unwrap_or_default();
            out.push(no, line);
        }
    }
}

/// Reads a document from `input` a line at a time and hands it to `send` in parts, each a
/// document of its own within the daemon's request cap, as soon as each is read: a document
/// of any size imports with memory bounded by a part (here and in the daemon), and a
/// document read from a pipe is applied while it is still being written.
///
/// The `peer:` section is checked and dropped as by [`strip_peers`]. A document of at most
/// [`ROUTES_PER_PART`] routes is one part, in its order, as it always was. A bigger one is
/// cut between its `route:` items: each part of routes is preceded by what came before it of
/// the other sections (its nets, so that the routes find their gateways' nets; under
/// `--del`, `del` true, the other sections go last: routes are removed before the nets they
/// go through), and what follows the last is sent after it. Returns how many `peer:` items
/// were dropped in all.
pub fn split_document(
    input: impl std::io::BufRead,
    origin: &str,
    del: bool,
    mut send: impl FnMut(Part) -> Result<(), ()>,
) -> Result<u32, SplitError> {
    use std::io::BufRead;
    #[derive(PartialEq)]
    enum Sec {
        Other,
        Peer,
        Route,
    }
    let limit = router::text::MAX_CONFIG_BYTES;
    let mut input = std::io::Read::take(input, limit + 1);
    let mut sec = Sec::Other;
    let mut in_net = false;
    // Everything but the routes and peers; the nets alone (a copy, for --show).
    let mut rest = Lines::default();
    let mut nets = String::new();
    // The route items read and not yet sent, after their section's header line.
    let mut chunk = Lines::default();
    let mut items = 0usize;
    let mut header: (usize, String) = (0, String::new());
    let mut item_indent: Option<usize> = None;
    let mut cut = false;
    let mut peers = 0u32;
    // (line, primary nid, NIs seen) of the peer item being read.
    let mut peer: Option<(usize, String, u32)> = None;
    let check = |item: &Option<(usize, String, u32)>| match item {
        Some((line, nid, nis)) if *nis > 1 => Err(SplitError::Input(format!(
            "{origin}:{line}: peer {nid}: Multi-Rail peers with several NIs are not supported \
             by ulnet (one NI per peer; remove this 'peer:' entry)"
        ))),
        _ => Ok(()),
    };
    let mut line = String::new();
    let mut read = 0u64;
    let mut no = 0usize;
    loop {
        line.clear();
        let n = input.read_line(&mut line).map_err(|e| {
            SplitError::Input(if e.kind() == std::io::ErrorKind::InvalidData {
                format!("{origin}:{}: not UTF-8 text", no + 1)
            } else {
                format!("cannot read {origin}: {e}")
            })
        })?;
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > limit {
            return Err(SplitError::Input(format!(
                "{origin}: larger than {} MiB: not a configuration",
                limit >> 20
            )));
        }
        no += 1;
        if let Some((key, value)) = top_level(&line) {
            check(&peer)?;
            peer = None;
            in_net = key == "net";
            sec = match key {
                "peer" => Sec::Peer,
                // A flow-style section (`route: [...]`) is one line: not cut.
                "route" if value.trim().is_empty() => Sec::Route,
                _ => Sec::Other,
            };
            if sec == Sec::Route {
                header = (no, line.clone());
                item_indent = None;
                chunk.push(no, &line);
                continue;
            }
        }
        match sec {
            Sec::Other => {
                if in_net {
                    nets.push_str(&line);
                }
                rest.push(no, &line);
            }
            Sec::Peer => {
                let entry = line.trim_start().trim_start_matches('-').trim_start();
                if let Some(nid) = entry.strip_prefix("primary nid:") {
                    check(&peer)?;
                    peers += 1;
                    peer = Some((no, nid.trim().to_string(), 0));
                } else if line.trim_start().starts_with('-') && entry.starts_with("nid:") {
                    if let Some(it) = peer.as_mut() {
                        it.2 += 1;
                    }
                }
            }
            Sec::Route => {
                let body = line.trim_start();
                let indent = line.len() - body.len();
                // An item starts with `-` at the indent of the section's first item.
                let dash = body.starts_with("- ") || body.trim_end() == "-";
                if dash && item_indent.is_none_or(|i| i == indent) {
                    item_indent = Some(indent);
                    if items >= ROUTES_PER_PART || chunk.text.len() >= PART_BYTES {
                        if !del && !rest.lines.is_empty() {
                            send(std::mem::take(&mut rest).part(0, None))
                                .map_err(|()| SplitError::Stopped)?;
                        }
                        let full = std::mem::take(&mut chunk);
                        send(full.part(0, Some(nets.clone()))).map_err(|()| SplitError::Stopped)?;
                        chunk.push(header.0, &header.1);
                        items = 0;
                        cut = true;
                    }
                    items += 1;
                }
                chunk.push(no, &line);
            }
        }
    }
    check(&peer)?;
    let parts = if !cut {
        vec![Lines::merge(rest, chunk).part(0, None)]
    } else {
        let routes = (items > 0).then(|| chunk.part(0, Some(nets)));
        let others = (!rest.lines.is_empty()).then(|| rest.part(0, None));
        if del {
            [routes, others].into_iter().flatten().collect()
        } else {
            [others, routes].into_iter().flatten().collect()
        }
    };
    for p in parts {
        send(p).map_err(|()| SplitError::Stopped)?;
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_add_options_make_the_one_ni_document_an_import_would_be() {
        let add = |net: Option<&str>, i: Option<&str>, nid: Option<&str>| NiToAdd {
            net: net.map(String::from),
            interface: i.map(String::from),
            nid: nid.map(String::from),
            tunables: [
                ("peer_timeout", None),
                ("peer_credits", Some(16)),
                ("peer_buffer_credits", None),
                ("credits", None),
            ],
            conns_per_peer: None,
            fabric: None,
            listen: Some("127.0.0.1:9870".into()),
        };
        assert_eq!(
            add(Some("o2ib1"), Some("eth0"), None).document().unwrap(),
            "net:\n    - net type: \"o2ib1\"\n      local NI(s):\n        - interfaces:\n                \
             0: \"eth0\"\n          listen: \"127.0.0.1:9870\"\n          tunables:\n                \
             peer_credits: 16\n"
        );
        let mut four = add(Some("o2ib1"), Some("eth0"), None);
        four.conns_per_peer = Some(4);
        assert!(
            four.document()
                .unwrap()
                .ends_with("          lnd tunables:\n                conns_per_peer: 4\n"),
            "{:?}",
            four.document()
        );
        let by_nid = add(None, None, Some("10.0.0.1@o2ib")).document().unwrap();
        assert!(by_nid.starts_with("net:\n    - net type: \"o2ib\"\n      local NI(s):\n        - nid: \"10.0.0.1@o2ib\"\n"), "{by_nid}");
        // lnetctl's refusals, in its words.
        for (a, want) in [
            (add(None, Some("eth0"), None), "'network'"),
            (
                add(Some("o2ib"), None, Some("10.0.0.1@o2ib")),
                "--net is invalid with --nid",
            ),
            (
                add(Some("o2ib"), None, None),
                "needs at least one interface",
            ),
            (
                add(Some("o2ib"), Some("eth0,eth1"), None),
                "one interface per NI",
            ),
            (add(None, None, Some("nonsense")), "bad NID"),
        ] {
            let e = a.document().unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        // A value cannot smuggle YAML structure in.
        let sneaky = add(Some("o2ib\n  route: x"), Some("eth0"), None)
            .document()
            .unwrap();
        assert!(
            sneaky.contains("net type: \"o2ib\\n  route: x\""),
            "{sneaky}"
        );
    }

    #[test]
    fn exec_sections_give_their_nids_and_leave_the_rest() {
        // sanity-lnet test 350's documents, a list form, a timeout, a comment.
        let doc =
            "ping:\n  nids:\n    0: 10.0.0.2@o2ib\n    \"1\": 10.0.0.3@o2ib # peer\n  timeout: 5\n\
                   net:\n    - net type: o2ib\n\
                   discover:\n  - nids:\n    - 10.0.0.4@o2ib\n  - timeout: 7\n\
                   global:\n    retry_count: 1\n";
        let d = take_exec_sections(doc).unwrap();
        assert_eq!(d.nids, ["10.0.0.2@o2ib", "10.0.0.3@o2ib", "10.0.0.4@o2ib"]);
        assert_eq!(d.timeout, Some(7));
        assert_eq!(d.rest, "\n\n\n\n\nnet:\n    - net type: o2ib\n\n\n\n\n\n\n");
        assert_eq!(
            d.rest.lines().count(),
            doc.lines().count(),
            "line numbers kept"
        );
        let d = take_exec_sections("ping:\n    nids: [0@lo, \"10.0.0.2@o2ib\"]\n").unwrap();
        assert_eq!(d.nids, ["0@lo", "10.0.0.2@o2ib"]);
        assert!(d.rest.trim().is_empty());
        // What lnetctl refuses, or what would be misread, is refused with its line.
        for (doc, want) in [
            ("ping: {nids: [10.0.0.2@o2ib]}\n", "line 1"),
            ("ping:\n  nids: {0: 10.0.0.2@o2ib}\n", "line 2"),
            ("route:\n    - net: o2ib1\n", "'route:'"),
            (
                "ping:\n  nids:\n    0: 0@lo\n  timeout: soon\n",
                "bad timeout",
            ),
        ] {
            let e = take_exec_sections(doc).unwrap_err();
            assert!(e.contains(want), "{doc:?}: {e}");
        }
    }

    #[test]
    fn the_peer_section_goes_and_the_rest_stays_in_order() {
        let doc = "\
net:
-     net type: o2ib
      local NI(s):
      -     nid: 10.0.0.1@o2ib
peer:
-     primary nid: 10.0.0.2@o2ib
      Multi-Rail: false
      peer ni:
      -     nid: 10.0.0.2@o2ib
            state: up
-     primary nid: 10.0.0.3@o2ib
      Multi-Rail: false
      peer ni:
      -     nid: 10.0.0.3@o2ib
# a comment
routing:
    enable: 1
";
        let s = strip_peers(doc, "f").unwrap();
        assert_eq!(s.peers, 2);
        assert_eq!(
            s.text,
            "\
net:
-     net type: o2ib
      local NI(s):
      -     nid: 10.0.0.1@o2ib
routing:
    enable: 1
"
        );
        // The daemon's line 5 (`routing:`) is the document's line 16.
        assert_eq!(
            s.locate("import:5: routing: bad", "f.yaml"),
            "f.yaml:16: routing: bad"
        );
        assert_eq!(s.locate("something else", "f.yaml"), "something else");
        // Nothing to take: the text is unchanged.
        let none = "route:\n    - net: o2ib1\n      gateway: 10.0.0.2@o2ib\n";
        assert_eq!(strip_peers(none, "f").unwrap().text, none);
        assert_eq!(
            strip_peers("peer: []\nglobal:\n    numa_range: 0\n", "f")
                .unwrap()
                .text,
            "global:\n    numa_range: 0\n"
        );
    }

    /// The parts `split_document` sends for `doc`, and the peers it counted.
    fn parts(doc: &str, del: bool) -> (Vec<Part>, Result<u32, SplitError>) {
        let mut got = Vec::new();
        let r = split_document(doc.as_bytes(), "f", del, |p| {
            got.push(p);
            Ok(())
        });
        (got, r)
    }

    fn routes(from: usize, to: usize) -> String {
        (from..to)
            .map(|i| format!("    - net: o2ib{}\n      gateway: 10.0.0.2@o2ib\n", i + 1))
            .collect()
    }

    #[test]
    fn a_small_document_is_one_part_in_its_order_without_its_peers() {
        let doc = "\
route:
    - net: o2ib1
      gateway: 10.0.0.2@o2ib
net:
-     net type: o2ib
peer:
-     primary nid: 10.0.0.2@o2ib
      peer ni:
      -     nid: 10.0.0.2@o2ib
global:
    retry_count: 0";
        let (got, r) = parts(doc, false);
        assert_eq!(r, Ok(1));
        assert_eq!(got.len(), 1);
        let s = strip_peers(doc, "f").unwrap();
        assert_eq!(got[0].body.text, format!("{}\n", s.text));
        assert_eq!(got[0].body.lines, s.lines);
        assert_eq!(got[0].nets, None);
        // The same for --del: one part, the daemon orders it.
        assert_eq!(parts(doc, true).0, got);
    }

    #[test]
    fn a_big_document_is_cut_between_route_items_nets_first_or_last_under_del() {
        let n = 2 * ROUTES_PER_PART + 1;
        let doc = format!(
            "net:\n-     net type: o2ib\nroute:\n{}global:\n    retry_count: 0\n",
            routes(0, n)
        );
        let (got, r) = parts(&doc, false);
        assert_eq!(r, Ok(0));
        let heads: Vec<(&str, usize)> = got
            .iter()
            .map(|p| {
                (
                    p.body.text.split_inclusive('\n').next().unwrap_or(""),
                    p.body.text.matches("- net:").count(),
                )
            })
            .collect();
        assert_eq!(
            heads,
            [
                ("net:\n", 0),
                ("route:\n", ROUTES_PER_PART),
                ("route:\n", ROUTES_PER_PART),
                ("global:\n", 0),
                ("route:\n", 1)
            ]
        );
        // Every line of the document is in one part, numbered as the document numbers it;
        // each part of routes repeats the section's line (3).
        let mut seen: Vec<usize> = got.iter().flat_map(|p| p.body.lines.clone()).collect();
        assert_eq!(seen.iter().filter(|&&l| l == 3).count(), 3);
        seen.sort();
        seen.dedup();
        assert_eq!(seen, (1..=doc.lines().count()).collect::<Vec<_>>());
        let doc_lines: Vec<&str> = doc.lines().collect();
        for p in &got {
            for (text, no) in p.body.text.lines().zip(&p.body.lines) {
                assert_eq!(doc_lines[no - 1], text);
            }
        }
        // Parts of routes carry the nets for --show.
        let nets = "net:\n-     net type: o2ib\n".to_string();
        assert_eq!(got[1].nets.as_ref(), Some(&nets));
        assert_eq!(got[0].nets, None);
        // Under --del the routes go first, the rest last.
        let (del, _) = parts(&doc, true);
        let firsts: Vec<&str> = del
            .iter()
            .map(|p| p.body.text.split_inclusive('\n').next().unwrap_or(""))
            .collect();
        assert_eq!(firsts, ["route:\n", "route:\n", "route:\n", "net:\n"]);
        assert!(del[3].body.text.ends_with("global:\n    retry_count: 0\n"));
    }

    #[test]
    fn a_part_is_cut_by_its_size_too_and_a_refused_part_stops_the_rest() {
        // Long items: a part stops at PART_BYTES of text, well inside the request cap.
        let long = format!("      # {}\n", "x".repeat(4000));
        let items: String = (0..200)
            .map(|i| {
                format!(
                    "    - net: o2ib{}\n{long}      gateway: 10.0.0.2@o2ib\n",
                    i + 1
                )
            })
            .collect();
        let doc = format!("route:\n{items}");
        let (got, _) = parts(&doc, false);
        assert!(got.len() > 2, "{}", got.len());
        assert!(got.iter().all(|p| p.body.text.len() < PART_BYTES + 8192));
        let mut sent = 0;
        let r = split_document(doc.as_bytes(), "f", false, |_| {
            sent += 1;
            Err(())
        });
        assert_eq!((r, sent), (Err(SplitError::Stopped), 1));
    }

    #[test]
    fn a_multi_rail_peer_is_refused_with_its_line() {
        let doc = "\
peer:
    - primary nid: 10.0.0.2@o2ib
      Multi-Rail: True
      peer ni:
        - nid: 10.0.0.2@o2ib
        - nid: 10.0.1.2@o2ib1
";
        let e = strip_peers(doc, "mr.yaml").unwrap_err();
        assert!(
            e.starts_with("mr.yaml:2: peer 10.0.0.2@o2ib: Multi-Rail"),
            "{e}"
        );
        match split_document(doc.as_bytes(), "mr.yaml", false, |_| Ok(())) {
            Err(SplitError::Input(e)) => {
                assert!(
                    e.starts_with("mr.yaml:2: peer 10.0.0.2@o2ib: Multi-Rail"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
