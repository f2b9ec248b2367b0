//! JSON-RPC 2.0 envelopes. The daemon parses requests leniently (as a
//! [`serde_json::Value`] first) so that a malformed request gets a precise
//! error instead of a dropped connection.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{ErrorKind, RpcError};

pub const JSONRPC: &str = "2.0";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    pub id: Value,
    pub method: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub params: Value,
}

impl Request {
    pub fn new(id: u64, method: &str, params: impl Serialize) -> Self {
        Request {
            jsonrpc: JSONRPC.to_string(),
            id: Value::from(id),
            method: method.to_string(),
            params: serde_json::to_value(params).unwrap_or(Value::Null),
        }
    }

    /// Validates a decoded JSON value as a request. On failure returns the id
    /// (when one could be read) and the error to answer with.
    pub fn from_value(value: Value) -> Result<Request, (Value, RpcError)> {
        let id = value.get("id").cloned().unwrap_or(Value::Null);
        let Value::Object(obj) = &value else {
            return Err((
                Value::Null,
                RpcError::new(ErrorKind::InvalidRequest, "a request must be a JSON object"),
            ));
        };
        let invalid = |msg: &str| (id.clone(), RpcError::new(ErrorKind::InvalidRequest, msg));
        if obj.get("jsonrpc").and_then(Value::as_str) != Some(JSONRPC) {
            return Err(invalid("\"jsonrpc\" must be \"2.0\""));
        }
        match obj.get("id") {
            Some(Value::Number(_)) | Some(Value::String(_)) => {}
            _ => return Err(invalid("\"id\" must be a number or a string")),
        }
        match obj.get("method") {
            Some(Value::String(_)) => {}
            _ => return Err(invalid("\"method\" must be a string")),
        }
        match obj.get("params") {
            None | Some(Value::Null) | Some(Value::Object(_)) | Some(Value::Array(_)) => {}
            _ => return Err(invalid("\"params\" must be an object or an array")),
        }
        serde_json::from_value(value)
            .map_err(|e| (id, RpcError::new(ErrorKind::InvalidRequest, e.to_string())))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Self {
        Response {
            jsonrpc: JSONRPC.to_string(),
            id,
            result: Some(result),
            error: None,
        }
    }

    pub fn err(id: Value, error: RpcError) -> Self {
        Response {
            jsonrpc: JSONRPC.to_string(),
            id,
            result: None,
            error: Some(error),
        }
    }
}

/// A message without an id, sent by the daemon while a request is running
/// (progress) or on a subscription (events).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    pub jsonrpc: String,
    pub method: String,
    #[serde(default)]
    pub params: Value,
}

impl Notification {
    pub fn new(method: &str, params: impl Serialize) -> Self {
        Notification {
            jsonrpc: JSONRPC.to_string(),
            method: method.to_string(),
            params: serde_json::to_value(params).unwrap_or(Value::Null),
        }
    }
}

/// What a client can receive on the socket.
#[derive(Debug, Clone)]
pub enum Incoming {
    Response(Response),
    Notification(Notification),
}

impl Incoming {
    pub fn parse(line: &str) -> Result<Incoming, serde_json::Error> {
        let value: Value = serde_json::from_str(line)?;
        if value.get("id").is_some() && value.get("method").is_none() {
            Ok(Incoming::Response(serde_json::from_value(value)?))
        } else {
            Ok(Incoming::Notification(serde_json::from_value(value)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_each_malformed_envelope_with_its_reason() {
        let cases = [
            (json!([1, 2]), "JSON object"),
            (json!({"id": 1, "method": "x"}), "jsonrpc"),
            (json!({"jsonrpc": "2.0", "method": "x"}), "\"id\""),
            (json!({"jsonrpc": "2.0", "id": 1}), "\"method\""),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "x", "params": 3}),
                "\"params\"",
            ),
        ];
        for (value, needle) in cases {
            let (_, err) = Request::from_value(value.clone()).unwrap_err();
            assert_eq!(err.kind(), Some(ErrorKind::InvalidRequest), "{value}");
            assert!(err.message.contains(needle), "{value}: {}", err.message);
        }
    }

    #[test]
    fn accepts_a_well_formed_request_and_keeps_its_id() {
        let req = Request::from_value(json!({"jsonrpc":"2.0","id":"a","method":"status"})).unwrap();
        assert_eq!(req.id, json!("a"));
        assert_eq!(req.method, "status");
        assert!(req.params.is_null());
    }

    #[test]
    fn error_kind_strings_match_serde() {
        for kind in [
            ErrorKind::BundleNotFound,
            ErrorKind::GateRefused,
            ErrorKind::StartFailed,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.as_str()));
        }
    }
}
