//! A plain `tools/call` answered below rmcp's HTTP service (issue 37): a
//! stateless 2026-07-28 one, or one on a 2025-11-25 session whose agent
//! can be asked nothing. The request is parsed once, then takes the same
//! call path every other request takes — [`Gateway::call_exposed`]:
//! route, profile, the token's rules, the audit and its span, rounds when
//! the bundle asks for input — on the session's own gateway for a
//! session's, and the answer is written as one JSON body — or, when the
//! request asked for progress and the bundle reports some before its
//! answer, as an event stream of the reports and then the answer, as
//! rmcp streams a request's notifications on its own response. To a
//! stdio bundle the call goes below rmcp's client too, and its answer is
//! written on as the bundle wrote it ([`crate::bundle::spliced`]). rmcp's
//! service costs a request of its own, a oneshot transport or the
//! session's worker and channels, a spawned serve loop, a parse that
//! builds an error for each variant it tries and two conversions; none is
//! needed for a request that is one call.
//!
//! Only a request that rmcp would accept and answer the same way is taken
//! here; anything else (another method, a header or `_meta` this path does
//! not check, log messages asked for, a task, a resumed
//! request, the search profile's meta-tools, a tool whose schema names
//! `Mcp-Param-*` headers, an `Origin`, a Host rmcp would check, a session
//! not yet (or no longer) known, or whose agent declared sampling,
//! elicitation or roots — their requests may go on the call's own stream,
//! which a JSON answer does not have) is handed back untouched for rmcp to
//! answer.

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorCode, ProgressNotification,
    ProgressNotificationParam, ProtocolVersion, RequestId, ServerJsonRpcMessage,
    ServerNotification, ServerResult,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::facts::{Direct, DirectMeta, Facts};
use super::server::{Called, Sessions};
use super::Gateway;

/// The one revision answered here without a session.
const REVISION: &str = "2026-07-28";

/// A request this path takes: what it asks, and how it is named.
struct Call {
    id: RequestId,
    meta: DirectMeta,
    params: CallToolRequestParams,
}

impl Call {
    fn new(
        id: RequestId,
        meta: DirectMeta,
        name: String,
        arguments: Option<rmcp::model::JsonObject>,
    ) -> Call {
        let mut params = CallToolRequestParams::new(name);
        params.arguments = arguments;
        Call { id, meta, params }
    }
}

/// Answers `request` (its body `body`) when it is a plain tool call —
/// stateless, or on `session` (its id, already checked to be this token's)
/// — with a gateway `make` makes or the session's own (from the
/// endpoint's `live` sessions); otherwise gives it back. `hosts_checked`:
/// rmcp checks the Host of this listener (a loopback one).
pub async fn answer(
    (make, live): (&(dyn Fn() -> Gateway + Send + Sync), &Sessions),
    request: axum::extract::Request,
    body: &Bytes,
    hosts_checked: bool,
    session: Option<&str>,
) -> Result<Response, axum::extract::Request> {
    let (gateway, peer) = match session {
        None => (None, None),
        Some(id) => match live.get(id) {
            Some((gateway, peer)) => (Some(gateway), Some(peer)),
            None => return Err(request),
        },
    };
    let fits = match &peer {
        None => headers_fit(request.headers(), hosts_checked, REVISION, false),
        Some(peer) => peer.peer_info().is_some_and(|info| {
            let caps = &info.capabilities;
            let askable =
                caps.sampling.is_some() || caps.elicitation.is_some() || caps.roots.is_some();
            // Sessions are older revisions' (2026-07-28 has none).
            let legacy = info.protocol_version < ProtocolVersion::V_2026_07_28;
            let revision = info.protocol_version.as_str();
            legacy && !askable && headers_fit(request.headers(), hosts_checked, revision, true)
        }),
    };
    let call = match (fits, &peer) {
        (false, _) => None,
        (true, None) => parse(body, request.headers()),
        (true, Some(_)) => parse_on_session(body),
    };
    let Some(call) = call else {
        return Err(request);
    };
    let gateway = gateway.unwrap_or_else(make);
    if gateway.searching() || names_headers(&gateway, &call.params.name).await {
        return Err(request);
    }
    let (parts, _) = request.into_parts();
    let Call { id, meta, params } = call;
    let ct = CancellationToken::new();
    // A session's agent may cancel it by its id, as rmcp's own requests.
    let cancellable = peer
        .is_some()
        .then(|| gateway.below_rmcp(id.clone(), ct.clone()));
    let (progress, reports) = match &meta.progress_token {
        Some(_) => {
            let (tx, rx) = mpsc::channel(16);
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let direct = Direct {
        id: id.clone(),
        meta,
        parts,
        ct: ct.clone(),
        session: peer,
        progress,
    };
    let on_session = session.is_some();
    let Some(mut reports) = reports else {
        // Answered as the connection's own work, without a task of its
        // own (a task, its wake-ups and the copies of its state were
        // 8,000 instructions a call): the connection polls the call until
        // its answer. An agent that goes away drops the call with its
        // connection: the bundle is told the call is cancelled, and the
        // call is audited as ended so ([`Gateway::call_exposed`]).
        // Cancelled if dropped: a part of the call handed to another task
        // (the bundle's actor, a retry after a remote's 401) hears it.
        let cancel_on_drop = ct.drop_guard();
        let facts = Facts::Direct(&direct);
        let answered = Box::pin(gateway.call_exposed(params, &facts)).await;
        cancel_on_drop.disarm();
        drop(cancellable);
        return Ok(respond(reply_of(Ok(answered), &id, on_session)));
    };
    // In a task of its own, as rmcp runs a request that may be answered
    // with a stream: the stream is polled only as fast as the agent reads
    // it, and the call keeps its own clock. An agent that goes away
    // cancels the call, which still ends (and is audited) as one. The
    // progress sender goes with the task: when it ends, every report the
    // call made is queued.
    let cancel_on_drop = ct.drop_guard();
    let mut task = tokio::spawn(async move {
        let facts = Facts::Direct(&direct);
        gateway.call_exposed(params, &facts).await
    });
    // One JSON body unless the bundle reports progress before its answer;
    // then a stream of the reports, and the answer last.
    let (first, last): (_, BoxFuture<'static, _>) = tokio::select! {
        answered = &mut task => {
            let mut queued = Vec::new();
            while let Ok(report) = reports.try_recv() {
                queued.push(report);
            }
            cancel_on_drop.disarm();
            let reply = reply_of(answered, &id, on_session);
            if queued.is_empty() {
                return Ok(respond(reply));
            }
            (queued, Box::pin(std::future::ready(reply.body)))
        }
        Some(report) = reports.recv() => {
            let id = id.clone();
            let last = async move {
                let answered = task.await;
                cancel_on_drop.disarm();
                drop(cancellable);
                reply_of(answered, &id, on_session).body
            };
            (vec![report], Box::pin(last))
        }
    };
    Ok(streamed(first, reports, last, on_session))
}

/// The answer as an event stream: progress reports `first`, those still
/// to come on `reports` (which ends with the call), then the `last`
/// message (written). A stream that is dropped (the agent went away)
/// cancels the call with `last`. A session's events have ids, as rmcp's
/// have, so that
/// an agent whose stream breaks resumes it: and hears at once that it
/// cannot be resumed ([`crate::daemon::resumed::UNKEPT`]), or, after a
/// daemon restart, that its session is gone — rather than waiting for an
/// answer that cannot come.
fn streamed(
    first: Vec<ProgressNotificationParam>,
    reports: mpsc::Receiver<ProgressNotificationParam>,
    last: BoxFuture<'static, Vec<u8>>,
    with_ids: bool,
) -> Response {
    use futures::StreamExt;
    let rest = futures::stream::unfold(reports, |mut reports| async move {
        let report = reports.recv().await?;
        Some((report, reports))
    });
    let events = futures::stream::iter(first)
        .chain(rest)
        .map(|report| {
            let note = ServerNotification::ProgressNotification(ProgressNotification::new(report));
            serde_json::to_vec(&ServerJsonRpcMessage::notification(note)).unwrap_or_default()
        })
        .chain(futures::stream::once(last))
        .enumerate()
        .map(move |(n, message)| {
            let mut event = Vec::with_capacity(message.len() + 32);
            if with_ids {
                let unkept = crate::daemon::resumed::UNKEPT;
                event.extend_from_slice(format!("id: {unkept}{n}\n").as_bytes());
            }
            event.extend_from_slice(b"data: ");
            event.extend_from_slice(&message);
            event.extend_from_slice(b"\n\n");
            Ok::<_, std::convert::Infallible>(event)
        });
    let headers = [
        (header::CONTENT_TYPE, "text/event-stream"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, axum::body::Body::from_stream(events)).into_response()
}

/// The answer to a request, written: its body, and its status as a whole
/// answer.
struct Reply {
    status: StatusCode,
    body: Vec<u8>,
}

/// The JSON-RPC answer to request `id`, from the call's task, written: a
/// tool's result as the bundle wrote it goes on as it is, in the
/// revision's shape.
fn reply_of(
    answered: Result<Result<Called, rmcp::ErrorData>, tokio::task::JoinError>,
    id: &RequestId,
    on_session: bool,
) -> Reply {
    let answered = match answered {
        Ok(Ok(Called::Raw(raw))) => {
            let mut body = Vec::with_capacity(raw.line_len() + 64);
            body.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
            serde_json::to_writer(&mut body, id).expect("an id encodes");
            body.extend_from_slice(br#","result":"#);
            raw.write(&mut body, on_session);
            body.push(b'}');
            return Reply {
                status: StatusCode::OK,
                body,
            };
        }
        Ok(Ok(Called::Response(response))) => Ok(Ok(response)),
        Ok(Err(error)) => Ok(Err(error)),
        Err(e) => Err(e),
    };
    let message = message_of(answered, id.clone(), on_session);
    Reply {
        status: status_of(&message, on_session),
        body: serde_json::to_vec(&message).unwrap_or_default(),
    }
}

/// The JSON-RPC answer to request `id`, from the call's task.
fn message_of(
    answered: Result<Result<CallToolResponse, rmcp::ErrorData>, tokio::task::JoinError>,
    id: RequestId,
    on_session: bool,
) -> ServerJsonRpcMessage {
    match answered {
        Ok(Ok(response)) => {
            ServerJsonRpcMessage::response(for_revision(response.into(), on_session), id)
        }
        Ok(Err(mut error)) => {
            // As rmcp answers 2026-07-28: the standard code.
            if !on_session && error.code == ErrorCode::RESOURCE_NOT_FOUND {
                error.code = ErrorCode::INVALID_PARAMS;
            }
            ServerJsonRpcMessage::error(error, Some(id))
        }
        Err(e) => ServerJsonRpcMessage::error(
            rmcp::ErrorData::internal_error(format!("the call's task ended: {e}"), None),
            Some(id),
        ),
    }
}

/// A result in the shape rmcp gives the request's revision: 2026-07-28's
/// cache hints; a session's (an older revision) without `resultType:
/// "complete"` and with object-only tool output.
fn for_revision(mut result: ServerResult, on_session: bool) -> ServerResult {
    if on_session {
        result.strip_result_type_for_legacy_peer();
        result.strip_non_object_output_for_legacy_peer();
    } else {
        result.fill_missing_cache_hints();
    }
    result
}

/// The reply as rmcp writes a whole one: a JSON body.
fn respond(reply: Reply) -> Response {
    let json = [(header::CONTENT_TYPE, "application/json")];
    (reply.status, json, reply.body).into_response()
}

/// A whole answer's status, by the error it carries (2026-07-28's header
/// and capability errors are 400, an unknown method 404, anything else
/// 200), as rmcp's. A session's answer is 200 whatever it carries, as
/// rmcp's stream of it is.
fn status_of(message: &ServerJsonRpcMessage, on_session: bool) -> StatusCode {
    match message {
        ServerJsonRpcMessage::Error(_) if on_session => StatusCode::OK,
        ServerJsonRpcMessage::Error(e) => match e.error.code {
            ErrorCode::UNSUPPORTED_PROTOCOL_VERSION
            | ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY
            | ErrorCode::HEADER_MISMATCH => StatusCode::BAD_REQUEST,
            ErrorCode::METHOD_NOT_FOUND => StatusCode::NOT_FOUND,
            _ => StatusCode::OK,
        },
        _ => StatusCode::OK,
    }
}

/// A request's body as text, checked once: serde's reader of bytes checks
/// every string of it again (a fifth of the parse).
fn text_of(body: &[u8]) -> Option<&str> {
    std::str::from_utf8(body).ok()
}

/// The one value of header `name`, as text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    first.to_str().ok()
}

/// The request's headers are those of a plain call of `revision` —
/// stateless (2026-07-28, named by `Mcp-Method`), or on a session — each
/// as rmcp would accept it.
fn headers_fit(headers: &HeaderMap, hosts_checked: bool, revision: &str, session: bool) -> bool {
    // Media types as rmcp reads them: each without its parameters.
    let media = |value: &str, kind: &str| {
        let named = value.split(';').next().unwrap_or_default();
        named.trim().eq_ignore_ascii_case(kind)
    };
    // One pass over the head (each lookup by name hashes it again).
    let mut seen = Seen::default();
    let (mut json, mut events) = (false, false);
    for (name, value) in headers {
        let slot = match name.as_str() {
            "accept" => {
                for kind in value.to_str().unwrap_or_default().split(',') {
                    json |= media(kind, "application/json");
                    events |= media(kind, "text/event-stream");
                }
                continue;
            }
            "content-type" => &mut seen.content_type,
            "host" => &mut seen.host,
            "mcp-protocol-version" => &mut seen.version,
            "mcp-method" => &mut seen.method,
            "mcp-name" => &mut seen.name,
            "mcp-session-id" => &mut seen.session,
            // rmcp checks these, or answers otherwise.
            "origin" | "last-event-id" => return false,
            other if other.starts_with("mcp-param-") => return false,
            _ => continue,
        };
        slot.add(value);
    }
    let json_body = seen
        .content_type
        .single()
        .is_some_and(|t| media(t, "application/json"));
    let host_ok = !hosts_checked || seen.host.single().is_some_and(loopback_host);
    // A session's request names it, and none of 2026-07-28's headers.
    let kind = if session {
        seen.session.single().is_some() && seen.method.count == 0 && seen.name.count == 0
    } else {
        seen.session.count == 0 && seen.method.single() == Some("tools/call")
    };
    seen.version.single() == Some(revision) && kind && json && events && json_body && host_ok
}

/// The headers [`headers_fit`] looks at, as it found them.
#[derive(Default)]
struct Seen<'a> {
    content_type: Values<'a>,
    host: Values<'a>,
    version: Values<'a>,
    method: Values<'a>,
    name: Values<'a>,
    session: Values<'a>,
}

/// How many values a header has, and its first.
#[derive(Default)]
struct Values<'a> {
    count: usize,
    first: Option<&'a axum::http::HeaderValue>,
}

impl<'a> Values<'a> {
    fn add(&mut self, value: &'a axum::http::HeaderValue) {
        self.count += 1;
        self.first.get_or_insert(value);
    }

    /// The one value, as text (as [`single`] reads it).
    fn single(&self) -> Option<&'a str> {
        (self.count == 1).then_some(())?;
        self.first?.to_str().ok()
    }
}

/// A Host of rmcp's default allowed hosts (`localhost`, `127.0.0.1`,
/// `::1`, any port).
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1")
}

/// One JSON-RPC request, as this path takes it: nothing else in it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire<'a, P> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    id: RequestId,
    #[serde(borrow)]
    method: &'a str,
    params: P,
}

impl<P> Wire<'_, P> {
    fn is_call(&self) -> bool {
        self.jsonrpc == "2.0" && self.method == "tools/call"
    }
}

/// A tool call's params with nothing but a name, arguments and `_meta`
/// (no `requestState`, `inputResponses` or `task`).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WireParams {
    name: String,
    #[serde(default)]
    arguments: Option<rmcp::model::JsonObject>,
    #[serde(rename = "_meta")]
    meta: DirectMeta,
}

/// `T`, read only from a JSON object: serde's derived readers take an
/// array of the fields' values too, which rmcp refuses.
struct MapOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
            .map(MapOnly)
    }
}

/// A value read only to be checked as a `Value` would be (numbers in
/// range, escapes whole, nesting bounded), then dropped: whether it is
/// there (not `null`).
struct Checked(bool);

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked(true))
    }
}

impl<'de> serde::de::Visitor<'de> for Checked {
    type Value = Checked;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked(false))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(self)
    }
}

/// A `_meta` key: one policy reads, or any other.
enum MetaKey {
    ProgressToken,
    Traceparent,
    Tracestate,
    ProtocolVersion,
    ClientCapabilities,
    ClientInfo,
    LogLevel,
    Other,
}

impl<'de> serde::Deserialize<'de> for MetaKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl serde::de::Visitor<'_> for Key {
            type Value = MetaKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E>(self, key: &str) -> Result<MetaKey, E> {
                Ok(match key {
                    "progressToken" => MetaKey::ProgressToken,
                    "traceparent" => MetaKey::Traceparent,
                    "tracestate" => MetaKey::Tracestate,
                    "io.modelcontextprotocol/protocolVersion" => MetaKey::ProtocolVersion,
                    "io.modelcontextprotocol/clientCapabilities" => MetaKey::ClientCapabilities,
                    "io.modelcontextprotocol/clientInfo" => MetaKey::ClientInfo,
                    "io.modelcontextprotocol/logLevel" => MetaKey::LogLevel,
                    _ => MetaKey::Other,
                })
            }
        }
        d.deserialize_str(Key)
    }
}

/// A request's `_meta`, read as rmcp reads its map: an object only, each
/// value checked as a `Value` would be, a key given twice as its last.
impl<'de> serde::Deserialize<'de> for DirectMeta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Meta;
        impl<'de> serde::de::Visitor<'de> for Meta {
            type Value = DirectMeta;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<DirectMeta, A::Error> {
                let mut meta = DirectMeta::default();
                while let Some(key) = map.next_key::<MetaKey>()? {
                    match key {
                        MetaKey::ProgressToken => meta.progress_token = map.next_value()?,
                        MetaKey::Traceparent => meta.traceparent = map.next_value()?,
                        MetaKey::Tracestate => meta.tracestate = map.next_value()?,
                        MetaKey::ProtocolVersion => meta.protocol_version = map.next_value()?,
                        MetaKey::ClientCapabilities => {
                            // As rmcp reads it: from its `Value`.
                            let value: serde_json::Value = map.next_value()?;
                            meta.client_capabilities = match value {
                                serde_json::Value::Null => None,
                                value => Some(
                                    serde_json::from_value(value)
                                        .map_err(serde::de::Error::custom)?,
                                ),
                            };
                        }
                        MetaKey::ClientInfo => meta.client_info = map.next_value::<Checked>()?.0,
                        MetaKey::LogLevel => meta.log_level = map.next_value::<Checked>()?.0,
                        MetaKey::Other => {
                            map.next_value::<Checked>()?;
                        }
                    }
                }
                Ok(meta)
            }
        }
        d.deserialize_map(Meta)
    }
}

/// The call in `body`, when it is one `tools/call` request with only a
/// name, arguments and a `_meta` of this revision that asks for neither
/// log messages nor a task, named by its `Mcp-Name`.
fn parse(body: &[u8], headers: &HeaderMap) -> Option<Call> {
    let MapOnly(wire): MapOnly<Wire<'_, MapOnly<WireParams>>> =
        serde_json::from_str(text_of(body)?).ok()?;
    if !wire.is_call() {
        return None;
    }
    let MapOnly(WireParams {
        name,
        arguments,
        meta,
    }) = wire.params;
    let revision = ProtocolVersion::V_2026_07_28;
    // As rmcp reads it: this revision, its required keys (the version and
    // the capabilities), no log messages asked for, no tasks declared.
    let fits = meta.protocol_version.as_ref() == Some(&revision)
        && !meta.log_level
        && meta
            .client_capabilities
            .as_ref()
            .is_some_and(|c| !c.supports_tasks());
    // `Mcp-Name` is the name, as it is (an encoded one is rmcp's to check).
    if !fits || single(headers, "mcp-name") != Some(name.as_str()) {
        return None;
    }
    Some(Call::new(wire.id, meta, name, arguments))
}

/// A session request's tool call params: a name, arguments and perhaps a
/// `_meta`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionParams {
    name: String,
    #[serde(default)]
    arguments: Option<rmcp::model::JsonObject>,
    #[serde(rename = "_meta", default)]
    meta: Option<DirectMeta>,
}

/// The call in `body`, a session's request: one `tools/call` with only a
/// name, arguments and a `_meta` that asks for no log messages and
/// carries nothing of 2026-07-28.
fn parse_on_session(body: &[u8]) -> Option<Call> {
    let MapOnly(wire): MapOnly<Wire<'_, MapOnly<SessionParams>>> =
        serde_json::from_str(text_of(body)?).ok()?;
    if !wire.is_call() {
        return None;
    }
    let MapOnly(SessionParams {
        name,
        arguments,
        meta,
    }) = wire.params;
    let meta = meta.unwrap_or_default();
    let plain = !meta.log_level
        && meta.protocol_version.is_none()
        && meta.client_capabilities.is_none()
        && !meta.client_info;
    plain.then(|| Call::new(wire.id, meta, name, arguments))
}

/// Whether the tool's schema names headers its arguments are sent in
/// (`x-mcp-header`), which rmcp checks against `Mcp-Param-*`.
async fn names_headers(gateway: &Gateway, name: &str) -> bool {
    fn names(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::Object(map) => {
                map.contains_key("x-mcp-header") || map.values().any(names)
            }
            serde_json::Value::Array(items) => items.iter().any(names),
            _ => false,
        }
    }
    // A tool not found is rmcp's to answer.
    let schema = gateway.routed_schema(name).await;
    schema.is_none_or(|schema| schema.values().any(names) || schema.contains_key("x-mcp-header"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stateless call's headers with `content_type` and `accept`.
    fn stateless(content_type: &str, accept: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", content_type),
            ("accept", accept),
            ("host", "127.0.0.1:8766"),
            ("mcp-protocol-version", REVISION),
            ("mcp-method", "tools/call"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        headers
    }

    /// Media types are read as rmcp reads them: the type, without its
    /// parameters, in any case; a longer type that starts the same is
    /// another one (rmcp answers 415 or 406 for it).
    #[test]
    fn media_types_are_read_whole_as_rmcp_reads_them() {
        let both = "application/json, text/event-stream";
        let fits = |headers: &HeaderMap| headers_fit(headers, true, REVISION, false);
        assert!(fits(&stateless("application/json", both)));
        assert!(fits(&stateless("Application/JSON; charset=utf-8", both)));
        assert!(fits(&stateless(
            "application/json",
            "text/event-stream;q=0.9, APPLICATION/json"
        )));
        assert!(!fits(&stateless("application/json-seq", both)));
        assert!(!fits(&stateless(
            "application/json",
            "application/jsonl, text/event-stream"
        )));
        assert!(!fits(&stateless("application/json", "application/json")));
        let mut on_session = stateless("application/json", both);
        assert!(
            !headers_fit(&on_session, true, REVISION, true),
            "no session named"
        );
        on_session.remove("mcp-method");
        on_session.insert("mcp-session-id", "s1".parse().unwrap());
        assert!(headers_fit(&on_session, true, REVISION, true));
        assert!(
            !headers_fit(&on_session, true, "2025-11-25", true),
            "another revision"
        );
    }

    /// A body is taken only as rmcp would read it: objects only (serde's
    /// derived readers also take an array of the fields' values), every
    /// `_meta` value checked as a `Value` would be (a number out of range,
    /// a lone surrogate, nesting past serde_json's bound), a key given
    /// twice read as its last.
    #[test]
    fn a_body_is_taken_only_as_rmcp_would_read_it() {
        let mut headers = stateless("application/json", "application/json, text/event-stream");
        headers.insert("mcp-name", "demo__echo".parse().unwrap());
        let meta = r#""io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}"#;
        let call = |params: &str| {
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#)
        };
        let plain = |extra: &str| {
            call(&format!(
                r#"{{"name":"demo__echo","arguments":{{"text":"hi"}},"_meta":{{{meta}{extra}}}}}"#
            ))
        };
        let taken = |body: &str| parse(body.as_bytes(), &headers).is_some();
        assert!(taken(&plain("")));
        assert!(taken(&plain(r#","io.modelcontextprotocol/logLevel":null"#)));
        assert!(taken(&plain(r#","x":[1,{"y":"\u00e9"}]"#)));
        let traced = plain(r#","traceparent":"00-a-b-01","traceparent":"00-c-d-01""#);
        let call_meta = parse(traced.as_bytes(), &headers).expect("taken").meta;
        assert_eq!(
            call_meta.traceparent.as_deref(),
            Some("00-c-d-01"),
            "the last"
        );
        let deep = format!("{}1{}", "[".repeat(130), "]".repeat(130));
        for (refused, why) in [
            (
                r#"["2.0",1,"tools/call",{"name":"demo__echo"}]"#.to_string(),
                "an array body",
            ),
            (call(r#"["demo__echo",null,{}]"#), "array params"),
            (
                call(r#"{"name":"demo__echo","_meta":[null,null,null,"2026-07-28",{},null,null]}"#),
                "an array _meta",
            ),
            (plain(r#","x":1e400"#), "a number out of range"),
            (plain(r#","x":"\ud800""#), "a lone surrogate"),
            (plain(&format!(r#","x":{deep}"#)), "nesting past the bound"),
            (
                plain(r#","io.modelcontextprotocol/logLevel":"debug""#),
                "log messages",
            ),
            (plain(r#","progressToken":[1]"#), "a token of another shape"),
            (
                plain(r#","io.modelcontextprotocol/clientInfo":{"name":1e400}"#),
                "bad clientInfo",
            ),
        ] {
            assert!(!taken(&refused), "{why}: {refused}");
        }
        let session = |meta: &str| {
            let body = call(&format!(r#"{{"name":"demo__echo","_meta":{meta}}}"#));
            parse_on_session(body.as_bytes()).is_some()
        };
        assert!(session("null") && session(r#"{"progressToken":"p"}"#));
        assert!(!session(
            r#"{"io.modelcontextprotocol/clientInfo":{"name":"x"}}"#
        ));
        assert!(!session("[]"));
    }

    /// Read in one pass, the head is taken only as rmcp would answer it the
    /// same: each header that must be one is one, and none that rmcp checks
    /// or answers otherwise is there.
    #[test]
    fn a_head_is_taken_only_when_rmcp_would_answer_it_the_same() {
        let both = "application/json, text/event-stream";
        let fits = |headers: &HeaderMap| headers_fit(headers, true, REVISION, false);
        let with = |name: &'static str, value: &str| {
            let mut headers = stateless("application/json", both);
            headers.append(name, value.parse().unwrap());
            headers
        };
        assert!(fits(&stateless("application/json", both)));
        for (name, value, why) in [
            ("origin", "http://127.0.0.1", "an Origin rmcp checks"),
            ("last-event-id", "1", "a resumed stream"),
            ("mcp-param-region", "eu", "a parameter header"),
            ("mcp-session-id", "s1", "a session on a stateless request"),
            ("mcp-method", "tools/call", "a method twice"),
            ("mcp-protocol-version", REVISION, "a revision twice"),
            ("content-type", "application/json", "a body type twice"),
            ("host", "127.0.0.1:8766", "a Host twice"),
        ] {
            assert!(!fits(&with(name, value)), "{why}");
        }
        let mut listed = stateless("application/json", "text/event-stream");
        listed.append("accept", "application/json".parse().unwrap());
        assert!(fits(&listed), "Accept over two lines");
        let mut other_method = stateless("application/json", both);
        other_method.insert("mcp-method", "tools/list".parse().unwrap());
        assert!(!fits(&other_method));
        let mut away = stateless("application/json", both);
        away.insert("host", "example.com".parse().unwrap());
        assert!(!fits(&away), "a Host rmcp refuses");
        assert!(
            headers_fit(&away, false, REVISION, false),
            "hosts not checked"
        );
    }
}
