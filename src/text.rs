//! Text from bundles made safe to show on a terminal. A bundle controls its
//! stderr, its manifest, its tool descriptions, results and error texts (and
//! a remote bundle's authorization server its `error_description`); printed
//! as they are, escape sequences in them could retitle the operator's
//! window, clear the screen, move the cursor to fake a line, or reorder text
//! with bidi overrides. Every human output path (the CLI and the daemon's
//! human log) goes through [`printable`]; `--json` output stays exact.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with every character a terminal would act on written as a visible
/// escape: `\r`, `\t`, `\x1b`-style for the other C0 controls and DEL,
/// `\u{9b}`-style for C1 controls (U+0080–U+009F) and the bidi embeddings,
/// overrides and isolates (U+202A–U+202E, U+2066–U+2069). A line break
/// (`\n`) is kept: multi-line texts stay multi-line. Borrowed when there is
/// nothing to escape.
pub fn printable(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// [`printable`] for a place where a line break is not legitimate (one log
/// line, one table cell): `\n` is escaped too.
pub fn printable_line(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

fn escape(s: &str, keep_newline: bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| !(keep_newline && c == '\n') && needs_escape(c);
    let Some(first) = s.find(unsafe_char) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        if !unsafe_char(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// C0 controls, DEL, C1 controls and the bidi formatting characters.
fn needs_escape(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}')
}

/// The fields of the daemon's human log (`--log-format human`): formatted
/// as tracing-subscriber's default, then passed through [`printable_line`],
/// so that a bundle's stderr line, an error text or a manifest value logged
/// as a field can neither act on the terminal nor start a fake log line.
/// (The JSON format escapes control characters already.)
#[derive(Debug, Default)]
pub struct PrintableFields;

impl<'writer> tracing_subscriber::fmt::FormatFields<'writer> for PrintableFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        let mut text = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new().format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut text),
            fields,
        )?;
        writer.write_str(&printable_line(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_escaped_and_plain_text_is_borrowed() {
        let hostile = "a\x1b]0;pwned\x07b\rc\td\x7fe\u{9b}31mf\u{202e}g\u{2066}h\u{0}i\nj";
        assert_eq!(
            printable(hostile),
            "a\\x1b]0;pwned\\x07b\\rc\\td\\x7fe\\u{9b}31mf\\u{202e}g\\u{2066}h\\x00i\nj"
        );
        assert_eq!(
            printable_line(hostile),
            "a\\x1b]0;pwned\\x07b\\rc\\td\\x7fe\\u{9b}31mf\\u{202e}g\\u{2066}h\\x00i\\nj"
        );
        for s in ["plain", "multi\nline", "ünïcødé ✓ \u{a0}\u{2028}", ""] {
            assert!(
                matches!(printable(s), Cow::Borrowed(b) if b == s),
                "{s:?} needs no escape"
            );
        }
        // Nothing a terminal acts on survives, wherever it stands.
        for c in (0u32..0x250)
            .chain(0x2000..0x2100)
            .filter_map(char::from_u32)
        {
            let shown = printable_line(&c.to_string()).into_owned();
            assert!(
                !shown.chars().any(needs_escape),
                "U+{:04X} shown as {shown:?}",
                c as u32
            );
        }
    }

    #[test]
    fn the_human_log_escapes_every_field() {
        use tracing_subscriber::fmt::MakeWriter;
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> MakeWriter<'a> for Buffer {
            type Writer = Buffer;
            fn make_writer(&'a self) -> Buffer {
                self.clone()
            }
        }
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(PrintableFields)
            .with_writer(buffer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let line = "fake\r\x1b[2Jline\nINFO forged";
            tracing::info!(bundle = %"b\x07", error = %line, "{line}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        for raw in ['\r', '\x1b', '\x07'] {
            assert!(!text.contains(raw), "{raw:?} in {text:?}");
        }
        assert!(
            text.contains("bundle=b\\x07 error=fake\\r\\x1b[2Jline\\nINFO forged"),
            "{text:?}"
        );
    }
}
