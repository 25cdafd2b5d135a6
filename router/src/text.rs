//! Quoting untrusted text in messages: an error about a 50 MB value must not print 50 MB.

use std::borrow::Cow;

/// How many characters of an offending value or line a message quotes.
pub const EXCERPT_CHARS: usize = 120;

/// `s` cut to at most `max` characters (at a char boundary), with "…" when anything was cut.
pub fn excerpt(s: &str, max: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => Cow::Borrowed(s),
        Some((end, _)) => Cow::Owned(format!("{}…", &s[..end])),
    }
}

/// The largest configuration or import document read (64 MiB: a real `lnetctl export` of a
/// big router is tens of KiB).
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024 * 1024;

/// Reads a configuration document, refusing one larger than [`MAX_CONFIG_BYTES`] instead of
/// reading it all: `--config /dev/zero` or an endless pipe grew memory without bound (operator
/// audit). Not UTF-8 is `InvalidData`, as `read_to_string` says.
pub fn read_config(r: impl std::io::Read) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    r.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB: not a configuration",
                MAX_CONFIG_BYTES >> 20
            ),
        ));
    }
    String::from_utf8(buf)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// [`read_config`] of the file at `path`.
pub fn read_config_file(path: &std::path::Path) -> std::io::Result<String> {
    read_config(std::fs::File::open(path)?)
}

/// The YAML reader's messages that name its own internals, said in the file's terms (the
/// caller adds the offending line): a duplicate key ("duplicate mapping key: k, set
/// DuplicateKeyPolicy in Options if acceptable"), a number outside its type ("invalid u32"),
/// an unknown fabric (whose list offered `sim`, which lnet-router refuses). `None`: keep the
/// reader's message.
pub fn reword_yaml(msg: &str) -> Option<String> {
    if msg.starts_with("multiple YAML documents detected") {
        return Some(
            "more than one YAML document (a second '---'): a configuration or an import is one"
                .into(),
        );
    }
    // The parser names our types ("expected struct RawRoute"): say what the file should hold.
    if let Some(i) = msg.find("struct Raw") {
        let name_at = i + "struct Raw".len();
        let end = msg[name_at..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(msg.len(), |n| name_at + n);
        let mut words = String::new();
        for (k, c) in msg[name_at..end].chars().enumerate() {
            if c.is_ascii_uppercase() && k > 0 {
                words.push(' ');
            }
            words.push(c.to_ascii_lowercase());
        }
        let rest = reword_yaml(&msg[end..]).unwrap_or_else(|| msg[end..].to_string());
        return Some(format!(
            "{}a {words} entry (a mapping of keys){rest}",
            &msg[..i]
        ));
    }
    if let Some(rest) = msg.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split_once(", set DuplicateKeyPolicy")
            .map_or(rest, |(k, _)| k);
        return Some(format!(
            "duplicate key '{}'",
            excerpt(key.trim(), EXCERPT_CHARS)
        ));
    }
    if let Some(ty) = msg.strip_prefix("invalid ") {
        let range = match ty.trim() {
            "u8" => format!("0..={}", u8::MAX),
            "u16" => format!("0..={}", u16::MAX),
            "u32" => format!("0..={}", u32::MAX),
            "u64" => format!("0..={}", u64::MAX),
            "i32" => format!("{}..={}", i32::MIN, i32::MAX),
            "i64" => format!("{}..={}", i64::MIN, i64::MAX),
            _ => return None,
        };
        return Some(format!("not a whole number in {range}"));
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        let (value, list) = rest.split_once('`')?;
        if list.replace('`', "").trim() == ", expected one of tcp, socket, sim, verbs" {
            return Some(format!(
                "unknown fabric '{}' (expected socket for a tcp net, tcp or verbs for an o2ib \
                 net; sim is the simulator's only)",
                excerpt(value, EXCERPT_CHARS)
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_messages_say_what_is_wrong_in_the_files_terms() {
        // (the parser's words, ours); the last three are an operator's audit: the parser's own
        // words, naming our types and its API.
        let cases = [
            (
                "duplicate mapping key: peer_credits, set DuplicateKeyPolicy in Options if \
                 acceptable",
                "duplicate key 'peer_credits'",
            ),
            ("invalid u32", "not a whole number in 0..=4294967295"),
            ("invalid u16", "not a whole number in 0..=65535"),
            (
                "unknown variant `TCP`, expected one of tcp, socket, sim, verbs",
                "unknown fabric 'TCP' (expected socket for a tcp net, tcp or verbs for an o2ib net; \
                 sim is the simulator's only)",
            ),
            (
                "multiple YAML documents detected; use from_str_multiple or \
                 from_str_multiple_with_options",
                "more than one YAML document (a second '---'): a configuration or an import is one",
            ),
            (
                "invalid type: string \"hello\", expected struct RawRoute",
                "invalid type: string \"hello\", expected a route entry (a mapping of keys)",
            ),
            (
                "invalid type: integer `3`, expected struct RawLocalNi",
                "invalid type: integer `3`, expected a local ni entry (a mapping of keys)",
            ),
        ];
        for (parser, ours) in cases {
            assert_eq!(reword_yaml(parser).as_deref(), Some(ours), "{parser}");
        }
        assert_eq!(reword_yaml("invalid type: map"), None);
        let long = "k".repeat(10_000);
        let r = reword_yaml(&format!(
            "duplicate mapping key: {long}, set DuplicateKeyPolicy"
        ));
        assert!(r.unwrap().len() < 200);
    }

    #[test]
    fn an_endless_or_huge_document_is_refused_without_reading_it_all() {
        let endless = std::io::repeat(b'a');
        let e = read_config(endless).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not a configuration"), "{e}");
        assert_eq!(read_config(&b"net: []\n"[..]).unwrap(), "net: []\n");
        assert_eq!(
            read_config(&[0xff, 0xfe][..]).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn cuts_at_char_boundaries_and_marks_the_cut() {
        assert_eq!(excerpt("short", 10), "short");
        assert_eq!(excerpt("exactly10!", 10), "exactly10!");
        assert_eq!(excerpt("abcdefghijk", 10), "abcdefghij…");
        // Multi-byte characters are never split.
        let s = "é".repeat(200);
        let e = excerpt(&s, EXCERPT_CHARS);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
        assert_eq!(excerpt("", 3), "");
    }
}
