//! The MCP transport of a bundle's stdio: JSON-RPC lines over its stdout
//! and stdin, with the stream rules of [`super::guard`] applied to every
//! line, and the bundle's host-resources requests answered here, below
//! rmcp.
//!
//! A host-resources read is the bundle's hot path (docs/performance.md).
//! Through rmcp it cost the daemon 125,000 instructions, most of them
//! rmcp's request parsing, its handler task, and the escaping of the
//! answer's text byte by byte on every read. Here a request line naming
//! `ai.nimblebrain/resources/read` or `/list` is parsed once, goes to the
//! WorkspaceActor like any other ([`HostContext::ask`]: the same access
//! decision, audit, rate bucket and store), and its answer — encoded once,
//! kept with the file's record — is written back as one line. The answer
//! to a `tools/call` is parsed as the tool result it is ([`Calls`]).
//! Everything else goes to rmcp as its own transport would hand it over.
//!
//! rmcp's messages and these answers are queued to one writer task
//! ([`write_lines`]), which writes each whole: no line is ever cut by
//! another, and an answer that waits for a bundle that does not read
//! holds nothing anyone else waits for. At most
//! [`MAX_ANSWERING`] answers are in flight per bundle (and at most
//! [`QUEUED`] lines wait for the writer); past that the bundle's stdout
//! is not read until one is queued (a bundle that sends
//! requests and never reads its stdin stalls itself, not the daemon).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rmcp::model::{
    CallToolResult, ClientNotification, ClientRequest, ErrorData, JsonRpcMessage, JsonRpcResponse,
    JsonRpcVersion2_0, NumberOrString, RequestId, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use rmcp::transport::Transport;
use rmcp::RoleClient;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::BytesMut;
use tokio_util::codec::Decoder;

use super::client::HostContext;
use super::guard::Rules;
use super::spliced::{call_line, Out, Spliced};
use crate::host_resources::{self, Answer, HostError};

/// Host-resources answers one bundle may have in flight.
pub const MAX_ANSWERING: usize = 64;

/// Tool calls in flight whose ids are kept (see [`Calls`]).
const MAX_CALLS_KNOWN: usize = 4096;

/// What the bundle's stdout is read in.
const READ_CHUNK: usize = 16 * 1024;

/// Lines waiting for the writer task.
const QUEUED: usize = 64;

/// Answers this large are written around their kept JSON (three writes)
/// rather than copied into one line.
const COPY_AT_MOST: usize = 64 * 1024;

/// Writes the queued lines to the bundle's stdin, each whole, until the
/// queue closes or stdin does. The one writer: rmcp's messages and the
/// answers given here never cut each other, and an answer waiting for
/// a bundle that does not read holds no lock anyone else needs.
async fn write_lines<W: AsyncWrite + Unpin>(mut w: W, mut queue: mpsc::Receiver<Out>) {
    let mut line = Vec::new();
    while let Some(out) = queue.recv().await {
        let mut ack = None;
        let written = match out {
            Out::Line(l, told) => {
                ack = told;
                w.write_all(&l).await
            }
            Out::Answer { head, answer } if answer.json().len() <= COPY_AT_MOST => {
                line.clear();
                line.extend_from_slice(&head);
                line.extend_from_slice(answer.json().as_bytes());
                line.extend_from_slice(b"}\n");
                w.write_all(&line).await
            }
            Out::Answer { head, answer } => {
                let mut all = w.write_all(&head).await;
                if all.is_ok() {
                    all = w.write_all(answer.json().as_bytes()).await;
                }
                if all.is_ok() {
                    all = w.write_all(b"}\n").await;
                }
                all
            }
        };
        let written = written.is_ok() && w.flush().await.is_ok();
        if let Some(ack) = ack {
            let _ = ack.send(written);
        }
        if !written {
            // Stdin closed: the reading side reports the end; what is still
            // queued is dropped, and its senders hear so.
            return;
        }
    }
}

/// The `tools/call` requests in flight, by id. A bundle's answer to one is
/// parsed as the tool result it is; rmcp's decoder would try the result
/// types of every other request first (`ServerResult` is untagged), and
/// build an error message for each that does not fit — 45,000 of the
/// daemon's 179,000 instructions a call (docs/performance.md).
#[derive(Clone, Default)]
struct Calls(Arc<std::sync::Mutex<std::collections::HashSet<RequestId>>>);

impl Calls {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<RequestId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a message rmcp sends: a call begins, or is cancelled.
    fn sent(&self, message: &TxJsonRpcMessage<RoleClient>) {
        match message {
            JsonRpcMessage::Request(r)
                if matches!(r.request, ClientRequest::CallToolRequest(_)) =>
            {
                let mut calls = self.lock();
                // Ids whose answer never came in a shape parsed here are
                // dropped in the end; their calls, if any are still in
                // flight, go through rmcp's decoder.
                if calls.len() >= MAX_CALLS_KNOWN {
                    calls.clear();
                }
                calls.insert(r.id.clone());
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification {
                    if let Some(id) = &c.params.request_id {
                        self.lock().remove(id);
                    }
                }
            }
            _ => {}
        }
    }

    /// The answer in `line`, when it is the result of a call in flight.
    fn answer(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        #[derive(serde::Deserialize)]
        struct Reply {
            jsonrpc: JsonRpcVersion2_0,
            id: RequestId,
            result: CallToolResult,
        }
        if self.lock().is_empty() {
            return None;
        }
        memchr::memmem::find(line, b"\"result\"")?;
        // Anything else (an error, a result of another kind, a task or
        // input request under MRTR) is left to rmcp's decoder.
        let reply: Reply = serde_json::from_slice(line).ok()?;
        self.lock().remove(&reply.id).then_some(())?;
        Some(JsonRpcMessage::Response(JsonRpcResponse {
            jsonrpc: reply.jsonrpc,
            id: reply.id,
            result: ServerResult::CallToolResult(reply.result),
        }))
    }

    /// Forgets a call rmcp's decoder saw answered.
    fn answered(&self, message: &RxJsonRpcMessage<RoleClient>) {
        let id = match message {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = id {
            self.lock().remove(id);
        }
    }
}

pub struct BundleStdio<R> {
    read: R,
    /// What was read and not yet handed on; `searched` bytes of it hold no
    /// newline.
    buf: BytesMut,
    searched: usize,
    rules: Rules,
    codec: JsonRpcMessageCodec<RxJsonRpcMessage<RoleClient>>,
    /// The writer task's queue, and the task (aborted with the transport).
    queue: mpsc::Sender<Out>,
    writer: Option<tokio_util::task::AbortOnDropHandle<()>>,
    host: HostContext,
    /// The ids of the `tools/call` requests sent and not yet answered.
    calls: Calls,
    /// The calls made below rmcp's client ([`super::spliced`]).
    spliced: Spliced,
    answering: FuturesUnordered<BoxFuture<'static, ()>>,
    /// The stream ended (end of file, an error, or a rule broken).
    ended: bool,
}

impl<R> BundleStdio<R>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    pub fn new<W>(read: R, write: W, rules: Rules, host: HostContext) -> Self
    where
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (queue, lines) = mpsc::channel(QUEUED);
        let spliced = Spliced::new(queue.clone());
        BundleStdio {
            read,
            buf: BytesMut::new(),
            searched: 0,
            rules,
            codec: JsonRpcMessageCodec::default(),
            queue,
            writer: Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                write_lines(write, lines),
            ))),
            host,
            calls: Calls::default(),
            spliced,
            answering: FuturesUnordered::new(),
            ended: false,
        }
    }

    /// Where calls made below rmcp's client go ([`super::spliced`]).
    pub fn spliced(&self) -> Spliced {
        self.spliced.clone()
    }

    /// The next message for rmcp; None when the stream has ended. State
    /// lives in `self`, so a poll that is dropped (rmcp selects on it)
    /// loses nothing.
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<Option<RxJsonRpcMessage<RoleClient>>> {
        loop {
            // Answers in flight finish by writing their line.
            while let Poll::Ready(Some(())) = self.answering.poll_next_unpin(cx) {}
            if self.ended {
                self.spliced.ended();
                return Poll::Ready(None);
            }
            if self.answering.len() >= MAX_ANSWERING {
                // Woken when one of them is written.
                return Poll::Pending;
            }
            if let Some(at) = memchr::memchr(b'\n', &self.buf[self.searched..]) {
                let line = self.buf.split_to(self.searched + at + 1);
                self.searched = 0;
                if let Some(message) = self.line(line) {
                    return Poll::Ready(Some(message));
                }
                continue;
            }
            self.searched = self.buf.len();
            if let Some(reason) = self.rules.check_partial(&self.buf) {
                self.end(reason);
                continue;
            }
            self.buf.reserve(READ_CHUNK);
            match std::task::ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut self.read),
                cx,
                &mut self.buf
            )) {
                Ok(0) => self.ended = true,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("reading the bundle's stdout: {e}");
                    self.ended = true;
                }
            }
        }
    }

    /// One line (with its newline): a message for rmcp, or None when it was
    /// answered here, skipped, or broke a rule.
    fn line(&mut self, mut line: BytesMut) -> Option<RxJsonRpcMessage<RoleClient>> {
        let text = &line[..line.len() - 1];
        if text.trim_ascii().is_empty() {
            return None;
        }
        if self.spliced.expecting() {
            if let Some((n, result)) = self.spliced.answer(text) {
                if let Some(reason) = self.rules.check_line(text, true) {
                    self.end(reason);
                    return None;
                }
                line.truncate(line.len() - 1);
                let line = line.freeze();
                self.spliced
                    .answered(n, super::spliced::RawReply { line, result });
                return None;
            }
        }
        let call = host_call(text);
        let reply = match call {
            None => self.calls.answer(text),
            Some(_) => None,
        };
        if let Some(reason) = self
            .rules
            .check_line(text, call.is_some() || reply.is_some())
        {
            self.end(reason);
            return None;
        }
        if let Some(call) = call {
            self.answer(call);
            return None;
        }
        if reply.is_some() {
            return reply;
        }
        match self.codec.decode(&mut line) {
            Ok(message) => {
                if let Some(m) = &message {
                    self.calls.answered(m);
                }
                message
            }
            Err(e) => {
                // Where, not what: serde's message may quote the bundle's
                // values (its secrets among them).
                let at = match &e {
                    JsonRpcMessageCodecError::Serde(e) => {
                        format!("{:?} at column {}", e.classify(), e.column())
                    }
                    other => other.to_string(),
                };
                tracing::debug!("a message of the bundle was not understood ({at})");
                // Valid JSON-RPC of a shape rmcp does not know: answered as
                // rmcp's own transport answers it.
                let data = matches!(
                    &e,
                    JsonRpcMessageCodecError::Serde(e)
                        if matches!(e.classify(), serde_json::error::Category::Data)
                );
                let refusal = TxJsonRpcMessage::<RoleClient>::error(
                    ErrorData::invalid_request("Invalid request", None),
                    None,
                );
                if let (true, Ok(line)) = (data, encode(&refusal)) {
                    let queue = self.queue.clone();
                    self.answering.push(Box::pin(async move {
                        let _ = queue.send(Out::Line(line, None)).await;
                    }));
                }
                None
            }
        }
    }

    fn answer(&mut self, call: HostCall) {
        let (host, queue) = (self.host.clone(), self.queue.clone());
        self.answering.push(Box::pin(async move {
            let result = host.ask(call.method, call.params).await;
            let _ = queue.send(answer_out(&call.id, result)).await;
        }));
    }

    fn end(&mut self, reason: String) {
        let masked = self.rules.cut(reason);
        tracing::debug!("the bundle's stream is cut: {masked}");
        self.ended = true;
    }
}

/// A host-resources request, as far as this transport needs to know it.
struct HostCall {
    id: NumberOrString,
    method: String,
    params: Option<Value>,
}

/// The request in `line`, if it is a host-resources read or list (a
/// JSON-RPC 2.0 request with an id). Lines that cannot be one are passed
/// over at memory speed.
fn host_call(line: &[u8]) -> Option<HostCall> {
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow)]
        jsonrpc: std::borrow::Cow<'a, str>,
        id: Option<NumberOrString>,
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
        params: Option<Value>,
    }
    memchr::memmem::find(line, b"\"ai.nimblebrain/resources/")?;
    let probe: Probe = serde_json::from_slice(line).ok()?;
    let host =
        probe.method == host_resources::METHOD_READ || probe.method == host_resources::METHOD_LIST;
    (host && probe.jsonrpc == "2.0").then_some(())?;
    Some(HostCall {
        id: probe.id?,
        method: probe.method.into_owned(),
        params: probe.params,
    })
}

/// The response to request `id`: the answer's JSON as it was encoded, or
/// the contract's error.
fn answer_out(id: &NumberOrString, result: Result<Answer, HostError>) -> Out {
    let mut head = Vec::with_capacity(64);
    head.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    serde_json::to_writer(&mut head, id).expect("an id encodes");
    match result {
        Ok(answer) => {
            head.extend_from_slice(br#","result":"#);
            Out::Answer { head, answer }
        }
        Err(e) => {
            head.extend_from_slice(br#","error":"#);
            let error = serde_json::json!({ "code": e.code, "message": e.message, "data": e.data });
            serde_json::to_writer(&mut head, &error).expect("an error encodes");
            head.extend_from_slice(b"}\n");
            Out::Line(head, None)
        }
    }
}

/// `message` as one line. A tool call whose `_meta` is in one place (in
/// its params, or beside them as the call path's trace context is: the
/// gateway's calls, always) is written here: rmcp's serializer goes
/// through a `serde_json::Value` of the params to merge the two, half the
/// instructions of encoding a call (`make bench-callgrind`).
fn encode(message: &TxJsonRpcMessage<RoleClient>) -> std::io::Result<Vec<u8>> {
    let mut line = match message {
        JsonRpcMessage::Request(r) => match &r.request {
            ClientRequest::CallToolRequest(call) => match call_line(&r.id, call)? {
                Some(line) => line,
                None => serde_json::to_vec(message)?,
            },
            _ => serde_json::to_vec(message)?,
        },
        _ => serde_json::to_vec(message)?,
    };
    line.push(b'\n');
    Ok(line)
}

impl<R> Transport<RoleClient> for BundleStdio<R>
where
    R: AsyncRead + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.calls.sent(&item);
        let (queue, line) = (self.queue.clone(), encode(&item));
        async move {
            let closed = || {
                std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the bundle's stdin is closed",
                )
            };
            // Done when written, as rmcp expects of a send (it waits for
            // its answers' sends before it closes the transport).
            let (ack, written) = oneshot::channel();
            queue
                .send(Out::Line(line?, Some(ack)))
                .await
                .map_err(|_| closed())?;
            match written.await {
                Ok(true) => Ok(()),
                _ => Err(closed()),
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        std::future::poll_fn(|cx| self.poll_receive(cx))
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The answers in flight and the writer go; dropping the writer
        // closes the bundle's stdin.
        self.answering.clear();
        self.calls.lock().clear();
        self.spliced.ended();
        self.writer.take();
        // What rmcp sends from now on fails at once.
        self.queue = mpsc::channel(1).0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use ractor::{Actor, ActorProcessingErr, ActorRef};
    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};

    use super::*;
    use crate::bundle::guard::Violation;
    use crate::host_resources::HostRequest;
    use rmcp::model::{MetaObject, RequestMetaObject};

    /// A workspace that answers reads of `files://X` with `{"read": X}`,
    /// `files://missing` with not found, and holds the replies to
    /// `files://held` until told to let them go.
    struct Workspace;

    enum Msg {
        Host(HostRequest),
        Release,
    }

    impl From<HostRequest> for Msg {
        fn from(r: HostRequest) -> Self {
            Msg::Host(r)
        }
    }

    impl TryFrom<Msg> for HostRequest {
        type Error = ();
        fn try_from(m: Msg) -> Result<Self, ()> {
            match m {
                Msg::Host(r) => Ok(r),
                Msg::Release => Err(()),
            }
        }
    }

    /// Replies held; the most held at once.
    struct Held {
        replies: Vec<HostRequest>,
        most: Arc<AtomicUsize>,
    }

    #[ractor::async_trait]
    impl Actor for Workspace {
        type Msg = Msg;
        type State = Held;
        type Arguments = Arc<AtomicUsize>;

        async fn pre_start(
            &self,
            _: ActorRef<Msg>,
            most: Arc<AtomicUsize>,
        ) -> Result<Held, ActorProcessingErr> {
            Ok(Held {
                replies: Vec::new(),
                most,
            })
        }

        async fn handle(
            &self,
            _: ActorRef<Msg>,
            msg: Msg,
            held: &mut Held,
        ) -> Result<(), ActorProcessingErr> {
            match msg {
                Msg::Host(r) => {
                    let uri = r
                        .params
                        .as_ref()
                        .and_then(|p| p["uri"].as_str())
                        .unwrap_or("");
                    match uri.strip_prefix("files://") {
                        Some("held") => {
                            held.replies.push(r);
                            held.most.fetch_max(held.replies.len(), Ordering::SeqCst);
                        }
                        Some("big") => {
                            let big = json!({ "read": "x".repeat(256 << 10) });
                            let _ = r.reply.send(Ok(Answer::encode(&big)));
                        }
                        Some("missing") => {
                            let _ = r.reply.send(Err(HostError::not_found(uri)));
                        }
                        Some(name) => {
                            let answer = json!({ "read": name, "method": r.method, "by": r.requester.bundle });
                            let _ = r.reply.send(Ok(Answer::encode(&answer)));
                        }
                        None => {
                            let _ = r
                                .reply
                                .send(Ok(Answer::encode(&json!({ "list": r.params }))));
                        }
                    }
                }
                Msg::Release => {
                    for r in held.replies.drain(..) {
                        let _ = r.reply.send(Ok(Answer::encode(&json!({ "read": "held" }))));
                    }
                }
            }
            Ok(())
        }
    }

    struct Bench {
        transport: BundleStdio<tokio::io::ReadHalf<DuplexStream>>,
        /// The bundle's end: what it writes, what it reads.
        bundle: tokio::io::WriteHalf<DuplexStream>,
        answers: BufReader<tokio::io::ReadHalf<DuplexStream>>,
        workspace: ActorRef<Msg>,
        most_held: Arc<AtomicUsize>,
        violation: Violation,
    }

    async fn bench(max_message_bytes: usize) -> Bench {
        bench_piped(max_message_bytes, 1 << 20).await
    }

    /// A bench whose pipe holds `pipe` bytes each way.
    async fn bench_piped(max_message_bytes: usize, pipe: usize) -> Bench {
        let most_held = Arc::new(AtomicUsize::new(0));
        let (workspace, _) = Actor::spawn(None, Workspace, most_held.clone())
            .await
            .unwrap();
        let host = HostContext::new("w", "b", workspace.get_derived());
        let (daemon_end, bundle_end) = tokio::io::duplex(pipe);
        let (read, write) = tokio::io::split(daemon_end);
        let violation = Violation::default();
        let rules = Rules::new(max_message_bytes, violation.clone());
        let (answers, bundle) = tokio::io::split(bundle_end);
        Bench {
            transport: BundleStdio::new(read, write, rules, host),
            bundle,
            answers: BufReader::new(answers),
            workspace,
            most_held,
            violation,
        }
    }

    fn read_request(id: Value, uri: &str) -> String {
        json!({"jsonrpc": "2.0", "id": id, "method": host_resources::METHOD_READ, "params": {"uri": uri}})
            .to_string()
            + "\n"
    }

    /// Drives the transport (as rmcp would) until `n` answer lines came
    /// back; any message it hands on is returned too.
    async fn answers(b: &mut Bench, n: usize) -> (Vec<Value>, Vec<RxJsonRpcMessage<RoleClient>>) {
        let (mut lines, mut messages) = (Vec::new(), Vec::new());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lines.len() < n {
            let mut line = String::new();
            tokio::select! {
                m = b.transport.receive() => messages.push(m.expect("the stream goes on")),
                r = b.answers.read_line(&mut line) => {
                    r.unwrap();
                    lines.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")));
                }
                _ = tokio::time::sleep_until(deadline) => panic!("{} of {n} answers came", lines.len()),
            }
        }
        (lines, messages)
    }

    #[tokio::test]
    async fn host_requests_are_answered_here_and_the_rest_goes_to_rmcp() {
        let mut b = bench(1 << 20).await;
        let list = json!({"jsonrpc": "2.0", "id": "l", "method": host_resources::METHOD_LIST,
            "params": {"_meta": {"filter": {"mimeType": "text/plain"}}}});
        let input = read_request(json!(7), "files://a")
            + "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n"
            + &read_request(json!("s-1"), "files://missing")
            + &list.to_string()
            + "\n";
        b.bundle.write_all(input.as_bytes()).await.unwrap();
        let (got, messages) = answers(&mut b, 3).await;
        let answer = |id: Value| got.iter().find(|v| v["id"] == id).unwrap().clone();
        let got = [answer(json!(7)), answer(json!("l")), answer(json!("s-1"))];
        assert_eq!(
            got[0],
            json!({"jsonrpc": "2.0", "id": 7, "result": {"read": "a", "method": host_resources::METHOD_READ, "by": "b"}})
        );
        assert_eq!(got[1]["id"], "l");
        // `_meta` reaches the workspace inside params, where the contract has it.
        assert_eq!(
            got[1]["result"]["list"]["_meta"]["filter"]["mimeType"],
            "text/plain"
        );
        assert_eq!(got[2]["id"], "s-1");
        assert_eq!(got[2]["error"]["code"], host_resources::codes::NOT_FOUND);
        assert_eq!(got[2]["error"]["data"]["uri"], "files://missing");
        // The notification was rmcp's, and only it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut messages = messages;
        while messages.is_empty() {
            tokio::select! {
                m = b.transport.receive() => messages.push(m.unwrap()),
                _ = tokio::time::sleep_until(deadline) => panic!("the notification never came"),
            }
        }
        assert_eq!(messages.len(), 1);
        let text = serde_json::to_string(&messages[0]).unwrap();
        assert!(text.contains("notifications/tools/list_changed"), "{text}");
    }

    #[tokio::test]
    async fn answers_in_flight_are_bounded_and_all_come_back_whole() {
        let mut b = bench(1 << 20).await;
        let total = MAX_ANSWERING + 36;
        let input: String = (0..total)
            .map(|i| read_request(json!(i), "files://held"))
            .collect();
        b.bundle.write_all(input.as_bytes()).await.unwrap();
        // The workspace holds every reply: reading stops at the bound.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while b.most_held.load(Ordering::SeqCst) < MAX_ANSWERING {
            tokio::select! {
                _ = b.transport.receive() => panic!("nothing for rmcp here"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the bound was never reached"
            );
        }
        // Released in rounds, every request is answered once, as a whole line,
        // and never more than the bound were waiting at once.
        let mut got = Vec::new();
        while got.len() < total {
            b.workspace.cast(Msg::Release).unwrap();
            let (lines, _) = answers(&mut b, (total - got.len()).min(MAX_ANSWERING)).await;
            got.extend(lines);
        }
        let mut ids: Vec<u64> = got.iter().map(|v| v["id"].as_u64().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, (0..total as u64).collect::<Vec<_>>());
        assert!(got.iter().all(|v| v["result"]["read"] == "held"));
        assert_eq!(b.most_held.load(Ordering::SeqCst), MAX_ANSWERING);
    }

    #[tokio::test]
    async fn a_line_that_breaks_the_rules_ends_the_stream_with_its_reason() {
        let mut b = bench(1 << 20).await;
        b.bundle
            .write_all(b"Listening on port 8080\n{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n")
            .await
            .unwrap();
        assert!(b.transport.receive().await.is_none());
        assert!(b.violation.get().unwrap().contains("Listening on port"));
        // An overlong line is cut before it ends.
        let mut b = bench(100).await;
        b.bundle.write_all(&[b'{'; 200]).await.unwrap();
        assert!(b.transport.receive().await.is_none());
        assert!(b.violation.get().unwrap().contains("longer than 100 bytes"));
    }

    #[tokio::test]
    async fn rmcp_messages_and_answers_never_cut_each_other() {
        let mut b = bench(1 << 20).await;
        let input: String = (0..50)
            .map(|i| read_request(json!(i), "files://x"))
            .collect();
        b.bundle.write_all(input.as_bytes()).await.unwrap();
        // rmcp sends big messages meanwhile, from tasks of their own.
        let big = "y".repeat(256 << 10);
        let sends: Vec<_> = (0..4)
            .map(|i| {
                let note = rmcp::model::ClientNotification::CustomNotification(
                    rmcp::model::CustomNotification::new(
                        "x/big",
                        Some(json!({ "i": i, "text": big })),
                    ),
                );
                tokio::spawn(
                    b.transport
                        .send(rmcp::model::JsonRpcMessage::notification(note)),
                )
            })
            .collect();
        let (got, _) = answers(&mut b, 54).await;
        for send in sends {
            send.await.unwrap().unwrap();
        }
        assert_eq!(
            got.iter().filter(|v| v["result"]["read"] == "x").count(),
            50
        );
        assert_eq!(got.iter().filter(|v| v["method"] == "x/big").count(), 4);
    }

    /// A tool call written by [`encode`] says what rmcp's serializer says:
    /// its params' `_meta`, a `_meta` beside them (typed or legacy),
    /// arguments and MRTR fields included; a `_meta` in both places (merged
    /// by rmcp) and other messages are rmcp's to write.
    #[test]
    fn a_tool_call_is_written_as_rmcp_writes_it() {
        use rmcp::model::{CallToolRequestParams, GetExtensions, GetMeta, Request};
        let request = |params: CallToolRequestParams| {
            TxJsonRpcMessage::<RoleClient>::request(
                ClientRequest::CallToolRequest(Request::new(params)),
                RequestId::Number(41),
            )
        };
        let mut traced = CallToolRequestParams::new("echo").with_arguments(
            json!({"text": "a \"quoted\"\nline", "n": [1, 2.5, null]})
                .as_object()
                .unwrap()
                .clone(),
        );
        let mut in_params = RequestMetaObject::default();
        in_params.set_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        traced.meta = Some(in_params);
        let mut retried = CallToolRequestParams::new("confirm");
        retried.request_state = Some("s1".into());
        // The trace context beside the params (as the call path sets it),
        // alone, and with a `_meta` in the params too (merged by rmcp).
        let beside = |params: CallToolRequestParams| {
            let mut message = request(params);
            if let JsonRpcMessage::Request(r) = &mut message {
                r.request
                    .get_meta_mut()
                    .set_traceparent("00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
            }
            message
        };
        let mut both = CallToolRequestParams::new("echo");
        let mut progress = RequestMetaObject::default();
        progress.set_progress_token(rmcp::model::ProgressToken(RequestId::Number(3)));
        both.meta = Some(progress);
        // A legacy `_meta` beside them, and an empty one in them.
        let mut legacy = request(CallToolRequestParams::new("echo"));
        if let JsonRpcMessage::Request(r) = &mut legacy {
            let mut meta = MetaObject::new();
            meta.0.insert("k".into(), json!("v"));
            r.request.extensions_mut().insert(meta);
        }
        let mut empty = CallToolRequestParams::new("echo");
        empty.meta = Some(RequestMetaObject::default());
        let other = TxJsonRpcMessage::<RoleClient>::request(
            ClientRequest::ListToolsRequest(Default::default()),
            RequestId::String("t".into()),
        );
        for message in [
            request(CallToolRequestParams::new("plain")),
            request(traced),
            request(retried),
            beside(CallToolRequestParams::new("echo").with_arguments(Default::default())),
            beside(both),
            legacy,
            request(empty),
            other,
        ] {
            let line = encode(&message).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
            let ours: Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(ours, serde_json::to_value(&message).unwrap());
        }
    }

    /// A tool result is parsed as one when its call is in flight; every
    /// other answer (another request's, an error, an unknown id) still
    /// goes through rmcp's decoder, and a call answered or cancelled is
    /// forgotten.
    #[tokio::test]
    async fn a_tool_result_is_parsed_as_its_call_expects() {
        use rmcp::model::{
            CallToolRequest, CallToolRequestParams, CancelledNotification,
            CancelledNotificationParam, ListToolsRequest,
        };
        let mut b = bench(1 << 20).await;
        for id in 1..=3 {
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new("echo"),
            ));
            b.transport
                .send(JsonRpcMessage::request(request, NumberOrString::Number(id)))
                .await
                .unwrap();
        }
        let list = ClientRequest::ListToolsRequest(ListToolsRequest::default());
        b.transport
            .send(JsonRpcMessage::request(list, NumberOrString::Number(4)))
            .await
            .unwrap();
        let cancel = ClientNotification::CancelledNotification(CancelledNotification::new(
            CancelledNotificationParam::new(Some(NumberOrString::Number(3)), None),
        ));
        b.transport
            .send(JsonRpcMessage::notification(cancel))
            .await
            .unwrap();
        assert_eq!(
            b.transport.calls.lock().len(),
            2,
            "1 and 2; 3 was cancelled"
        );
        let text = r#"{"content":[{"type":"text","text":"hi"}]}"#;
        let replies = [
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{text}}}"#),
            r#"{"jsonrpc":"2.0","id":4,"result":{"tools":[]}}"#.to_string(),
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"boom"}}"#.to_string(),
        ];
        b.bundle
            .write_all((replies.join("\n") + "\n").as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(b.transport.receive().await.unwrap());
        }
        match &got[0] {
            JsonRpcMessage::Response(r) => {
                assert_eq!(r.id, NumberOrString::Number(1));
                let ServerResult::CallToolResult(result) = &r.result else {
                    panic!("{:?}", r.result)
                };
                assert_eq!(
                    serde_json::to_value(result).unwrap(),
                    serde_json::from_str::<Value>(text).unwrap()
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&got[1], JsonRpcMessage::Response(r) if matches!(r.result, ServerResult::ListToolsResult(_))),
            "{:?}",
            got[1]
        );
        assert!(
            matches!(&got[2], JsonRpcMessage::Error(e) if e.error.message == "boom"),
            "{:?}",
            got[2]
        );
        assert!(
            b.transport.calls.lock().is_empty(),
            "every call is answered"
        );
    }

    /// A bundle that asks for a large file and never reads its stdin
    /// stalls its own answer, not the transport: closing it (as rmcp does
    /// when the stream ends) returns at once. With one lock around the
    /// pipe, the stalled answer held it and `close` waited forever.
    #[tokio::test]
    async fn close_returns_while_an_answer_waits_for_a_bundle_that_does_not_read() {
        let mut b = bench_piped(1 << 20, 4096).await;
        b.bundle
            .write_all(read_request(json!(1), "files://big").as_bytes())
            .await
            .unwrap();
        // Drive the transport until the answer is being written (the pipe
        // is full), then end the stream.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            tokio::select! {
                _ = b.transport.receive() => panic!("nothing for rmcp here"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            let stuck = b.transport.answering.is_empty() && b.transport.queue.capacity() == QUEUED;
            if stuck {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the answer was never taken"
            );
        }
        tokio::time::timeout(Duration::from_secs(5), b.transport.close())
            .await
            .expect("close returned")
            .unwrap();
        // An rmcp message sent after the close fails instead of waiting.
        let note = rmcp::model::ClientNotification::CustomNotification(
            rmcp::model::CustomNotification::new("x/after", None),
        );
        let late = tokio::time::timeout(
            Duration::from_secs(5),
            b.transport.send(JsonRpcMessage::notification(note)),
        )
        .await
        .expect("send returned");
        assert!(late.is_err());
    }

    /// Blank lines are skipped, as rmcp's own transport skips them: no
    /// "Invalid request" answer for each.
    #[tokio::test]
    async fn blank_lines_are_passed_over_without_an_answer() {
        let mut b = bench(1 << 20).await;
        let input = "\n   \n\t\n".to_string() + &read_request(json!(9), "files://a");
        b.bundle.write_all(input.as_bytes()).await.unwrap();
        let (got, messages) = answers(&mut b, 1).await;
        assert_eq!(got[0]["id"], 9, "{got:?}");
        assert!(messages.is_empty());
    }
}
