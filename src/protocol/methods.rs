//! Method names, parameters and results of the control protocol.
//!
//! `status --json` prints [`StatusResult`] as is: its field names are a
//! documented, stable shape (docs/protocol.md).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Method names.
pub mod method {
    pub const HELLO: &str = "daemon.hello";
    pub const STATUS: &str = "status";
    pub const INSTALL: &str = "bundle.install";
    pub const UNINSTALL: &str = "bundle.uninstall";
    pub const UPGRADE: &str = "bundle.upgrade";
    pub const RESTART: &str = "bundle.restart";
    pub const TOOLS: &str = "bundle.tools";
    pub const CALL: &str = "bundle.call";
    pub const LOGS: &str = "bundle.logs";
    pub const CONFIGURE: &str = "bundle.configure";
    pub const MCP: &str = "bundle.mcp";
    pub const CANCEL: &str = "cancel";
    pub const WORKSPACE_RESOURCES: &str = "workspace.resources";
    pub const PROFILE: &str = "gateway.profile";
    /// The connection becomes a gateway session: after the answer, it
    /// carries MCP (stdio framing) between the agent and the daemon.
    pub const ATTACH: &str = "gateway.attach";
    /// Notification: progress of a `bundle.call` that asked for it.
    pub const CALL_PROGRESS: &str = "call.progress";
    pub const AUTH_BEGIN: &str = "auth.begin";
    pub const AUTH_COMPLETE: &str = "auth.complete";
    pub const FILES_PUT: &str = "files.put";
    pub const FILES_LS: &str = "files.ls";
    pub const FILES_GET: &str = "files.get";
    pub const FILES_RM: &str = "files.rm";
    pub const FILES_CHECKPOINT: &str = "files.checkpoint";
    pub const FILES_ROLLBACK: &str = "files.rollback";
    /// Only served by daemons built with the `fault-injection` feature.
    pub const DEBUG_PANIC: &str = "debug.panic_bundle_actor";
    /// Subscribe to lifecycle events: answered at once, then `event`
    /// notifications until the connection closes.
    pub const EVENTS: &str = "events.subscribe";
    /// Notification sent while an install or restart is in progress.
    pub const PROGRESS: &str = "progress";
    /// Notification carrying a [`super::LifecycleEvent`].
    pub const EVENT: &str = "event";
    /// Notification carrying a [`super::LogLine`] (`bundle.logs` with `follow`).
    pub const LOG: &str = "log";
    /// The daemon's metrics as Prometheus text (`{"text": ...}`).
    pub const METRICS: &str = "metrics";
    /// A one-time sign-in link of the web dashboard, for the peer asking.
    pub const DASHBOARD_LOGIN: &str = "dashboard.login";
    /// Replace the credential encryption key, re-sealing every stored secret.
    pub const ROTATE_KEY: &str = "credentials.rotate_key";
    /// The bundles something is stored for (keys, never values), installed
    /// or not.
    pub const CREDENTIALS_LIST: &str = "credentials.list";
    /// Access tokens of the HTTP gateway: make one (shown once), list, revoke.
    pub const TOKEN_CREATE: &str = "token.create";
    pub const TOKEN_LIST: &str = "token.list";
    pub const TOKEN_REVOKE: &str = "token.revoke";
    /// The audit log's lines: agents' calls through the gateway and
    /// bundles' host-resources decisions, filtered.
    pub const AUDIT: &str = "audit.read";
}

pub const DEFAULT_WORKSPACE: &str = "default";

fn default_workspace() -> String {
    DEFAULT_WORKSPACE.to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelloParams {
    pub protocol: u32,
    #[serde(default)]
    pub client: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelloResult {
    pub protocol: u32,
    pub daemon_version: String,
    pub pid: u32,
}

/// Lifecycle state of a bundle (docs/ARCHITECTURE.md, "Bundle lifecycle").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BundleState {
    /// Process being spawned, `initialize` and `tools/list` in flight.
    Starting,
    /// Initialized and tools listed: calls are served.
    Ready,
    /// Being stopped before a new start (manual restart).
    Restarting,
    /// Not running because of an error; `last_error` says why.
    Failed,
    /// Not running on purpose (uninstall in progress, daemon shutdown).
    Stopped,
    /// Not started: a required user_config value is not set
    /// (`bundlevisor configure`); `last_error` names the keys.
    NeedsConfig,
    /// A remote bundle whose server wants an interactive authorization
    /// (`bundlevisor auth`); never retried on its own.
    NeedsAuth,
    /// A `.mcpb` archive being unpacked before its install: the row is
    /// named after the archive's file until its manifest is read, and
    /// `unpacking` has the progress. (An installed bundle whose new version
    /// unpacks keeps its state and shows `unpacking` beside it.)
    Unpacking,
}

impl BundleState {
    pub const ALL: [BundleState; 8] = [
        BundleState::Starting,
        BundleState::Ready,
        BundleState::Restarting,
        BundleState::Failed,
        BundleState::Stopped,
        BundleState::NeedsConfig,
        BundleState::NeedsAuth,
        BundleState::Unpacking,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BundleState::Starting => "starting",
            BundleState::Ready => "ready",
            BundleState::Restarting => "restarting",
            BundleState::Failed => "failed",
            BundleState::Stopped => "stopped",
            BundleState::NeedsConfig => "needs_config",
            BundleState::NeedsAuth => "needs_auth",
            BundleState::Unpacking => "unpacking",
        }
    }

    /// On its way up (a start runs or is scheduled): worth waiting for.
    pub fn is_coming_up(self) -> bool {
        matches!(
            self,
            BundleState::Starting | BundleState::Restarting | BundleState::Unpacking
        )
    }

    /// Down until an operator acts (`restart`, `configure`, `auth`, a
    /// fixed manifest): waiting for it is pointless.
    pub fn needs_operator(self) -> bool {
        matches!(
            self,
            BundleState::Failed | BundleState::NeedsConfig | BundleState::NeedsAuth
        )
    }
}

/// One bundle's line in `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleStatus {
    pub workspace: String,
    pub name: String,
    /// Manifest version, once a manifest has been read.
    pub version: Option<String>,
    pub state: BundleState,
    pub pid: Option<u32>,
    /// Seconds since the bundle became ready (only while ready).
    pub uptime_secs: Option<u64>,
    /// Number of starts after the first one.
    pub restarts: u32,
    /// Number of tools the bundle listed (0 until ready).
    pub tools: usize,
    /// The bundle's latest failure; kept after it recovered.
    pub last_error: Option<String>,
    /// When `last_error` happened (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<i64>,
    /// The folder or manifest file the bundle was installed from.
    pub source: String,
    /// The sandbox applied to the bundle's process (absent for remote
    /// bundles and before the first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxRecord>,
    /// Only in `status` with `usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// For a bundle installed from a `.mcpb` archive: the archive's SHA-256
    /// and the folder it was unpacked into (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveInfo>,
    /// The MCP revision the daemon speaks with the bundle (while it runs),
    /// and why when it is not the newest (2026-07-28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpRevision>,
    /// While a `.mcpb` archive of the bundle is being unpacked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpacking: Option<UnpackProgress>,
    /// The user_config values that are references to secrets kept
    /// elsewhere, and when the running process's were read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_refs: Vec<SecretRefStatus>,
}

/// A user_config value read from where the operator keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRefStatus {
    pub key: String,
    /// `credential:NAME`, `file:/PATH`, ... (where, never what).
    pub reference: String,
    /// Unix seconds of the read the running process was started with.
    pub resolved_at: i64,
}

/// How far an archive's unpack has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnpackProgress {
    /// Entries written so far.
    pub entries: u64,
    /// Entries in the archive.
    pub of: u64,
}

impl BundleStatus {
    /// A bundle in `state` with nothing else known yet (no process, no
    /// tools, no error), installed from `source`.
    pub fn new(workspace: &str, name: &str, state: BundleState, source: String) -> BundleStatus {
        BundleStatus {
            workspace: workspace.to_string(),
            name: name.to_string(),
            version: None,
            state,
            pid: None,
            uptime_secs: None,
            restarts: 0,
            tools: 0,
            last_error: None,
            last_error_at: None,
            source,
            sandbox: None,
            usage: None,
            archive: None,
            mcp: None,
            unpacking: None,
            secret_refs: Vec::new(),
        }
    }
}

/// The MCP revision spoken with a bundle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpRevision {
    /// `2026-07-28`, `2025-11-25`, …
    pub revision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Where an archive-installed bundle runs from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveInfo {
    pub sha256: String,
    pub unpacked: String,
    /// `not_checked`, `unsigned`, `signed` or `untrusted` (docs/manifest.md).
    pub signature: String,
    /// The signing certificate's subject, when signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

/// A bundle's sandbox, as created (idempotently) for its process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// `WORKSPACE/NAME`.
    pub sandbox_id: String,
    /// Its private folder (`data/` is the bundle's HOME, `tmp/` its TMPDIR).
    pub sandbox_path: String,
    /// What was applied, e.g. `private data dir + no_new_privs + rlimits + landlock ABI 7`.
    pub strategy: String,
    /// `enforced (ABI N): ...`, `unavailable: <why>`, or `off (...)`.
    pub landlock: String,
    /// Whether this start created the folder (false: it existed).
    pub created: bool,
    /// The uid the bundle runs as.
    #[serde(default)]
    pub uid: u32,
    /// What keeps the bundle off the control socket and away from other
    /// bundles, e.g. `own uid 2000000003` or `same uid as the daemon
    /// (allow_same_uid): ...`.
    #[serde(default)]
    pub isolation: String,
    /// The Landlock ABI really enforced (the lower of the kernel's and the
    /// highest this build uses); absent when Landlock is not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock_abi: Option<u32>,
    /// Exactly what Landlock lets the bundle read (files and folders below).
    /// In `status`, only with `paths` (absent: empty, or not asked for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    /// ... write (create, remove, truncate; never device files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
    /// ... execute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub execute: Vec<String>,
    /// What holds the bundle's whole process tree, e.g. `cgroup v2
    /// (…/w-WS/b-NAME, killed with cgroup.kill); limits from memory (v1), …`,
    /// or `process group only: …` where no cgroup is writable.
    #[serde(default)]
    pub containment: String,
    /// The bundle's cgroup, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The cgroup limits in force (`memory.max 67108864`, `pids.max 64`,
    /// `cpu.max 0.5 CPUs`), and those asked for that are not, with why.
    #[serde(default)]
    pub limits: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DaemonInfo {
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub socket: String,
    pub state_dir: String,
    /// Where `GET /metrics` is served (`metrics_addr`), when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    /// Add each bundle's `usage` (memory, tool calls).
    #[serde(default)]
    pub usage: bool,
    /// Add each sandbox's `read`, `write` and `execute` lists (most of a
    /// bundle's line: 2 KiB of the 2.2; a list view does without them).
    #[serde(default)]
    pub paths: bool,
    /// Only this workspace (`workspace_not_found` if it has no bundles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// What a bundle uses, in `status` with `usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Resident memory of its process (absent when not running or remote).
    pub rss_bytes: Option<u64>,
    /// Memory of its whole process tree: its cgroup's, else the resident
    /// memory of its process group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// CPU time of its whole process tree, in microseconds: its cgroup's
    /// (since it started), else its process group's live processes'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_usec: Option<u64>,
    /// Tool calls answered since the daemon started, and how many failed.
    pub calls: u64,
    pub errors: u64,
}

/// `token.create`: a token for one workspace (and one of its profiles).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCreateParams {
    pub workspace: String,
    /// A `[[profile]]` of the daemon's config the token is limited to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The token's name (unique); default `token-ID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds until it expires; never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_secs: Option<u64>,
    /// Its own rules, `KIND:BUNDLE/NAME` globs (docs/gateway.md, "Token
    /// policy"): what it may reach, and what it may not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// A token as listed: never its text or digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub workspace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Unix seconds.
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// Past its expiry (it no longer admits anyone).
    #[serde(default)]
    pub expired: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// `token.create`'s answer: the token's text, shown this once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreated {
    #[serde(flatten)]
    pub info: TokenInfo,
    pub token: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tokens {
    pub tokens: Vec<TokenInfo>,
}

/// `token.revoke`: the token's name or id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRevokeParams {
    pub name: String,
}

/// What `credentials.rotate_key` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RotateKeyResult {
    /// The key file that now holds the new key.
    pub key_file: String,
    /// user_config values and OAuth token sets re-sealed.
    pub values: usize,
    pub token_sets: usize,
}

/// A one-time sign-in to the dashboard (five minutes, one use).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DashboardLink {
    /// The link to open (`http(s)://LISTEN/ui/login?code=…`).
    pub url: String,
    /// The code alone, for the sign-in form.
    pub code: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricsResult {
    /// Prometheus text format 0.0.4.
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusResult {
    pub daemon: DaemonInfo,
    pub workspaces: Vec<String>,
    pub bundles: Vec<BundleStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallParams {
    /// A bundle folder (containing `manifest.json`) or a manifest file.
    pub path: String,
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// Return once the install is recorded instead of waiting for ready.
    #[serde(default)]
    pub no_wait: bool,
}

/// Names one installed bundle.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleRef {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
}

/// `bundle.uninstall`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UninstallParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    /// Also delete the bundle's stored credentials and OAuth tokens (kept
    /// by default, so a reinstall finds them).
    #[serde(default)]
    pub purge: bool,
}

/// `bundle.configure`: set and unset user_config values, then respawn.
/// With neither, nothing changes and the result lists the keys.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigureParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub unset: Vec<String>,
    /// Sensitive keys whose value is read, at each start, from where the
    /// operator keeps it: `KEY` → `credential:NAME`, `file:/PATH`,
    /// `env:NAME`, `pass:PATH`, `gcp:projects/P/secrets/S/versions/V` or
    /// `vault:MOUNT/PATH#FIELD[@VERSION]` (docs/credentials.md).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refs: BTreeMap<String, String>,
}

impl std::fmt::Debug for ConfigureParams {
    // Values may be secrets: show the keys only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigureParams")
            .field("workspace", &self.workspace)
            .field("name", &self.name)
            .field("set", &self.set.keys().collect::<Vec<_>>())
            .field("unset", &self.unset)
            .field("refs", &self.refs)
            .finish()
    }
}

/// `auth.begin`: start the authorization-code flow of a remote bundle; the
/// authorization server will redirect to `redirect_uri` (a loopback
/// listener of the CLI).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthBeginParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    pub redirect_uri: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuthBeginResult {
    /// Open this in a browser.
    pub authorization_url: String,
    /// Must come back unchanged on the redirect.
    pub state: String,
    /// The flow is forgotten after this long.
    pub expires_in_secs: u64,
}

/// `auth.complete`: what the redirect brought back.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthCompleteParams {
    pub state: String,
    #[serde(default)]
    pub code: Option<String>,
    /// The authorization server's `error` (the operator denied, ...).
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_description: Option<String>,
    /// The redirect's `iss` (RFC 9207), checked against the authorization
    /// server when it sends one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
}

impl std::fmt::Debug for AuthCompleteParams {
    // The code is a credential until it is exchanged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthCompleteParams")
            .field("code", &self.code.as_ref().map(|_| "[redacted]"))
            .field("error", &self.error)
            .finish()
    }
}

/// One user_config key of a bundle, as `configure` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigKey {
    pub key: String,
    pub title: String,
    /// `string`, `number`, `boolean`, `directory` or `file`.
    #[serde(rename = "type")]
    pub kind: String,
    pub required: bool,
    pub sensitive: bool,
    /// A value is stored (set with `configure`).
    pub set: bool,
    /// The manifest has a default.
    pub has_default: bool,
    /// The stored value, for non-sensitive keys only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value is read at each start from here (`configure --ref`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigureResult {
    pub keys: Vec<ConfigKey>,
    /// The bundle after the respawn (absent when nothing changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleStatus>,
    /// What the operator should know about the values stored (a `string`
    /// value that names a path the bundle is not granted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Result of install and restart: the bundle once it reached ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BundleResult {
    pub bundle: BundleStatus,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UninstallResult {
    pub workspace: String,
    pub name: String,
    /// It was not installed (gone from its watched folder, or uninstalled
    /// before): only its stored credentials were purged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_installed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsListParams {
    /// One workspace, or every one.
    #[serde(default)]
    pub workspace: Option<String>,
    /// Only bundles that are not installed (their secrets outlived them).
    #[serde(default)]
    pub orphaned: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredCredentials {
    pub bundles: Vec<StoredBundle>,
}

/// What is stored for one bundle: never a value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredBundle {
    pub workspace: String,
    pub name: String,
    /// The user_config keys with a stored value.
    pub keys: Vec<String>,
    /// OAuth tokens are stored for it.
    pub oauth_tokens: bool,
    pub installed: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// One bundle, or every bundle of the workspace.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BundleTools {
    pub workspace: String,
    pub name: String,
    pub state: BundleState,
    /// MCP `Tool` objects exactly as the bundle listed them.
    pub tools: Vec<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolsResult {
    pub bundles: Vec<BundleTools>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    pub tool: String,
    #[serde(default)]
    pub arguments: Option<Map<String, Value>>,
    /// Overrides the daemon's per-call timeout (milliseconds).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Forward the bundle's progress as `call.progress` notifications.
    #[serde(default)]
    pub progress: bool,
    /// A bundle that is starting or restarting is waited for this long
    /// (milliseconds) before the call is refused as `not_ready`.
    #[serde(default)]
    pub wait_ready_ms: Option<u64>,
}

/// `call.progress` notification: progress of the `bundle.call` request `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallProgress {
    pub id: Value,
    pub progress: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `cancel`: cancel the request `id` of this connection (a tool call is
/// cancelled at the bundle with `notifications/cancelled`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelParams {
    pub id: Value,
}

/// `bundle.mcp`: one MCP request passed to a ready bundle as is (only the
/// read-only methods in [`PASSTHROUGH_METHODS`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

/// MCP methods `bundle.mcp` passes through.
pub const PASSTHROUGH_METHODS: &[&str] = &[
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// `workspace.resources`: the workspace's files as MCP resources, answered
/// by the same resolver (and MIME rules) bundles use.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceResourcesParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// `resources/list` or `resources/read`.
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

/// `audit.read`: which audit lines (all filters must match).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// One workspace's (every workspace's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// `token:NAME`, `uid:N`, `bundle:WS/NAME`, or a token's bare name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// `tools/call`, `prompts/get`, `resources/read` (agents), `read`,
    /// `list` (bundles' host-resources requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// `ok`, `tool_error`, `error`, `refused`, `input_required`; `denied`
    /// is any line not permitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// Only lines of the last this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_secs: Option<u64>,
    /// At most this many, the newest (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `audit.read`'s answer: the lines as written (JSON objects), oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntries {
    pub entries: Vec<Value>,
}

/// An access token's text on the wire: never shown by `Debug` (so never in
/// a log line).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenText(pub String);

impl std::fmt::Debug for TokenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenText(<redacted>)")
    }
}

/// `gateway.attach`: the rest of the connection is an MCP session of the
/// workspace's gateway (as `bundlevisor mcp` serves it on stdio).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    #[serde(default)]
    pub profile: Option<String>,
    /// One bundle of the workspace, served exactly as itself (its names
    /// and URIs) instead of the workspace's bundles together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// How long a call waits for a bundle that is starting or restarting.
    #[serde(default)]
    pub wait_ready_ms: Option<u64>,
    /// An access token (`bundlevisor mcp` reads `BUNDLEVISOR_TOKEN`): the
    /// session gets its profile and rules, and the audit its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<TokenText>,
    /// The `initialize` params of a session the agent began with a daemon
    /// that has since restarted: served as already initialized.
    #[serde(default)]
    pub resume: Option<Value>,
    /// The client sends its stdin and stdout (`SCM_RIGHTS`) after the
    /// answer, and the daemon serves the session on them; the connection
    /// then carries only [`HandoverNote`]s.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handover: bool,
}

/// What the daemon tells `bundlevisor mcp` on the connection of a session
/// it serves on the agent's own stdio (`gateway.attach` with `handover`),
/// a JSON line each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandoverNote {
    /// The daemon serves the session on the descriptors from now on.
    Taken,
    /// The descriptors cannot be served (the reason): the client relays.
    Refused(String),
    /// The agent's `initialize` params, for resuming after a restart.
    Initialized(Value),
    /// A request of the agent (its id) has waited a while: if the daemon
    /// goes away before [`HandoverNote::Closed`], the client answers it.
    Open(Value),
    /// The request was answered.
    Closed(Value),
    /// The agent closed its side: the session is over.
    Ended,
}

/// `gateway.profile`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileParams {
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    pub name: String,
    #[serde(default = "default_log_lines")]
    pub lines: usize,
    /// Keep the request open and stream new lines as `log` notifications.
    #[serde(default)]
    pub follow: bool,
}

fn default_log_lines() -> usize {
    50
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogsResult {
    pub path: String,
    pub lines: Vec<String>,
}

/// Params of a `progress` notification.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress {
    pub workspace: String,
    pub name: String,
    /// The lifecycle event behind this step (installed, starting, ready, ...).
    pub kind: EventKind,
    pub state: BundleState,
    pub message: String,
}

/// What happened to a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Installed,
    Starting,
    /// A start is building what the bundle needs before it runs (a uv
    /// bundle's Python environment); `message` is the builder's last line.
    Preparing,
    /// A `.mcpb` archive is being unpacked (at install, for an upgrade, or
    /// for a start that finds its unpacked copy gone); `message` has the
    /// entries written so far. The bundle is named as its status row is.
    Unpacking,
    Ready,
    /// The process exited (`exit` says how; `stderr` has its last lines).
    Exited,
    /// A restart is scheduled (`attempt`, `delay_ms`).
    Restarting,
    Failed,
    Stopped,
    Uninstalled,
    /// A changed manifest was refused; the running version keeps running.
    ManifestRejected,
    /// A changed manifest was accepted; the bundle restarts with it.
    Upgrading,
    /// `configure` changed the bundle's user_config; it restarts with it.
    Reconfigured,
    /// Waiting for `bundlevisor configure` (state `needs_config`).
    NeedsConfig,
    /// Waiting for `bundlevisor auth` (state `needs_auth`).
    NeedsAuth,
    /// A remote server answered 401: token refreshed, client rebuilt.
    Reauthorized,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The kernel's OOM killer struck in the bundle's cgroup (its
    /// `memory_max`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

/// One lifecycle event, as streamed by `events.subscribe` (and printed by
/// `bundlevisor events --json`, one per line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LifecycleEvent {
    /// Unix time in milliseconds.
    pub time_ms: u64,
    pub workspace: String,
    pub name: String,
    pub kind: EventKind,
    /// The bundle's state after the event.
    pub state: BundleState,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Last stderr lines of a process that exited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<String>,
}

impl LifecycleEvent {
    pub fn new(
        workspace: &str,
        name: &str,
        kind: EventKind,
        state: BundleState,
        message: impl Into<String>,
    ) -> Self {
        LifecycleEvent {
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            workspace: workspace.to_string(),
            name: name.to_string(),
            kind,
            state,
            message: message.into(),
            exit: None,
            attempt: None,
            delay_ms: None,
            stderr: Vec::new(),
        }
    }
}

/// A line a bundle wrote to stderr (`log` notifications of `logs -f`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    pub workspace: String,
    pub name: String,
    pub line: String,
}

/// A workspace file, as `files put`/`files ls` report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRecord {
    /// `fl_` + 24 lowercase hex digits.
    pub id: String,
    pub filename: String,
    pub mime_type: String,
    pub size: u64,
    pub tags: Vec<String>,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesPutParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// Absolute path of a file the daemon reads (same uid as the client).
    pub path: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Overrides the detected MIME type.
    #[serde(default)]
    pub mime: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesParams {
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// The file id for `files.get` / `files.rm`, the checkpoint id for
    /// `files.rollback`; absent for `files.ls` and `files.checkpoint`.
    #[serde(default)]
    pub id: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FilesList {
    pub workspace: String,
    pub files: Vec<FileRecord>,
}

/// `files.get`: the record and the bytes, base64.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileContent {
    pub file: FileRecord,
    pub base64: String,
}

/// `files.checkpoint`: the workspace's file set at a point in time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub checkpoint_id: String,
    /// RFC 3339, UTC.
    pub timestamp: String,
    pub files: Vec<FileRecord>,
}

/// `files.rollback`: the checkpoint's file set is the workspace's again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollback {
    pub success: bool,
    pub checkpoint_id: String,
    /// Ids that came back (absent before the rollback).
    pub restored_files: Vec<String>,
}
