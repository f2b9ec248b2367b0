//! Resumable streams across a daemon restart (issue 34, point 10). A
//! 2025-11-25 agent whose request's stream breaks resumes it with a GET
//! naming the last event id it saw. After a restart the session is gone
//! (404), and a client such as the TypeScript SDK then waits for its own
//! timeout (60 s) for an answer that can never come. So every event id of a
//! request's stream carries the request's JSON-RPC id (`ID#TAG`, the tag
//! the hex of the id's JSON); a resume of a session that no longer exists
//! is answered with that request's error, at once, and the next resume
//! (its id marked `!told`) gets the 404 that tells the client to start a
//! new session. A live session's resume has the tag taken off for rmcp and
//! put back on what it replays.

use axum::body::Bytes;
use axum::http::{header, HeaderValue, Request};
use axum::response::{IntoResponse, Response};

const TOLD: &str = "!told";

/// The tag of a JSON-RPC request's stream: the hex of its id's JSON; None
/// for a body that is not one request (a notification, a response, a
/// batch). The id is taken as the request wrote it (the JSON of a number
/// or a string; decoded, it is the same id).
pub fn tag_of_request(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let head: Head<'_> = serde_json::from_slice(body).ok()?;
    head.method?;
    let id = head.id?.get().as_bytes();
    let mut tag = String::with_capacity(id.len() * 2);
    for b in id {
        tag.push(char::from(HEX[usize::from(b >> 4)]));
        tag.push(char::from(HEX[usize::from(b & 15)]));
    }
    Some(tag)
}

/// A resume (GET with `Last-Event-ID`) of a tagged stream: the tag is
/// taken off the header (rmcp knows its own ids) and returned, to be put
/// back on what is replayed.
fn untag_resume<B>(request: &mut Request<B>) -> Option<String> {
    let last = request.headers().get("last-event-id")?.to_str().ok()?;
    let (id, tag) = last.split_once('#')?;
    let (id, tag) = (id.to_string(), tag.trim_end_matches(TOLD).to_string());
    let value = HeaderValue::from_str(&id).ok()?;
    request.headers_mut().insert("last-event-id", value);
    Some(tag)
}

/// The prefix of the event ids of a stream the daemon answers below rmcp
/// ([`crate::daemon::gateway::direct`]): its events are not kept, so a
/// resume of it is answered here.
pub const UNKEPT: &str = "direct-";

/// The answer to a resume of a session that does not exist (the daemon
/// restarted, or it ended): the error of the request whose stream it was,
/// once; None when there is nothing to say (no tagged id, or said already:
/// then the usual 404).
pub fn lost_request<B>(request: &Request<B>) -> Option<Response> {
    if request.method() != axum::http::Method::GET {
        return None;
    }
    let last = request.headers().get("last-event-id")?.to_str().ok()?;
    let (_, tag) = last.split_once('#')?;
    if tag.ends_with(TOLD) {
        return None;
    }
    tracing::info!(
        "a resumed stream of a session that is gone: its request is answered with an error"
    );
    let lost = "the daemon restarted (or the session ended) while this request ran, and its answer is lost; start a new session (initialize) and send it again";
    request_error(last, tag, lost)
}

/// A resume (GET with `Last-Event-ID`) of a live session: the tag taken
/// off the header and returned, to be put back on what rmcp replays; or,
/// for a stream answered below rmcp (whose events are not kept), its
/// request's error.
pub fn resume<B>(request: &mut Request<B>) -> Result<Option<String>, Box<Response>> {
    let tag = untag_resume(request);
    let last = request.headers().get("last-event-id");
    let unkept = last.is_some_and(|id| id.as_bytes().starts_with(UNKEPT.as_bytes()));
    match (tag, unkept) {
        (Some(tag), true) => {
            let id = last.and_then(|id| id.to_str().ok()).unwrap_or_default();
            let gone = "this request's stream broke before its answer, and it cannot be resumed (the daemon keeps no copy of a call it answers below its MCP service); send the request again";
            let last = format!("{id}#{tag}");
            match request_error(&last, &tag, gone) {
                Some(error) => Err(Box::new(error)),
                None => Ok(Some(tag)),
            }
        }
        (tag, _) => Ok(tag),
    }
}

/// The error of the request whose id is tagged `tag` (the hex of its
/// JSON), as the one event of a stream, its id `last` marked told.
fn request_error(last: &str, tag: &str, message: &str) -> Option<Response> {
    if !tag.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Vec<u8> = (0..tag.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(tag.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let id: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": -32000, "message": message},
    });
    Some(
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            format!("id: {last}{TOLD}\ndata: {error}\n\n"),
        )
            .into_response(),
    )
}

/// The response as sent: a stream keeps `hold` until its end (or the
/// client going away), and its event ids carry `tag`.
pub fn sent(response: Response, hold: impl Send + Sync + 'static, tag: Option<String>) -> Response {
    use futures::StreamExt;
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streamed {
        return response;
    }
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _held = &hold;
        match (&tag, chunk) {
            (Some(tag), Ok(bytes)) => Ok(tagged(bytes, tag)),
            (_, chunk) => chunk,
        }
    });
    Response::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// `bytes` (whole SSE events) with `#tag` after each event id (bytes as
/// they are: no text decoding).
fn tagged(bytes: Bytes, tag: &str) -> Bytes {
    if !bytes.starts_with(b"id:") && !bytes.windows(4).any(|w| w == b"\nid:") {
        return bytes;
    }
    let mut out = Vec::with_capacity(bytes.len() + 2 * (tag.len() + 1));
    for line in bytes.split_inclusive(|b| *b == b'\n') {
        if line.starts_with(b"id:") {
            let end = line
                .iter()
                .rposition(|b| *b != b'\n' && *b != b'\r')
                .map_or(0, |i| i + 1);
            out.extend_from_slice(&line[..end]);
            out.push(b'#');
            out.extend_from_slice(tag.as_bytes());
            out.extend_from_slice(&line[end..]);
        } else {
            out.extend_from_slice(line);
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_events_carry_its_id_and_a_lost_one_is_answered_once() {
        let tag = tag_of_request(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#).unwrap();
        assert_eq!(tag, "37");
        let named = br#"{"jsonrpc":"2.0","id" : "r\u00e9-1", "method":"tools/call"}"#;
        assert_eq!(
            tag_of_request(named).unwrap(),
            "22725c75303065392d3122",
            "the id's JSON as written"
        );
        assert!(
            tag_of_request(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none()
        );
        let events = Bytes::from("id: 0/3\nretry: 3000\ndata: \n\nid: 1/3\ndata: {\"id\":7}\n\n");
        let out = tagged(events, &tag);
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!("id: 0/3#{tag}\nretry: 3000\ndata: \n\nid: 1/3#{tag}\ndata: {{\"id\":7}}\n\n")
        );
        let resume = |last: &str| {
            Request::get("/mcp/default")
                .header("last-event-id", last)
                .body(())
                .unwrap()
        };
        // A live session's resume: rmcp sees its own id.
        let mut live = resume(&format!("1/3#{tag}"));
        assert_eq!(untag_resume(&mut live).as_deref(), Some(tag.as_str()));
        assert_eq!(live.headers()["last-event-id"], "1/3");
        // A gone one: the request's error, once.
        assert!(lost_request(&resume(&format!("1/3#{tag}"))).is_some());
        assert!(lost_request(&resume(&format!("1/3#{tag}{TOLD}"))).is_none());
        assert!(lost_request(&resume("1/3")).is_none());
    }

    /// A live session's resume of a stream answered below rmcp (its events
    /// not kept) gets its request's error at once; rmcp's own streams are
    /// rmcp's to replay.
    #[tokio::test]
    async fn a_resume_of_a_stream_not_kept_is_answered_with_its_requests_error() {
        let tag = tag_of_request(br#"{"jsonrpc":"2.0","id":"c-9","method":"tools/call"}"#).unwrap();
        let resume = |last: &str| {
            Request::get("/mcp/default")
                .header("last-event-id", last)
                .body(())
                .unwrap()
        };
        let mut unkept = resume(&format!("{UNKEPT}2#{tag}"));
        let error = *super::resume(&mut unkept).unwrap_err();
        let body = axum::body::to_bytes(error.into_body(), 1 << 16)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            body.starts_with(&format!("id: {UNKEPT}2#{tag}{TOLD}\n")),
            "{body}"
        );
        let data: serde_json::Value =
            serde_json::from_str(body.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(data["id"], "c-9");
        assert!(data["error"]["message"]
            .as_str()
            .unwrap()
            .contains("send the request again"));
        let mut kept = resume(&format!("4/2#{tag}"));
        assert_eq!(
            super::resume(&mut kept).unwrap().as_deref(),
            Some(tag.as_str())
        );
        assert_eq!(kept.headers()["last-event-id"], "4/2");
    }
}
