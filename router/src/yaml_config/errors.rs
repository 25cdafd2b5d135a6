//! What a configuration error says: where (origin and line) and what, with serde-saphyr's
//! messages reworded.

use std::fmt;

/// A configuration error: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name (or whatever `parse` was given).
    pub origin: String,
    /// 1-based line, when known.
    pub line: Option<u64>,
    pub message: String,
}

impl ConfigError {
    /// An error whose message quotes at most an excerpt of whatever it quotes: a 50 MB value
    /// in the file must not make a 50 MB line (the message is cut at
    /// 2 × [`EXCERPT_CHARS`](crate::text::EXCERPT_CHARS) characters, with "…").
    pub fn new(origin: &str, line: Option<u64>, message: impl AsRef<str>) -> ConfigError {
        let max = 2 * crate::text::EXCERPT_CHARS;
        ConfigError {
            origin: crate::text::excerpt(origin, max).into_owned(),
            line,
            message: crate::text::excerpt(message.as_ref(), max).into_owned(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// An error at a line of the document, before it is given its origin.
pub(super) type Located = (u64, String);

// ---------------------------------------------------------------------------------- errors

/// Turns serde-saphyr's error into `origin:line: message`, rewording serde's unknown-field
/// message as "unknown key 'x' (did you mean y?)" and quoting the offending line otherwise.
/// Whatever the parser's message holds (a whole value, a deeply nested structure), the result
/// quotes at most an excerpt of it and of the line ([`EXCERPT_CHARS`](crate::text::EXCERPT_CHARS)
/// characters of the line, with "…").
pub(super) fn from_yaml(origin: &str, text: &str, e: &serde_saphyr::Error) -> ConfigError {
    use crate::text::{excerpt, EXCERPT_CHARS};
    let line = e.location().map(|l| l.line()).filter(|&l| l > 0);
    let mut msg = e.without_snippet().to_string();
    // serde-saphyr appends " at line L, column C"; we print the line ourselves.
    if let Some(i) = msg.rfind(" at line ") {
        msg.truncate(i);
    }
    let msg = crate::text::reword_yaml(&msg).unwrap_or(msg);
    let message = if let Some(m) = reword_unknown(&msg) {
        m
    } else {
        let msg = excerpt(&msg, EXCERPT_CHARS);
        match line.and_then(|l| text.lines().nth(l as usize - 1)) {
            Some(src) if !src.trim().is_empty() => {
                format!("{msg}: `{}`", excerpt(src.trim(), EXCERPT_CHARS))
            }
            _ => msg.into_owned(),
        }
    };
    ConfigError::new(origin, line, message)
}

/// "unknown field `x`, expected one of a, b" -> "unknown key 'x' (did you mean a?)".
fn reword_unknown(msg: &str) -> Option<String> {
    let rest = msg.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    // A key may be as long as the file: compare and quote an excerpt.
    let key = &*crate::text::excerpt(key, crate::text::EXCERPT_CHARS);
    let expected: Vec<String> = rest
        .split_once("expected")
        .map(|(_, list)| {
            list.trim_start_matches(" one of")
                .split(',')
                .map(|s| s.trim().trim_matches('`').to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let best = expected
        .iter()
        .map(|k| (strsim::levenshtein(key, k), k))
        .min_by_key(|&(d, _)| d)
        .filter(|&(d, k)| d <= 3.max(k.len() / 3));
    Some(match best {
        Some((_, k)) => format!("unknown key '{key}' (did you mean {k}?)"),
        None if expected.is_empty() => format!("unknown key '{key}'"),
        None => format!("unknown key '{key}' (known: {})", expected.join(", ")),
    })
}
