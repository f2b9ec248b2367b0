//! The `ai.nimblebrain/host-resources` extension: what the daemon advertises
//! in `initialize`, the method names a bundle calls back with, the error
//! codes of the wire contract (docs/host-resources.md), and the request
//! handling that the WorkspaceActor runs for its bundles.
//!
//! A request goes: [`parse`] (scheme allowlist, parameter checks) → the
//! access decision ([`access::project_access`], audited) → the
//! requester's rate bucket ([`rate`], in the WorkspaceActor) → [`execute`]
//! against the workspace's FileStore, on the blocking pool (size cap decided
//! from metadata before any byte is read).

pub mod access;
pub mod rate;

use serde_json::{json, Map, Value};

use crate::config::HostResourcesConfig;

/// The extension key advertised under `capabilities.extensions`.
pub const EXTENSION: &str = "ai.nimblebrain/host-resources";
pub const METHOD_READ: &str = "ai.nimblebrain/resources/read";
pub const METHOD_LIST: &str = "ai.nimblebrain/resources/list";
/// URI schemes a bundle may read.
pub const SCHEMES: &[&str] = &["files"];

/// Host capabilities this daemon provides (checked by the install gate).
pub const PROVIDED_CAPABILITIES: &[&str] = &[EXTENSION];

/// Error codes of the wire contract.
pub mod codes {
    pub const NOT_FOUND: i32 = -32002;
    pub const INVALID_PARAMS: i32 = -32602;
    pub const RATE_LIMITED: i32 = -32004;
    pub const TOO_LARGE: i32 = -32005;
    pub const METHOD_NOT_FOUND: i32 = -32601;
}

/// The capability object advertised in `initialize`.
pub fn capability(config: &HostResourcesConfig) -> Map<String, Value> {
    let value = json!({
        "read": { "enabled": true, "range": false, "maxSize": config.max_read_bytes },
        "list": { "enabled": true },
        "write": { "enabled": false },
        "schemes": SCHEMES,
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("capability literal is an object"),
    }
}

/// A contract error: code, message and `error.data`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostError {
    pub code: i32,
    pub message: String,
    pub data: Value,
}

impl HostError {
    pub fn not_found(uri: &str) -> Self {
        HostError {
            code: codes::NOT_FOUND,
            message: "Resource not found".into(),
            data: json!({ "uri": uri }),
        }
    }

    fn invalid(message: &str, data: Value) -> Self {
        HostError {
            code: codes::INVALID_PARAMS,
            message: message.into(),
            data,
        }
    }
}

/// Who is asking: bound when the bundle's connection was built, never taken
/// from the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    pub workspace: String,
    pub bundle: String,
}

/// A host-resources request from a bundle, as sent to its WorkspaceActor.
/// The requester was bound when the bundle's connection was built.
pub struct HostRequest {
    pub requester: Requester,
    pub method: String,
    pub params: Option<Value>,
    pub reply: ractor::RpcReplyPort<Result<Answer, HostError>>,
}

/// An answer's `result`, encoded as JSON once. A kept read answer is
/// written to every bundle that reads the file as these bytes, never
/// encoded again (a 4 KiB text costs more to escape than the rest of the
/// read; docs/performance.md).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer(std::sync::Arc<str>);

impl Answer {
    pub fn encode(value: &Value) -> Answer {
        Answer(value.to_string().into())
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        &self.0
    }

    /// The answer as a value again (the rmcp path of remote bundles, tests).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).expect("an Answer holds JSON it encoded")
    }
}

/// A parsed, scheme-checked request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `id` is None when the URI cannot name a file (it is then not found).
    Read { uri: String, id: Option<String> },
    List {
        mime_type: Option<String>,
        tags: Vec<String>,
    },
}

impl Request {
    /// The resource and action, for the access decision.
    pub fn target(&self) -> (&str, access::Action) {
        match self {
            Request::Read { uri, .. } => (uri, access::Action::Read),
            Request::List { .. } => ("files://*", access::Action::List),
        }
    }
}

/// Checks a request's method and parameters (no store access).
pub fn parse(method: &str, params: Option<&Value>) -> Result<Request, HostError> {
    let empty = Map::new();
    let params = params.and_then(Value::as_object).unwrap_or(&empty);
    match method {
        METHOD_READ => {
            let Some(uri) = params.get("uri").and_then(Value::as_str) else {
                return Err(HostError::invalid(
                    "uri is required",
                    json!({ "field": "uri" }),
                ));
            };
            let (scheme, rest) = uri.split_once("://").unwrap_or(("", uri));
            if !SCHEMES.contains(&scheme) {
                return Err(HostError::invalid(
                    "Unsupported URI scheme",
                    json!({ "uri": uri, "supported": SCHEMES }),
                ));
            }
            // Only the exact id shape can name a file: traversal-looking or
            // encoded URIs simply name nothing.
            let id = Some(rest.to_string()).filter(|id| crate::files::is_file_id(id));
            Ok(Request::Read {
                uri: uri.to_string(),
                id,
            })
        }
        METHOD_LIST => {
            if let Some(cursor) = params.get("cursor").filter(|c| !c.is_null()) {
                if cursor.as_str() != Some("") {
                    return Err(HostError::invalid(
                        "Pagination is not supported in this version",
                        json!({ "cursor": cursor }),
                    ));
                }
            }
            let filter = params
                .get("_meta")
                .and_then(|m| m.get("filter"))
                .and_then(Value::as_object);
            let mut out = Request::List {
                mime_type: None,
                tags: Vec::new(),
            };
            if let (Some(filter), Request::List { mime_type, tags }) = (filter, &mut out) {
                if let Some(scheme) = filter.get("scheme").and_then(Value::as_str) {
                    if !SCHEMES.contains(&scheme) {
                        return Err(HostError::invalid(
                            "Unsupported URI scheme",
                            json!({ "scheme": scheme, "supported": SCHEMES }),
                        ));
                    }
                }
                *mime_type = filter
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(t) = filter.get("tags").filter(|t| !t.is_null()) {
                    let list = t.as_array().filter(|a| a.iter().all(Value::is_string));
                    let Some(list) = list else {
                        return Err(HostError::invalid(
                            "filter.tags must be an array of strings",
                            json!({ "receivedType": json_type(t) }),
                        ));
                    };
                    *tags = list
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect();
                }
            }
            Ok(out)
        }
        other => Err(HostError {
            code: codes::METHOD_NOT_FOUND,
            message: "Method not found".into(),
            data: json!({ "method": other }),
        }),
    }
}

/// Runs a parsed request against the requester's workspace store. Blocking.
pub fn execute(
    store: &crate::files::FileStore,
    max_read_bytes: u64,
    requester: &Requester,
    request: Request,
) -> Result<Value, HostError> {
    match request {
        Request::Read { uri, id } => {
            let Some(id) = id else {
                tracing::info!(workspace = %requester.workspace, bundle = %requester.bundle, %uri, "host-resources read: not a file id");
                return Err(HostError::not_found(&uri));
            };
            let record = match store.get(&id) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    let reason = store.absence_reason(&id);
                    tracing::info!(workspace = %requester.workspace, bundle = %requester.bundle, %uri, "host-resources read answered not found: {reason}");
                    return Err(HostError::not_found(&uri));
                }
                Err(e) => {
                    tracing::error!(workspace = %requester.workspace, bundle = %requester.bundle, %uri, "host-resources read: {e}");
                    return Err(HostError::not_found(&uri));
                }
            };
            read_record(store, max_read_bytes, requester, &uri, &id, &record)
        }
        Request::List { mime_type, tags } => {
            let files = store.list().map_err(|e| {
                tracing::error!(workspace = %requester.workspace, bundle = %requester.bundle, "host-resources list: {e}");
                HostError::not_found("")
            })?;
            let resources: Vec<Value> = files
                .into_iter()
                .filter(|f| mime_type.as_deref().is_none_or(|m| f.mime_type == m))
                .filter(|f| tags.iter().all(|t| f.tags.contains(t)))
                .map(|f| json!({ "uri": format!("files://{}", f.id), "name": f.filename, "mimeType": f.mime_type, "size": f.size }))
                .collect();
            Ok(json!({ "resources": resources }))
        }
    }
}

/// A read whose record is known: the size limit, then the bytes. Blocking
/// (the bytes come from the blob file).
fn read_record(
    store: &crate::files::FileStore,
    max_read_bytes: u64,
    requester: &Requester,
    uri: &str,
    id: &str,
    record: &crate::protocol::FileRecord,
) -> Result<Value, HostError> {
    use base64::Engine;
    if record.size > max_read_bytes {
        return Err(HostError {
            code: codes::TOO_LARGE,
            message: "Response too large".into(),
            data: json!({ "uri": uri, "size": record.size, "maxSize": max_read_bytes }),
        });
    }
    let bytes = store.read(id).map_err(|e| {
        tracing::error!(workspace = %requester.workspace, bundle = %requester.bundle, %uri, "host-resources read: {e}");
        HostError::not_found(uri)
    })?;
    let content = if crate::files::mime::is_text_mime(&record.mime_type) {
        // Valid UTF-8 (the usual case) is checked at memory speed; only
        // invalid text takes the slow replacing path.
        let text = String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        json!({ "uri": uri, "mimeType": record.mime_type, "text": text })
    } else {
        json!({ "uri": uri, "mimeType": record.mime_type, "blob": base64::engine::general_purpose::STANDARD.encode(&bytes) })
    };
    Ok(json!({ "contents": [content] }))
}

/// The request answered without touching the database: a read whose
/// record is cached (and small enough to read on the caller's thread), or
/// a uri that names no file. None: it needs the blocking pool.
pub fn execute_cached(
    store: &crate::files::FileStore,
    max_read_bytes: u64,
    inline_max: u64,
    requester: &Requester,
    request: &Request,
) -> Option<Result<Answer, HostError>> {
    match request {
        Request::Read { uri, id: None } => {
            tracing::info!(workspace = %requester.workspace, bundle = %requester.bundle, %uri, "host-resources read: not a file id");
            Some(Err(HostError::not_found(uri)))
        }
        Request::Read { uri, id: Some(id) } => {
            let (size, answer) = store.cached_answer(id)?;
            if size > inline_max {
                return None;
            }
            // The answer names the uri asked for: kept only for the plain one.
            let plain = uri.strip_prefix("files://") == Some(id.as_str());
            if let Some(answer) = answer.filter(|_| plain && size <= max_read_bytes) {
                return Some(Ok(Answer(answer)));
            }
            let record = store.cached(id)?;
            let read = read_record(store, max_read_bytes, requester, uri, id, &record)
                .map(|value| Answer::encode(&value));
            if let (Ok(answer), true) = (&read, plain) {
                store.keep_answer(id, answer.0.clone(), size as usize);
            }
            Some(read)
        }
        Request::List { .. } => None,
    }
}

/// The error answered when a requester's bucket is empty.
pub fn rate_limited(retry_after_ms: u64) -> HostError {
    HostError {
        code: codes::RATE_LIMITED,
        message: "Rate limited".into(),
        data: json!({ "retryAfterMs": retry_after_ms }),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_matches_the_contract() {
        let cap = capability(&HostResourcesConfig::default());
        assert_eq!(
            Value::Object(cap),
            json!({"read":{"enabled":true,"range":false,"maxSize":10485760},
                   "list":{"enabled":true},"write":{"enabled":false},"schemes":["files"]})
        );
    }

    #[test]
    fn read_checks_the_scheme_and_only_exact_ids_name_files() {
        let e = parse(METHOD_READ, Some(&json!({"uri":"http://x"}))).unwrap_err();
        assert_eq!(
            (e.code, e.data),
            (-32602, json!({"uri":"http://x","supported":["files"]}))
        );
        let ok = parse(
            METHOD_READ,
            Some(&json!({"uri":"files://fl_0123456789abcdef01234567"})),
        )
        .unwrap();
        assert_eq!(
            ok,
            Request::Read {
                uri: "files://fl_0123456789abcdef01234567".into(),
                id: Some("fl_0123456789abcdef01234567".into())
            }
        );
        for uri in [
            "files://../state.db",
            "files://%2e%2e/x",
            "files://fl_0123456789ABCDEF01234567",
            "files://",
        ] {
            assert!(
                matches!(
                    parse(METHOD_READ, Some(&json!({"uri": uri}))).unwrap(),
                    Request::Read { id: None, .. }
                ),
                "{uri}"
            );
        }
    }

    #[test]
    fn list_validates_cursor_and_tags() {
        let e = parse(METHOD_LIST, Some(&json!({"cursor":"abc"}))).unwrap_err();
        assert_eq!((e.code, e.data), (-32602, json!({"cursor":"abc"})));
        let e = parse(METHOD_LIST, Some(&json!({"_meta":{"filter":{"tags":"a"}}}))).unwrap_err();
        assert_eq!(e.data, json!({"receivedType":"string"}));
        let e = parse(
            METHOD_LIST,
            Some(&json!({"_meta":{"filter":{"tags":["a", 1]}}})),
        )
        .unwrap_err();
        assert_eq!(e.data, json!({"receivedType":"array"}));
        let ok = parse(
            METHOD_LIST,
            Some(&json!({"_meta":{"filter":{"mimeType":"text/csv","tags":["a"]}}})),
        )
        .unwrap();
        assert_eq!(
            ok,
            Request::List {
                mime_type: Some("text/csv".into()),
                tags: vec!["a".into()]
            }
        );
    }

    #[test]
    fn execute_reads_text_and_binary_truthfully_and_filters_lists() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Store::open(&dir.path().join("state.db")).unwrap();
        let store = crate::files::FileStore::open(dir.path(), "w", db).unwrap();
        let who = Requester {
            workspace: "w".into(),
            bundle: "b".into(),
        };
        let csv = dir.path().join("a.csv");
        std::fs::write(&csv, "x,y\n").unwrap();
        let png = dir.path().join("p.png");
        std::fs::write(&png, b"\x89PNG\r\n\x1a\n\0\x01").unwrap();
        let a = store
            .put(&csv, None, vec!["t1".into(), "t2".into()], None)
            .unwrap();
        let p = store.put(&png, None, vec!["t1".into()], None).unwrap();

        let read = |id: &str| {
            execute(
                &store,
                1000,
                &who,
                parse(METHOD_READ, Some(&json!({"uri": format!("files://{id}")}))).unwrap(),
            )
        };
        assert_eq!(
            read(&a.id).unwrap(),
            json!({"contents":[{"uri":format!("files://{}", a.id),"mimeType":"text/csv","text":"x,y\n"}]})
        );
        assert_eq!(
            read(&p.id).unwrap()["contents"][0]["blob"],
            "iVBORw0KGgoAAQ=="
        );
        assert_eq!(
            read("fl_0123456789abcdef01234567").unwrap_err().code,
            -32002
        );
        let big = execute(
            &store,
            3,
            &who,
            parse(
                METHOD_READ,
                Some(&json!({"uri": format!("files://{}", a.id)})),
            )
            .unwrap(),
        )
        .unwrap_err();
        assert_eq!(
            (
                big.code,
                big.data["size"].as_u64(),
                big.data["maxSize"].as_u64()
            ),
            (-32005, Some(4), Some(3))
        );

        let list = |params: Value| {
            execute(
                &store,
                1000,
                &who,
                parse(METHOD_LIST, Some(&params)).unwrap(),
            )
            .unwrap()
        };
        assert_eq!(list(json!({}))["resources"].as_array().unwrap().len(), 2);
        let both = list(json!({"_meta":{"filter":{"tags":["t1","t2"]}}}));
        assert_eq!(
            both["resources"],
            json!([{"uri":format!("files://{}", a.id),"name":"a.csv","mimeType":"text/csv","size":4}])
        );
        assert_eq!(
            list(json!({"_meta":{"filter":{"mimeType":"image/png"}}}))["resources"][0]["name"],
            "p.png"
        );
        assert!(
            list(json!({"_meta":{"filter":{"mimeType":"text/plain"}}}))["resources"]
                .as_array()
                .unwrap()
                .is_empty()
        );
    }

    /// Issue 16, finding 6: the event loop's path never asks the database:
    /// a record that is not cached sends the read to the blocking pool.
    #[test]
    fn a_cached_read_never_asks_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Store::open(&dir.path().join("state.db")).unwrap();
        let store = crate::files::FileStore::open(dir.path(), "w", db).unwrap();
        let src = dir.path().join("a.txt");
        std::fs::write(&src, "hello").unwrap();
        let record = store.put(&src, None, vec![], None).unwrap();
        let requester = Requester {
            workspace: "w".into(),
            bundle: "b".into(),
        };
        let uri = format!("files://{}", record.id);
        let read = parse(METHOD_READ, Some(&json!({ "uri": uri }))).unwrap();
        assert!(
            execute_cached(&store, 1024, 1024, &requester, &read).is_none(),
            "not cached: the blocking pool's job"
        );
        let list = parse(METHOD_LIST, None).unwrap();
        assert!(execute_cached(&store, 1024, 1024, &requester, &list).is_none());
        // Once the blocking path has looked the record up, it is served inline.
        let slow = execute(&store, 1024, &requester, read.clone()).unwrap();
        let fast = execute_cached(&store, 1024, 1024, &requester, &read).unwrap();
        assert_eq!(fast.unwrap().to_value(), slow);
        // Too large to read inline: the blocking pool again.
        assert!(execute_cached(&store, 1024, 2, &requester, &read).is_none());
    }

    /// Issue 22: a small file's answer is kept, so a repeated read touches
    /// neither the blob nor the text check — and it goes with the file.
    #[test]
    fn a_kept_answer_is_served_until_its_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Store::open(&dir.path().join("state.db")).unwrap();
        let store = crate::files::FileStore::open(dir.path(), "w", db).unwrap();
        let src = dir.path().join("a.txt");
        // Invalid UTF-8 in a text file is replaced, as before.
        std::fs::write(&src, b"caf\xe9 ok").unwrap();
        let record = store.put(&src, None, vec![], Some("text/plain")).unwrap();
        let requester = Requester {
            workspace: "w".into(),
            bundle: "b".into(),
        };
        let uri = format!("files://{}", record.id);
        let read = parse(METHOD_READ, Some(&json!({ "uri": uri }))).unwrap();
        let first = execute(&store, 1024, &requester, read.clone()).unwrap();
        assert_eq!(first["contents"][0]["text"], json!("caf\u{fffd} ok"));
        let inline = execute_cached(&store, 1024, 1024, &requester, &read).unwrap();
        assert_eq!(inline.unwrap().to_value(), first);
        // The blob gone behind the store's back: the kept answer still serves.
        let blob = dir.path().join("files/w").join(&record.id);
        assert!(blob.exists(), "{} is the blob", blob.display());
        std::fs::remove_file(&blob).unwrap();
        let kept = execute_cached(&store, 1024, 1024, &requester, &read).unwrap();
        assert_eq!(kept.unwrap().to_value(), first);
        // Removed through the store: neither the record nor the answer is served.
        std::fs::write(&blob, b"x").unwrap();
        assert!(store.remove(&record.id).unwrap());
        assert!(execute_cached(&store, 1024, 1024, &requester, &read).is_none());
    }
}
