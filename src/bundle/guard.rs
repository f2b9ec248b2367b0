//! The rules of a bundle's stdout, which its transport
//! ([`super::transport`]) applies to every line; a hostile or broken
//! bundle cannot get past them:
//!
//! - no message (line) longer than `max_message_bytes`: memory stays bounded;
//! - every line must be a JSON-RPC message: valid JSON, and an object with
//!   `"jsonrpc": "2.0"` (or an array). A bundle that prints logs or junk on
//!   stdout is not speaking MCP; the check on how a line starts catches it
//!   before the line is complete.
//!
//! A violation ends the stream, which ends the MCP session;
//! the connection then stops the process, and the reason recorded in the
//! [`Violation`] is what `status` and the `exited` event say.

use std::sync::{Arc, Mutex};

use crate::secret::Redactor;

/// Why a bundle's stream was cut, once it was. The reason quotes what the
/// bundle wrote, so it is masked with the bundle's redactor.
#[derive(Clone, Default)]
pub struct Violation {
    reason: Arc<Mutex<Option<String>>>,
    redactor: Redactor,
}

impl Violation {
    pub fn new(redactor: Redactor) -> Self {
        Violation {
            reason: Arc::default(),
            redactor,
        }
    }

    fn record(&self, reason: String) {
        let mut slot = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(|| self.redactor.redact(&reason).into_owned());
    }

    pub fn get(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The rules, applied by the transport ([`super::transport`]) to each line
/// as it arrives: a line in progress is checked for its length and how it
/// starts, a complete one for being a JSON-RPC message.
#[derive(Clone)]
pub struct Rules {
    max: usize,
    violation: Violation,
}

/// How much of a line in progress is waited for before its start is
/// judged (so that the reason can quote it).
const HEAD: usize = 64;

impl Rules {
    pub fn new(max_message_bytes: usize, violation: Violation) -> Self {
        Rules {
            max: max_message_bytes,
            violation,
        }
    }

    /// A line without its newline yet: the reason, if it already breaks a
    /// rule.
    pub fn check_partial(&self, partial: &[u8]) -> Option<String> {
        self.check_length(partial.len())
            .or_else(|| check_start(partial, false))
    }

    /// A complete line (without its newline): the reason, if it breaks a
    /// rule. `parsed` says the caller already parsed it as a JSON-RPC 2.0
    /// object, which spares the second parse.
    pub fn check_line(&self, line: &[u8], parsed: bool) -> Option<String> {
        self.check_length(line.len())
            .or_else(|| check_start(line, true))
            .or_else(|| if parsed { None } else { check_message(line) })
    }

    /// Records why the stream is cut; the reason as recorded (masked).
    pub fn cut(&self, reason: String) -> String {
        self.violation.record(reason);
        self.violation.get().unwrap_or_default()
    }

    fn check_length(&self, len: usize) -> Option<String> {
        (len > self.max).then(|| {
            format!(
                "the bundle wrote an MCP message longer than {} bytes on stdout (limit: bundles.max_message_bytes)",
                self.max
            )
        })
    }
}

/// A line must start with `{` or `[` (after blanks); empty lines pass.
fn check_start(line: &[u8], complete: bool) -> Option<String> {
    let head = &line[..line.len().min(HEAD)];
    match head.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') => None,
        // Wait for the line to end (or for enough of it to show).
        _ if !complete && head.len() < HEAD => None,
        None => None,
        _ => {
            let shown: String = String::from_utf8_lossy(head)
                .chars()
                .filter(|c| !c.is_control())
                .take(60)
                .collect();
            Some(format!(
                "the bundle wrote something that is not an MCP message on stdout ({shown:?}); bundles must log to stderr"
            ))
        }
    }
}

/// A complete line: blank, or a JSON-RPC 2.0 message (an array is left to
/// the MCP layer).
fn check_message(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        jsonrpc: Option<String>,
    }
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return None;
    }
    if trimmed.first() == Some(&b'[') {
        return serde_json::from_slice::<serde::de::IgnoredAny>(trimmed)
            .err()
            .map(|e| format!("the bundle wrote invalid JSON on stdout ({e})"));
    }
    match serde_json::from_slice::<Envelope>(trimmed) {
        Err(e) => Some(format!("the bundle wrote invalid JSON on stdout ({e})")),
        Ok(Envelope { jsonrpc }) if jsonrpc.as_deref() != Some("2.0") => Some(
            "the bundle wrote a JSON object that is not a JSON-RPC 2.0 message (no \"jsonrpc\": \"2.0\") on stdout".to_string(),
        ),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn rules(max: usize) -> Rules {
        Rules::new(max, Violation::default())
    }

    #[test]
    fn json_lines_within_the_limit_pass() {
        let r = rules(64);
        for line in [
            &b"{\"jsonrpc\":\"2.0\"}"[..],
            b"  [1]",
            b"",
            b"{\"jsonrpc\":\"2.0\",\"id\":1}\r",
        ] {
            assert_eq!(r.check_partial(line), None);
            assert_eq!(r.check_line(line, false), None, "{line:?}");
        }
    }

    #[test]
    fn broken_json_and_non_json_rpc_objects_are_violations() {
        let r = rules(1000);
        let why = r
            .check_line(b"{\"jsonrpc\": \"2.0\", oops}", false)
            .unwrap();
        assert!(why.contains("invalid JSON"), "{why}");
        let why = r.check_line(b"{\"hello\":\"world\"}", false).unwrap();
        assert!(why.contains("not a JSON-RPC 2.0 message"), "{why}");
        // A line the caller parsed as JSON-RPC is not parsed again.
        assert_eq!(r.check_line(b"{\"hello\":\"world\"}", true), None);
    }

    #[test]
    fn an_overlong_line_is_a_violation_before_it_ends() {
        let mut line = b"{".to_vec();
        line.extend(std::iter::repeat_n(b'x', 100));
        let why = rules(50).check_partial(&line).unwrap();
        assert!(why.contains("longer than 50 bytes"), "{why}");
        assert!(rules(50).check_line(&line, true).is_some());
        assert_eq!(rules(200).check_partial(&line), None);
    }

    #[test]
    fn a_secret_printed_on_stdout_is_masked_in_the_reason() {
        let violation = Violation::new(Redactor::new([Secret::new("sk-hidden-42")]));
        let r = Rules::new(1000, violation.clone());
        let why = r.check_line(b"leaked sk-hidden-42 here", false).unwrap();
        let reason = r.cut(why);
        assert!(
            reason.contains("leaked") && !reason.contains("sk-hidden-42"),
            "{reason}"
        );
        assert_eq!(violation.get(), Some(reason));
    }

    #[test]
    fn text_on_stdout_is_a_violation_once_enough_of_it_shows() {
        let r = rules(1000);
        let text = b"Starting server on port 8080...";
        // Too little to quote yet, unless the line is complete.
        assert_eq!(r.check_partial(text), None);
        let why = r.check_line(text, false).unwrap();
        assert!(
            why.contains("not an MCP message") && why.contains("Starting server"),
            "{why}"
        );
        let long = [&text[..], &[b'.'; 64][..]].concat();
        assert!(r.check_partial(&long).is_some());
    }
}
