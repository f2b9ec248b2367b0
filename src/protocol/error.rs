//! Errors that cross the control socket: a JSON-RPC error object whose
//! `data.kind` is a stable snake_case [`ErrorKind`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Stable, machine-readable error kinds. Scripts match on these, so a
/// variant is never renamed; new ones may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    ParseError,
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    HelloRequired,
    ProtocolMismatch,
    PermissionDenied,
    BundleNotFound,
    /// A `.mcpb` archive breaks a rule (traversal, links out, a zip bomb…).
    ArchiveRefused,
    /// No bundle was ever installed in that workspace.
    WorkspaceNotFound,
    AlreadyInstalled,
    /// Uninstall of a bundle that a watched folder provides.
    WatchedBundle,
    InvalidName,
    ManifestInvalid,
    GateRefused,
    SandboxRefused,
    /// Someone other than its owner (and root) may write what the bundle
    /// runs, or it is unsigned under `signatures = "require"`.
    BundleUntrusted,
    StartFailed,
    NotReady,
    ToolCallFailed,
    FileNotFound,
    FileError,
    Timeout,
    ShuttingDown,
    Internal,
    /// A `configure` value does not fit its user_config declaration.
    InvalidConfigValue,
    /// The bundle waits for `configure` (a required key has no value).
    NeedsConfig,
    /// The bundle waits for `bundlevisor auth`.
    NeedsAuth,
    /// An OAuth step failed (token endpoint refused, state mismatch, ...).
    AuthFailed,
    /// The request was cancelled (`cancel`).
    Cancelled,
    /// The bundle has no such tool (or the config excludes it).
    ToolNotFound,
    /// A bundle (or the resolver) answered an MCP error: `mcp_code`, `mcp_data`.
    McpError,
    /// `[control] max_connections` connections are open already.
    TooManyConnections,
    /// `credentials.rotate_key` could not replace the key (the message says
    /// what was left as it was).
    KeyRotationFailed,
    /// `token.revoke` of a name or id no token has.
    TokenNotFound,
    /// `token.create` with a name another token has.
    TokenExists,
}

impl ErrorKind {
    /// The JSON-RPC error code used for this kind.
    pub fn code(self) -> i64 {
        match self {
            ErrorKind::ParseError => -32700,
            ErrorKind::InvalidRequest | ErrorKind::HelloRequired => -32600,
            ErrorKind::MethodNotFound => -32601,
            ErrorKind::InvalidParams | ErrorKind::InvalidName | ErrorKind::InvalidConfigValue => {
                -32602
            }
            ErrorKind::Internal => -32603,
            _ => -32000,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ParseError => "parse_error",
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::MethodNotFound => "method_not_found",
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::HelloRequired => "hello_required",
            ErrorKind::ProtocolMismatch => "protocol_mismatch",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::BundleNotFound => "bundle_not_found",
            ErrorKind::ArchiveRefused => "archive_refused",
            ErrorKind::WorkspaceNotFound => "workspace_not_found",
            ErrorKind::AlreadyInstalled => "already_installed",
            ErrorKind::WatchedBundle => "watched_bundle",
            ErrorKind::InvalidName => "invalid_name",
            ErrorKind::ManifestInvalid => "manifest_invalid",
            ErrorKind::GateRefused => "gate_refused",
            ErrorKind::SandboxRefused => "sandbox_refused",
            ErrorKind::BundleUntrusted => "bundle_untrusted",
            ErrorKind::StartFailed => "start_failed",
            ErrorKind::NotReady => "not_ready",
            ErrorKind::ToolCallFailed => "tool_call_failed",
            ErrorKind::FileNotFound => "file_not_found",
            ErrorKind::FileError => "file_error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::InvalidConfigValue => "invalid_config_value",
            ErrorKind::NeedsConfig => "needs_config",
            ErrorKind::NeedsAuth => "needs_auth",
            ErrorKind::AuthFailed => "auth_failed",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::ToolNotFound => "tool_not_found",
            ErrorKind::McpError => "mcp_error",
            ErrorKind::TooManyConnections => "too_many_connections",
            ErrorKind::KeyRotationFailed => "key_rotation_failed",
            ErrorKind::TokenNotFound => "token_not_found",
            ErrorKind::TokenExists => "token_exists",
            ErrorKind::Internal => "internal",
        }
    }
}

/// The `data` member of an error: the kind plus kind-specific details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorData {
    pub kind: ErrorKind,
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// A JSON-RPC 2.0 error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ErrorData>,
}

impl RpcError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RpcError {
            code: kind.code(),
            message: message.into(),
            data: Some(ErrorData {
                kind,
                details: Map::new(),
            }),
        }
    }

    /// Adds a detail field to `data`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        if let Some(data) = self.data.as_mut() {
            data.details.insert(key.to_string(), value.into());
        }
        self
    }

    pub fn kind(&self) -> Option<ErrorKind> {
        self.data.as_ref().map(|d| d.kind)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RpcError {}
