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
        let top = line
            .chars()
            .next()
            .is_some_and(|c| !matches!(c, ' ' | '\t' | '-' | '#' | '\n' | '\r'));
        if top {
            check(&item)?;
            item = None;
            let key = line.split(':').next().unwrap_or("").trim();
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
