//! Bounded line reading for untrusted streams (control clients, bundle
//! stderr): a line longer than the limit is skipped up to its newline and
//! reported, without buffering it and without ending the stream.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line, without its `\n` (and `\r`), lossily decoded.
    Text(String),
    /// A line longer than the limit was skipped; the stream goes on.
    TooLong,
    /// End of stream.
    Eof,
}

pub struct LineReader<R> {
    inner: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            max,
            buf: Vec::new(),
        }
    }

    /// The stream, with what was read ahead and not yet returned.
    pub fn into_inner(self) -> R {
        self.inner
    }

    pub async fn next_line(&mut self) -> std::io::Result<Line> {
        self.buf.clear();
        let mut too_long = false;
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                return Ok(match (too_long, self.buf.is_empty()) {
                    (true, _) => Line::TooLong,
                    (false, true) => Line::Eof,
                    (false, false) => Line::Text(self.take()),
                });
            }
            let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], Some(i + 1)),
                None => (available, None),
            };
            if !too_long {
                if self.buf.len() + chunk.len() > self.max {
                    too_long = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            let used = found.unwrap_or(available.len());
            self.inner.consume(used);
            if found.is_some() {
                return Ok(if too_long {
                    Line::TooLong
                } else {
                    Line::Text(self.take())
                });
            }
        }
    }

    fn take(&mut self) -> String {
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn skips_overlong_lines_and_keeps_reading() {
        let data = format!("short\r\n{}\nafter\nlast", "x".repeat(100));
        // A tiny buffer forces lines to span several fill_buf calls.
        let reader = tokio::io::BufReader::with_capacity(7, data.as_bytes());
        let mut lines = LineReader::new(reader, 10);
        assert_eq!(lines.next_line().await.unwrap(), Line::Text("short".into()));
        assert_eq!(lines.next_line().await.unwrap(), Line::TooLong);
        assert_eq!(lines.next_line().await.unwrap(), Line::Text("after".into()));
        assert_eq!(lines.next_line().await.unwrap(), Line::Text("last".into()));
        assert_eq!(lines.next_line().await.unwrap(), Line::Eof);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_limit_is_kept() {
        let data = format!("{}\n", "y".repeat(10));
        let mut lines = LineReader::new(data.as_bytes(), 10);
        assert_eq!(lines.next_line().await.unwrap(), Line::Text("y".repeat(10)));
    }
}
