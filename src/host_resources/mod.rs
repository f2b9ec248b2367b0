//! The `ai.nimblebrain/host-resources` extension: what the daemon advertises
//! in `initialize`, the method names a bundle calls back with, the error
//! codes of the wire contract (docs/host-resources.md), and the request
//! handling that the WorkspaceActor runs for its bundles.
//!
//! The workspace FileStore does not exist yet (it lands with the
//! host-resources issue), so every workspace's file set is empty: `read`
//! answers "Resource not found" and `list` an empty list — exactly what the
//! contract says for an empty store. Scheme and cursor checks are already
//! the contract's.

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
    pub reply: ractor::RpcReplyPort<Result<Value, HostError>>,
}

/// Answers one host-resources request for `requester`.
pub fn handle(
    requester: &Requester,
    method: &str,
    params: Option<&Value>,
) -> Result<Value, HostError> {
    let empty = Map::new();
    let params = params.and_then(Value::as_object).unwrap_or(&empty);
    match method {
        METHOD_READ => read(requester, params),
        METHOD_LIST => list(params),
        other => Err(HostError {
            code: codes::METHOD_NOT_FOUND,
            message: "Method not found".into(),
            data: json!({ "method": other }),
        }),
    }
}

fn read(requester: &Requester, params: &Map<String, Value>) -> Result<Value, HostError> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(HostError::invalid(
            "uri is required",
            json!({ "field": "uri" }),
        ));
    };
    let scheme = uri.split_once("://").map(|(s, _)| s).unwrap_or("");
    if !SCHEMES.contains(&scheme) {
        return Err(HostError::invalid(
            "Unsupported URI scheme",
            json!({ "uri": uri, "supported": SCHEMES }),
        ));
    }
    tracing::debug!(workspace = %requester.workspace, bundle = %requester.bundle, %uri,
        "host-resources read: no such file in the workspace store");
    Err(HostError::not_found(uri))
}

fn list(params: &Map<String, Value>) -> Result<Value, HostError> {
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
    if let Some(filter) = filter {
        if let Some(scheme) = filter.get("scheme").and_then(Value::as_str) {
            if !SCHEMES.contains(&scheme) {
                return Err(HostError::invalid(
                    "Unsupported URI scheme",
                    json!({ "scheme": scheme, "supported": SCHEMES }),
                ));
            }
        }
        if let Some(tags) = filter.get("tags") {
            let ok = tags
                .as_array()
                .is_some_and(|a| a.iter().all(Value::is_string));
            if !ok {
                return Err(HostError::invalid(
                    "filter.tags must be an array of strings",
                    json!({ "receivedType": json_type(tags) }),
                ));
            }
        }
    }
    Ok(json!({ "resources": [] }))
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

    fn who() -> Requester {
        Requester {
            workspace: "w".into(),
            bundle: "b".into(),
        }
    }

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
    fn read_checks_scheme_then_answers_not_found() {
        let e = handle(&who(), METHOD_READ, Some(&json!({"uri":"http://x"}))).unwrap_err();
        assert_eq!(
            (e.code, e.data),
            (-32602, json!({"uri":"http://x","supported":["files"]}))
        );
        let e = handle(
            &who(),
            METHOD_READ,
            Some(&json!({"uri":"files://fl_0123456789abcdef01234567"})),
        )
        .unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (-32002, "Resource not found"));
    }

    #[test]
    fn list_validates_cursor_and_tags() {
        let e = handle(&who(), METHOD_LIST, Some(&json!({"cursor":"abc"}))).unwrap_err();
        assert_eq!((e.code, e.data), (-32602, json!({"cursor":"abc"})));
        let e = handle(
            &who(),
            METHOD_LIST,
            Some(&json!({"_meta":{"filter":{"tags":"a"}}})),
        )
        .unwrap_err();
        assert_eq!(e.data, json!({"receivedType":"string"}));
        let ok = handle(
            &who(),
            METHOD_LIST,
            Some(&json!({"_meta":{"filter":{"tags":["a"]}}})),
        )
        .unwrap();
        assert_eq!(ok, json!({"resources":[]}));
    }
}
