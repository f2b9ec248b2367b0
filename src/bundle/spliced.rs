//! Tool calls a bundle answers below rmcp's client (issue 37): the
//! gateway's calls answered below rmcp's server on the other side too.
//! Such a call is written to the bundle's stdin by its transport's one
//! writer, with an id of its own (`"bv-N"`, never one of rmcp's numbers),
//! and its answer line is handed back as it was read, not decoded into a
//! tool result and encoded again: rmcp's client loop, the typed read and
//! the answer's serialization cost the daemon about a fifth of a call
//! (docs/performance.md). The answer is looked at once, for its parts
//! ([`RawToolResult`]); a result of another shape (input required, a
//! non-object `structuredContent`) is decoded as before.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolResult, ErrorData, MetaObject, NumberOrString, RequestId, RequestMetaObject,
};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::Bytes;

use crate::host_resources::Answer;

/// A line for the bundle's stdin.
pub(super) enum Out {
    /// rmcp's message, or an error answer, encoded; rmcp's `send` is told
    /// whether it was written.
    Line(Vec<u8>, Option<oneshot::Sender<bool>>),
    /// An answer: `head`, the kept JSON, `}` and the newline. The JSON is
    /// shared with the store's cache, never copied while it waits.
    Answer { head: Vec<u8>, answer: Answer },
}

/// A tool call as rmcp writes it, unless its `_meta` is in two places.
pub(super) fn call_line(
    id: &RequestId,
    call: &rmcp::model::CallToolRequest,
) -> std::io::Result<Option<Vec<u8>>> {
    let typed = call.extensions.get::<RequestMetaObject>();
    let legacy = call.extensions.get::<MetaObject>();
    let beside = match (typed, legacy) {
        (Some(_), Some(_)) => return Ok(None),
        (Some(typed), None) => Some(serde_json::to_vec(typed)?),
        (None, Some(legacy)) => Some(serde_json::to_vec(legacy)?),
        (None, None) => None,
    };
    if beside.is_some() && call.params.meta.is_some() {
        return Ok(None);
    }
    write_call(id, &call.params, beside).map(Some)
}

/// A tool call with `params`, and `beside` (encoded) as their `_meta`.
fn write_call(
    id: &RequestId,
    params: &rmcp::model::CallToolRequestParams,
    beside: Option<Vec<u8>>,
) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::with_capacity(128);
    line.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut line, id)?;
    line.extend_from_slice(br#","method":"tools/call","params":"#);
    let at = line.len();
    serde_json::to_writer(&mut line, params)?;
    if let Some(meta) = beside {
        // After the params' `{`: they always have a name after it.
        let mut inserted = br#""_meta":"#.to_vec();
        inserted.extend_from_slice(&meta);
        inserted.push(b',');
        line.splice(at + 1..at + 1, inserted);
    }
    line.push(b'}');
    Ok(line)
}

/// The prefix of the ids of calls made here.
const PREFIX: &str = "bv-";

/// The answer to a call made here: its line (without the newline), and
/// where in it the result is, or the bundle's error.
pub struct RawReply {
    pub line: Bytes,
    pub result: Result<Range<usize>, ErrorData>,
}

/// The way to a bundle's stdin for calls answered here, and the calls
/// waiting for their answer (shared with the bundle's transport, which
/// hands each answer over).
#[derive(Clone)]
pub struct Spliced(Arc<Inner>);

struct Inner {
    queue: mpsc::Sender<Out>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<RawReply>>>,
    next: AtomicU64,
}

impl Spliced {
    pub(super) fn new(queue: mpsc::Sender<Out>) -> Spliced {
        Spliced(Arc::new(Inner {
            queue,
            waiting: Mutex::default(),
            next: AtomicU64::new(1),
        }))
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<RawReply>>> {
        self.0.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id the next call gets (a progress subscription may be made for
    /// it before it is sent).
    pub fn next_id(&self) -> NumberOrString {
        let n = self.0.next.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(PREFIX.len() + 20);
        id.push_str(PREFIX);
        id.push_str(itoa::Buffer::new().format(n));
        NumberOrString::String(id.into())
    }

    /// Where the answer to call `id` (from [`Self::next_id`]) comes: the
    /// receiver fails when the bundle's stream ends first. Expected from
    /// now on, before the call is written (its answer cannot come
    /// earlier than looked for), until answered or [`Self::forget`]-ten.
    pub fn expect(&self, id: &NumberOrString) -> oneshot::Receiver<RawReply> {
        let (tx, rx) = oneshot::channel();
        if let Some(n) = number(id) {
            self.waiting().insert(n, tx);
        }
        rx
    }

    /// Writes a tool call of `params` with `id` and `meta` as its `_meta`
    /// (asking for its progress under that id when `progress`): queued for
    /// the bundle's stdin (which waits while the queue is full).
    pub async fn send(
        &self,
        id: &NumberOrString,
        params: &rmcp::model::CallToolRequestParams,
        mut meta: RequestMetaObject,
        progress: bool,
    ) -> std::io::Result<()> {
        if progress {
            meta.set_progress_token(rmcp::model::ProgressToken(id.clone()));
        }
        if params.meta.is_some() {
            return Err(std::io::Error::other(
                "a call with its `_meta` in two places",
            ));
        }
        let beside = (!meta.is_empty())
            .then(|| serde_json::to_vec(&meta))
            .transpose()?;
        let mut line = write_call(id, params, beside)?;
        line.push(b'\n');
        self.0.queue.send(Out::Line(line, None)).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the bundle's stdin is closed",
            )
        })
    }

    /// A call whose answer is no longer looked for.
    pub fn forget(&self, id: &NumberOrString) {
        if let Some(n) = number(id) {
            self.waiting().remove(&n);
        }
    }

    /// A call whose answer nobody waits for any more: forgotten, and the
    /// bundle told (`notifications/cancelled`).
    pub async fn cancel(&self, id: &NumberOrString) {
        self.forget(id);
        let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "cancelled by the caller"}});
        let mut line = note.to_string().into_bytes();
        line.push(b'\n');
        let _ = self.0.queue.send(Out::Line(line, None)).await;
    }

    /// Whether any call made here waits for its answer.
    pub(super) fn expecting(&self) -> bool {
        !self.waiting().is_empty()
    }

    /// The answer in `line` (without its newline) when it is one to a call
    /// made here: which call, and the reply. Lines that cannot be one are
    /// passed over at memory speed.
    pub(super) fn answer(&self, line: &[u8]) -> Option<(u64, Result<Range<usize>, ErrorData>)> {
        #[derive(serde::Deserialize)]
        struct Reply<'a> {
            // "2.0", as the guard's rules ask of every message.
            #[allow(dead_code)]
            jsonrpc: rmcp::model::JsonRpcVersion2_0,
            #[serde(borrow)]
            id: &'a RawValue,
            #[serde(borrow, default)]
            result: Option<&'a RawValue>,
            #[serde(default)]
            error: Option<ErrorData>,
        }
        // Built once: a finder made per line cost more than its search.
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(PREFIX));
        FINDER.find(line)?;
        // From bytes: a bad byte in a field nobody reads does not make the
        // answer another line (its result's are checked as it is read).
        let reply: Reply = serde_json::from_slice(line).ok()?;
        let id = reply.id.get().strip_prefix('"')?.strip_suffix('"')?;
        let n: u64 = id.strip_prefix(PREFIX)?.parse().ok()?;
        let result = match (reply.result, reply.error) {
            (Some(result), None) => {
                let at = result.get().as_ptr() as usize - line.as_ptr() as usize;
                Ok(at..at + result.get().len())
            }
            (None, Some(error)) => Err(error),
            _ => return None,
        };
        self.0
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&n)
            .then_some((n, result))
    }

    /// Hands call `n` its answer.
    pub(super) fn answered(&self, n: u64, reply: RawReply) {
        if let Some(waiting) = self.waiting().remove(&n) {
            let _ = waiting.send(reply);
        }
    }

    /// The bundle's stream ended: no answer will come.
    pub(super) fn ended(&self) {
        self.waiting().clear();
    }
}

/// The number of a call's id made here.
fn number(id: &NumberOrString) -> Option<u64> {
    match id {
        NumberOrString::String(s) => s.strip_prefix(PREFIX)?.parse().ok(),
        NumberOrString::Number(_) => None,
    }
}

/// A complete tool result as the bundle wrote it: its parts, found once,
/// each written on as it came.
pub struct RawToolResult {
    line: Bytes,
    content: Option<Range<usize>>,
    structured: Option<Range<usize>>,
    is_error: Option<bool>,
    meta: Option<Range<usize>>,
}

impl RawToolResult {
    /// The result at `at` in `line`, when it is a complete tool result
    /// whose parts are of the shapes every revision takes as they are
    /// (`content` a list, `structuredContent` and `_meta` objects); None
    /// for anything else, to be decoded.
    pub fn new(line: Bytes, at: Range<usize>) -> Option<RawToolResult> {
        #[derive(serde::Deserialize)]
        struct Parts<'a> {
            #[serde(borrow, default)]
            content: Option<&'a RawValue>,
            #[serde(borrow, default, rename = "structuredContent")]
            structured: Option<&'a RawValue>,
            #[serde(default, rename = "isError")]
            is_error: Option<bool>,
            #[serde(borrow, default, rename = "_meta")]
            meta: Option<&'a RawValue>,
            #[serde(borrow, default, rename = "resultType")]
            result_type: Option<std::borrow::Cow<'a, str>>,
        }
        let text = line.get(at)?;
        // A carriage return (JSON whitespace) would end an event stream's
        // `data:` line: such a result is decoded and written afresh.
        if memchr::memchr(b'\r', text).is_some() {
            return None;
        }
        let parts: Parts = serde_json::from_str(std::str::from_utf8(text).ok()?).ok()?;
        if parts.result_type.is_some_and(|t| t != "complete")
            || (parts.content.is_none() && parts.structured.is_none() && parts.is_error.is_none())
        {
            return None;
        }
        // A part that is `null` reads as no part at all here; decoded, it
        // is not the same (a `null` output is kept), so it is left to be.
        use memchr::memmem::Finder;
        use std::sync::LazyLock;
        // Built once: a finder made per result cost more than its search.
        static CONTENT: LazyLock<Finder> = LazyLock::new(|| Finder::new(br#""content""#));
        static STRUCTURED: LazyLock<Finder> =
            LazyLock::new(|| Finder::new(br#""structuredContent""#));
        static META: LazyLock<Finder> = LazyLock::new(|| Finder::new(br#""_meta""#));
        let named = |key: &Finder| key.find(text).is_some();
        let null = (parts.content.is_none() && named(&CONTENT))
            || (parts.structured.is_none() && named(&STRUCTURED))
            || (parts.meta.is_none() && named(&META));
        if null {
            return None;
        }
        let starts = |raw: Option<&RawValue>, with: u8| {
            raw.is_none_or(|r| r.get().as_bytes().first() == Some(&with))
        };
        if !starts(parts.content, b'[')
            || !starts(parts.structured, b'{')
            || !starts(parts.meta, b'{')
        {
            return None;
        }
        let range = |raw: Option<&RawValue>| {
            raw.map(|r| {
                let at = r.get().as_ptr() as usize - line.as_ptr() as usize;
                at..at + r.get().len()
            })
        };
        Some(RawToolResult {
            content: range(parts.content),
            structured: range(parts.structured),
            is_error: parts.is_error,
            meta: range(parts.meta),
            line: line.clone(),
        })
    }

    /// The length of the bundle's line it is in (what writing it takes at
    /// most, and a little).
    pub fn line_len(&self) -> usize {
        self.line.len()
    }

    pub fn is_error(&self) -> bool {
        self.is_error == Some(true)
    }

    /// Writes the result as rmcp writes a tool result: with `resultType:
    /// "complete"` for an agent on MCP 2026-07-28, without for an older
    /// revision's (`legacy`).
    pub fn write(&self, out: &mut Vec<u8>, legacy: bool) {
        out.push(b'{');
        if !legacy {
            out.extend_from_slice(br#""resultType":"complete","#);
        }
        out.extend_from_slice(br#""content":"#);
        match &self.content {
            Some(at) => out.extend_from_slice(&self.line[at.clone()]),
            None => out.extend_from_slice(b"[]"),
        }
        if let Some(at) = &self.structured {
            out.extend_from_slice(br#","structuredContent":"#);
            out.extend_from_slice(&self.line[at.clone()]);
        }
        if let Some(is_error) = self.is_error {
            out.extend_from_slice(br#","isError":"#);
            out.extend_from_slice(if is_error { b"true" } else { b"false" });
        }
        if let Some(at) = &self.meta {
            out.extend_from_slice(br#","_meta":"#);
            out.extend_from_slice(&self.line[at.clone()]);
        }
        out.push(b'}');
    }

    /// Decoded, for a caller that needs the typed result.
    pub fn typed(&self) -> Result<CallToolResult, serde_json::Error> {
        let mut text = Vec::with_capacity(self.line.len());
        self.write(&mut text, false);
        serde_json::from_slice(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// `result` inside an answer line, as the bundle writes one.
    fn raw(result: &str) -> Option<RawToolResult> {
        let line = format!(r#"{{"jsonrpc":"2.0","id":"bv-1","result":{result}}}"#);
        let at = line.find(result).unwrap();
        RawToolResult::new(Bytes::from(line), at..at + result.len())
    }

    /// A complete result is written on as rmcp writes it, decoded and
    /// encoded again, for each revision: unknown fields dropped, `content`
    /// always there, `resultType: "complete"` for 2026-07-28 only.
    #[test]
    fn a_result_is_written_as_rmcp_writes_it() {
        for result in [
            r#"{"content":[{"type":"text","text":"hi"}]}"#,
            r#"{"content":[{"type":"text","text":"caf\u00e9 \"q\""}],"isError":true}"#,
            r#"{ "isError" : false , "content" : [ ] , "structuredContent" : {"n": 1.5, "a": [1, null]} }"#,
            r#"{"structuredContent":{"x":1},"_meta":{"k":"v"},"resultType":"complete"}"#,
            r#"{"content":[],"extra":{"dropped":true}}"#,
        ] {
            let spliced = raw(result).unwrap_or_else(|| panic!("{result}"));
            let mut typed: CallToolResult = serde_json::from_str(result).unwrap();
            for legacy in [false, true] {
                typed.result_type = (!legacy).then_some(rmcp::model::ResultType::COMPLETE);
                let mut ours = Vec::new();
                spliced.write(&mut ours, legacy);
                let ours: Value = serde_json::from_slice(&ours).unwrap();
                assert_eq!(ours, serde_json::to_value(&typed).unwrap(), "{result}");
            }
            let error = serde_json::from_str::<Value>(result).unwrap()["isError"] == json!(true);
            assert_eq!(spliced.is_error(), error);
        }
    }

    /// Anything else is left to be decoded: input asked for, output a
    /// legacy agent may not take as it is, parts of other shapes.
    #[test]
    fn other_results_are_left_to_be_decoded() {
        for result in [
            r#"{"resultType":"input_required","inputRequests":{}}"#,
            r#"{"content":[],"structuredContent":[1,2]}"#,
            r#"{"content":[],"structuredContent":null}"#,
            r#"{"content":"text"}"#,
            r#"{"_meta":{}}"#,
            r#"{"content":[],"_meta":7}"#,
            r#"{"content":null,"isError":true}"#,
            "{\"content\":[\r]}",
        ] {
            assert!(raw(result).is_none(), "{result}");
        }
    }

    /// An answer is taken as one to a call made here only by its id.
    #[tokio::test]
    async fn an_answer_is_known_by_its_id() {
        let (queue, mut lines) = mpsc::channel(4);
        let spliced = Spliced::new(queue);
        let id = spliced.next_id();
        let call = rmcp::model::CallToolRequestParams::new("echo");
        let answer = spliced.expect(&id);
        let meta = RequestMetaObject::default();
        spliced.send(&id, &call, meta, true).await.unwrap();
        let Some(Out::Line(written, _)) = lines.recv().await else {
            panic!("nothing written")
        };
        let written: Value = serde_json::from_slice(&written).unwrap();
        assert_eq!(written["id"], json!(id));
        assert_eq!(written["params"]["_meta"]["progressToken"], json!(id));
        let ours = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[]}}}}"#,
            json!(id)
        );
        for other in [
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":"bv-999","result":{"content":[]}}"#.to_string(),
            ours.replace("result", "outcome"),
            ours.replace(r#""2.0""#, r#""1.0""#),
        ] {
            assert!(spliced.answer(other.as_bytes()).is_none(), "{other}");
        }
        let (n, result) = spliced.answer(ours.as_bytes()).unwrap();
        let at = result.unwrap();
        assert_eq!(&ours[at.clone()], r#"{"content":[]}"#);
        let line = Bytes::from(ours);
        spliced.answered(
            n,
            RawReply {
                line,
                result: Ok(at),
            },
        );
        assert!(answer.await.is_ok());
        assert!(!spliced.expecting());
        // An error is the bundle's, handed over as one.
        let id = spliced.next_id();
        let call = rmcp::model::CallToolRequestParams::new("echo");
        let _answer = spliced.expect(&id);
        let meta = RequestMetaObject::default();
        spliced.send(&id, &call, meta, false).await.unwrap();
        let failed = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32602,"message":"no"}}}}"#,
            json!(id)
        );
        let (_, result) = spliced.answer(failed.as_bytes()).unwrap();
        assert_eq!(result.unwrap_err().message, "no");
    }
}
