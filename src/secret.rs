//! Secret values (user_config entries marked `sensitive`, OAuth tokens) and
//! the redactor that keeps them out of logs, status and error text.
//!
//! A [`Secret`] never shows its value through `Debug` or `Display`; the one
//! way to read it is [`Secret::expose`], so every place that hands a secret
//! on is easy to find. Its memory is wiped when dropped.

use std::borrow::Cow;
use std::fmt;

use zeroize::Zeroizing;

/// What a redacted secret looks like in logs and messages.
pub const MASK: &str = "[redacted]";

/// Secrets shorter than this are not searched for in text: masking every
/// `1` or `a` in a log would destroy it and protect nothing.
pub const MIN_REDACT_LEN: usize = 4;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Zeroizing::new(value.into()))
    }

    /// The value itself. Only for handing it to where it is used (a
    /// bundle's environment, an HTTP header, the cipher).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

/// Replaces every occurrence of a set of secrets in text with [`MASK`].
/// Cheap to clone (shared), and a no-op when it holds no secrets.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: std::sync::Arc<Vec<Secret>>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let mut secrets: Vec<Secret> = secrets
            .into_iter()
            .filter(|s| s.expose().len() >= MIN_REDACT_LEN)
            .collect();
        // Longest first, so a secret that contains another is masked whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.expose().len()));
        secrets.dedup();
        Redactor {
            secrets: std::sync::Arc::new(secrets),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in self.secrets.iter() {
            if out.contains(secret.expose()) {
                out = Cow::Owned(out.replace(secret.expose(), MASK));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_show_the_value() {
        let s = Secret::new("sk-canary-123");
        assert_eq!(format!("{s:?} {s}"), format!("{MASK} {MASK}"));
        assert_eq!(s.expose(), "sk-canary-123");
        let nested = Some(vec![s]);
        assert!(!format!("{nested:?}").contains("canary"));
    }

    #[test]
    fn redacts_every_occurrence_longest_first_and_skips_tiny_values() {
        let r = Redactor::new([Secret::new("abcd"), Secret::new("abcdef"), Secret::new("x")]);
        assert_eq!(
            r.redact("k=abcdef and abcd, x stays"),
            format!("k={MASK} and {MASK}, x stays")
        );
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
        assert!(Redactor::default().is_empty());
    }
}
