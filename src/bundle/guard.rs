//! The bundle's stdout as the MCP transport reads it, with two rules a
//! hostile or broken bundle cannot get past:
//!
//! - no message (line) longer than `max_message_bytes`: memory stays bounded;
//! - every line must be a JSON-RPC message: valid JSON, and an object with
//!   `"jsonrpc": "2.0"` (or an array). A bundle that prints logs or junk on
//!   stdout is not speaking MCP; the check on how a line starts catches it
//!   before the line is complete.
//!
//! A violation ends the stream with an error, which ends the MCP session;
//! the connection then stops the process, and the reason recorded in the
//! [`Violation`] is what `status` and the `exited` event say.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

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

pub struct Guarded<R> {
    inner: R,
    max: usize,
    /// Bytes of the current line so far.
    line_len: usize,
    /// The first bytes of the current line (to check how it starts).
    head: Vec<u8>,
    /// The current line (at most `max` bytes), checked when complete.
    line: Vec<u8>,
    violation: Violation,
    failed: bool,
}

const HEAD: usize = 64;

impl<R> Guarded<R> {
    pub fn new(inner: R, max_message_bytes: usize, violation: Violation) -> Self {
        Guarded {
            inner,
            max: max_message_bytes,
            line_len: 0,
            head: Vec::with_capacity(HEAD),
            line: Vec::new(),
            violation,
            failed: false,
        }
    }

    /// Checks `bytes` (just read); the reason if they break a rule.
    fn check(&mut self, bytes: &[u8]) -> Option<String> {
        for &b in bytes {
            if b == b'\n' {
                if let Some(reason) = self.check_start(true).or_else(|| check_message(&self.line)) {
                    return Some(reason);
                }
                self.line_len = 0;
                self.head.clear();
                self.line.clear();
                continue;
            }
            self.line_len += 1;
            self.line.push(b);
            if self.head.len() < HEAD {
                self.head.push(b);
            }
            if self.line_len > self.max {
                return Some(format!(
                    "the bundle wrote an MCP message longer than {} bytes on stdout (limit: bundles.max_message_bytes)",
                    self.max
                ));
            }
        }
        self.check_start(false)
    }

    /// A line must start with `{` or `[` (after blanks); empty lines pass.
    fn check_start(&self, complete: bool) -> Option<String> {
        let first = self.head.iter().find(|b| !b.is_ascii_whitespace());
        match first {
            Some(b'{') | Some(b'[') => None,
            // Wait for the line to end (or for enough of it to show).
            _ if !complete && self.head.len() < HEAD => None,
            None => None,
            _ => {
                let shown: String = String::from_utf8_lossy(&self.head)
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

impl<R: AsyncRead + Unpin> AsyncRead for Guarded<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.failed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bundle stream closed after a protocol violation",
            )));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = buf.filled()[before..].to_vec();
                if let Some(reason) = this.check(&fresh) {
                    this.failed = true;
                    this.violation.record(reason);
                    buf.set_filled(before);
                    let masked = this.violation.get().unwrap_or_default();
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, masked)));
                }
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: &[u8], max: usize) -> (Result<Vec<u8>, io::Error>, Option<String>) {
        let violation = Violation::default();
        let mut g = Guarded::new(input, max, violation.clone());
        let mut out = Vec::new();
        let r = g.read_to_end(&mut out).await.map(|_| out);
        (r, violation.get())
    }

    #[tokio::test]
    async fn json_lines_within_the_limit_pass_through() {
        let input = b"{\"jsonrpc\":\"2.0\"}\n  [1]\n\n{\"jsonrpc\":\"2.0\",\"id\":1}\r\n";
        let (r, v) = read_all(input, 64).await;
        assert_eq!(r.unwrap(), input);
        assert!(v.is_none());
    }

    #[tokio::test]
    async fn broken_json_and_non_json_rpc_objects_are_violations() {
        let (r, v) = read_all(
            b"{\"jsonrpc\":\"2.0\"}\n{\"jsonrpc\": \"2.0\", oops}\n",
            1000,
        )
        .await;
        assert!(r.is_err());
        assert!(v.unwrap().contains("invalid JSON"));
        let (r, v) = read_all(b"{\"hello\":\"world\"}\n", 1000).await;
        assert!(r.is_err());
        assert!(v.unwrap().contains("not a JSON-RPC 2.0 message"));
    }

    #[tokio::test]
    async fn an_overlong_line_is_cut_and_recorded() {
        let mut input = b"{\"jsonrpc\":\"2.0\"}\n{".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100));
        let (r, v) = read_all(&input, 50).await;
        assert!(r.is_err());
        assert!(v.unwrap().contains("longer than 50 bytes"));
    }

    #[tokio::test]
    async fn a_secret_printed_on_stdout_is_masked_in_the_reason() {
        let violation = Violation::new(Redactor::new([Secret::new("sk-hidden-42")]));
        let mut g = Guarded::new(&b"leaked sk-hidden-42 here\n"[..], 1000, violation.clone());
        let mut out = Vec::new();
        assert!(g.read_to_end(&mut out).await.is_err());
        let reason = violation.get().unwrap();
        assert!(
            reason.contains("leaked") && !reason.contains("sk-hidden-42"),
            "{reason}"
        );
    }

    #[tokio::test]
    async fn text_on_stdout_is_a_violation() {
        let (r, v) = read_all(
            b"{\"jsonrpc\":\"2.0\"}\nStarting server on port 8080...\n",
            1000,
        )
        .await;
        assert!(r.is_err());
        let reason = v.unwrap();
        assert!(
            reason.contains("not an MCP message") && reason.contains("Starting server"),
            "{reason}"
        );
    }
}
