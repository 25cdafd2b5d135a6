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

#[cfg(test)]
mod tests {
    use super::*;

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
