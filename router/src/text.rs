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

#[cfg(test)]
mod tests {
    use super::*;

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
