//! The daemon's one door: what every face of it — the control socket, the
//! stdio and HTTP gateways, the ops endpoints — asks of the actor tree,
//! typed in and out. Requests and answers are domain types (rmcp's model
//! types for MCP, [`BundleTools`], the board's statuses); a refusal is an
//! [`ApiError`], which each face turns into its own wire error in one
//! place (`From<ApiError>` for the control socket's `RpcError` and for
//! MCP's `ErrorData`). No `serde_json::Value` and no wire error crosses
//! this boundary.
//!
//! - [`call`]: tools, tool calls (the fast path on a ready session, the
//!   bounded wait for a bundle on its way up), MCP requests passed to a
//!   bundle, the workspace's files as MCP resources.
//! - [`bundles`]: installing and removing bundles, the manifest one runs.
//! - [`credentials`]: `configure`, the authorization of remote bundles,
//!   the credential key's rotation.
//! - [`tokens`]: the HTTP gateway's access tokens.
//! - [`outcome`]: waiting for a bundle: until it is ready, and for the
//!   outcome of its next start (restart, configure, auth).
//!
//! Actors are asked one way ([`Api::ask`]), with timeouts named after what
//! is asked ([`limit`]).

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

use super::bundle::{actor_name, BundleMsg};
use super::supervisor::{DaemonMsg, InstallError};
use super::workspace::WorkspaceMsg;
use super::Shared;
use crate::protocol::{BundleState, ErrorKind};

pub mod audit;
pub mod bundles;
pub mod call;
pub mod credentials;
pub mod outcome;
pub mod tokens;

pub use call::{BundleTools, CallRequest};

/// How long the daemon waits for an actor, by what it asks.
pub mod limit {
    use std::time::Duration;

    /// A question an actor answers from its state (tools, a respawn set
    /// under way, a workspace's actor).
    pub const ANSWER: Duration = Duration::from_secs(10);
    /// A workspace file operation (a large put or get).
    pub const FILES: Duration = Duration::from_secs(120);
    /// An install: longer than the daemon's own deadlines (reading and
    /// checking 30 s, the workspace taking the bundle `stop_grace` + 10 s),
    /// so the daemon, not the face that asked, says what took too long.
    pub const INSTALL: Duration = Duration::from_secs(120);
    /// An uninstall: until the bundle's process is gone.
    pub const UNINSTALL: Duration = Duration::from_secs(90);
    /// Slack on top of a call's own timeout (the bundle answers the
    /// timeout, the actor does not).
    pub const CALL_SLACK: Duration = Duration::from_secs(5);
}

/// Why the daemon did not do what was asked. The message is the one every
/// face shows; [`ApiError::kind`] is the stable kind scripts match on.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no bundle {name:?} in workspace {workspace:?}; `bundlevisor status` lists the installed bundles")]
    BundleNotFound { workspace: String, name: String },
    /// The bundle is not ready (and was not waited for, or did not become
    /// ready in time).
    #[error("{message}")]
    NotReady { message: String, state: BundleState },
    /// A start that did not reach ready: `state` says whether the operator
    /// must configure or authorize it.
    #[error("bundle {name:?} {}: {message}", not_started(*.state))]
    NotStarted {
        workspace: String,
        name: String,
        state: BundleState,
        message: String,
    },
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Cancelled(String),
    #[error("{0}")]
    ToolNotFound(String),
    /// The bundle (or the workspace's files resolver) answered an MCP
    /// error; `message` says whose answer it was.
    #[error("{message}")]
    Mcp {
        message: String,
        error: rmcp::ErrorData,
    },
    #[error("no workspace {workspace:?}; known: {}", if .known.is_empty() { "none (install a bundle with -w WORKSPACE)".to_string() } else { .known.join(", ") })]
    WorkspaceNotFound {
        workspace: String,
        known: Vec<String>,
    },
    #[error("{0}")]
    InvalidParams(String),
    /// The actor tree is going away (or an actor is gone).
    #[error("the daemon could not handle the request: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error(transparent)]
    File(#[from] crate::files::FileError),
    #[error("there is no profile {profile:?} in the daemon's config (profiles: {}); add a [[profile]] table, or leave --profile out", if .known.is_empty() { "none".to_string() } else { .known.join(", ") })]
    NoSuchProfile { profile: String, known: Vec<String> },
    #[error("a token named {0:?} exists already; pick another --name, or `bundlevisor token revoke {0}` first")]
    TokenExists(String),
    #[error("no token is named {0:?} or has that id; `bundlevisor token ls` lists them")]
    TokenNotFound(String),
    #[error("cannot read the manifest of bundle {name:?} to check the values: {reason}")]
    ManifestUnreadable { name: String, reason: String },
    /// `configure` values that do not fit their user_config declaration.
    #[error("{message}")]
    InvalidConfigValue {
        message: String,
        problems: Vec<String>,
    },
    /// What is asked needs `configure` first.
    #[error("{0}")]
    NotConfigured(String),
    #[error("{0}")]
    AuthFailed(String),
    #[error("{0}")]
    KeyRotationFailed(String),
    #[error("{0}")]
    Internal(String),
}

/// The workspace's files resolver refused: an MCP error, as its own.
impl From<crate::host_resources::HostError> for ApiError {
    fn from(e: crate::host_resources::HostError) -> ApiError {
        ApiError::Mcp {
            message: e.message.clone(),
            error: rmcp::ErrorData::new(
                rmcp::model::ErrorCode(e.code),
                e.message,
                Some(e.data).filter(|d| !d.is_null()),
            ),
        }
    }
}

fn not_started(state: BundleState) -> &'static str {
    match state {
        BundleState::NeedsConfig => "needs configuration",
        BundleState::NeedsAuth => "needs authorization",
        _ => "failed to start",
    }
}

impl ApiError {
    /// The stable kind of this refusal (the wire's `data.kind`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApiError::BundleNotFound { .. } => ErrorKind::BundleNotFound,
            ApiError::NotReady { .. } => ErrorKind::NotReady,
            ApiError::NotStarted { state, .. } => match state {
                BundleState::NeedsConfig => ErrorKind::NeedsConfig,
                BundleState::NeedsAuth => ErrorKind::NeedsAuth,
                _ => ErrorKind::StartFailed,
            },
            ApiError::Timeout(_) => ErrorKind::Timeout,
            ApiError::Failed(_) => ErrorKind::ToolCallFailed,
            ApiError::Cancelled(_) => ErrorKind::Cancelled,
            ApiError::ToolNotFound(_) => ErrorKind::ToolNotFound,
            ApiError::Mcp { .. } => ErrorKind::McpError,
            ApiError::WorkspaceNotFound { .. } => ErrorKind::WorkspaceNotFound,
            ApiError::InvalidParams(_) => ErrorKind::InvalidParams,
            ApiError::Unavailable(_) => ErrorKind::ShuttingDown,
            ApiError::Install(e) => install_kind(e),
            // What the caller gave (a tag, an id) is wrong, or the store failed.
            ApiError::File(
                crate::files::FileError::BadTag(_) | crate::files::FileError::BadId(_),
            ) => ErrorKind::InvalidParams,
            ApiError::File(_) => ErrorKind::FileError,
            ApiError::ManifestUnreadable { .. } => ErrorKind::ManifestInvalid,
            ApiError::NoSuchProfile { .. } => ErrorKind::InvalidParams,
            ApiError::TokenExists(_) => ErrorKind::TokenExists,
            ApiError::TokenNotFound(_) => ErrorKind::TokenNotFound,
            ApiError::InvalidConfigValue { .. } => ErrorKind::InvalidConfigValue,
            ApiError::NotConfigured(_) => ErrorKind::NeedsConfig,
            ApiError::AuthFailed(_) => ErrorKind::AuthFailed,
            ApiError::KeyRotationFailed(_) => ErrorKind::KeyRotationFailed,
            ApiError::Internal(_) => ErrorKind::Internal,
        }
    }

    pub fn not_found(workspace: &str, name: &str) -> ApiError {
        ApiError::BundleNotFound {
            workspace: workspace.to_string(),
            name: name.to_string(),
        }
    }

    pub fn unavailable(e: impl std::fmt::Display) -> ApiError {
        ApiError::Unavailable(e.to_string())
    }
}

/// The stable kind of an install, uninstall or workspace refusal.
fn install_kind(e: &InstallError) -> ErrorKind {
    match e {
        InstallError::InvalidName(_) => ErrorKind::InvalidName,
        InstallError::NoSuchPath { .. } => ErrorKind::InvalidParams,
        InstallError::Manifest(_) => ErrorKind::ManifestInvalid,
        InstallError::Gate(_) => ErrorKind::GateRefused,
        InstallError::Sandbox(_) => ErrorKind::SandboxRefused,
        InstallError::Untrusted(_) => ErrorKind::BundleUntrusted,
        InstallError::Archive(crate::archive::ArchiveError::Refused { .. }) => {
            ErrorKind::ArchiveRefused
        }
        InstallError::Archive(_) => ErrorKind::InvalidParams,
        InstallError::AlreadyInstalled { .. } => ErrorKind::AlreadyInstalled,
        InstallError::NotInstalled { .. }
        | InstallError::NotInstalledToUpgrade { .. }
        | InstallError::Moved { .. } => ErrorKind::BundleNotFound,
        InstallError::Watched { .. } | InstallError::WatchedUpgrade { .. } => {
            ErrorKind::WatchedBundle
        }
        InstallError::OtherBundle { .. } => ErrorKind::InvalidParams,
        InstallError::TimedOut(_) => ErrorKind::Timeout,
        InstallError::Store(_) | InstallError::Internal(_) => ErrorKind::Internal,
    }
}

/// The door itself: cheap to clone, one per face (or per connection).
#[derive(Clone)]
pub struct Api {
    pub(crate) daemon: ActorRef<DaemonMsg>,
    pub(crate) shared: Arc<Shared>,
}

impl Api {
    pub fn new(daemon: ActorRef<DaemonMsg>, shared: Arc<Shared>) -> Api {
        Api { daemon, shared }
    }

    /// What the daemon was configured with, and its shared state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The DaemonActor.
    pub fn daemon(&self) -> &ActorRef<DaemonMsg> {
        &self.daemon
    }

    /// Asks `actor` and waits for its answer at most `limit`; `what` names
    /// who did not answer.
    pub async fn ask<M, R>(
        actor: &ActorRef<M>,
        msg: impl FnOnce(RpcReplyPort<R>) -> M,
        limit: Duration,
        what: &str,
    ) -> Result<R, ApiError>
    where
        M: ractor::Message,
        R: Send + 'static,
    {
        match actor.call(msg, Some(limit)).await {
            Ok(CallResult::Success(r)) => Ok(r),
            Ok(CallResult::Timeout) => Err(ApiError::Timeout(format!(
                "{what} did not answer within {}",
                humantime::format_duration(limit)
            ))),
            Ok(CallResult::SenderError) => Err(ApiError::unavailable(format!("{what} went away"))),
            Err(e) => Err(ApiError::unavailable(e)),
        }
    }

    /// The actor of an installed bundle.
    pub fn bundle_actor(workspace: &str, name: &str) -> Result<ActorRef<BundleMsg>, ApiError> {
        ActorRef::<BundleMsg>::where_is(actor_name(workspace, name))
            .ok_or_else(|| ApiError::not_found(workspace, name))
    }

    /// The actor of a workspace (created on first use).
    pub async fn workspace(&self, name: &str) -> Result<ActorRef<WorkspaceMsg>, ApiError> {
        let name = name.to_string();
        Ok(Api::ask(
            &self.daemon,
            |reply| DaemonMsg::Workspace { name, reply },
            limit::ANSWER,
            "the daemon",
        )
        .await??)
    }

    /// A file operation of `workspace`'s actor.
    pub async fn files<T: Send + 'static>(
        &self,
        workspace: &str,
        op: impl FnOnce(RpcReplyPort<Result<T, crate::files::FileError>>) -> super::workspace::FilesOp,
    ) -> Result<T, ApiError> {
        let actor = self.workspace(workspace).await?;
        Ok(Api::ask(
            &actor,
            |reply| WorkspaceMsg::Files(op(reply)),
            limit::FILES,
            "the file operation",
        )
        .await??)
    }

    /// Workspaces with bundles (or files), those a watched folder feeds,
    /// and the default one.
    pub fn known_workspaces(&self) -> Vec<String> {
        let (mut known, _) = self.shared.board.snapshot(false);
        known.push(crate::protocol::DEFAULT_WORKSPACE.to_string());
        known.extend(self.shared.config.watch.iter().map(|w| w.workspace.clone()));
        known.sort();
        known.dedup();
        known
    }

    /// What a running bundle declared at its handshake: capabilities,
    /// server info and instructions (`None` while it is not running).
    pub fn declared(
        &self,
        workspace: &str,
        name: &str,
    ) -> Option<std::sync::Arc<rmcp::model::ServerPeerInfo>> {
        let live = self.shared.lanes.get(workspace, name)?;
        live.session.peer.peer_info()
    }

    /// The input schema of `tool` of a ready bundle.
    pub fn tool_schema(
        &self,
        workspace: &str,
        name: &str,
        tool: &str,
    ) -> Option<std::sync::Arc<rmcp::model::JsonObject>> {
        let live = self.shared.lanes.get(workspace, name)?;
        let found = live.session.tools.iter().find(|t| t.name == tool)?;
        Some(found.input_schema.clone())
    }

    /// What each ready bundle of `workspace` declared at its handshake.
    pub fn declared_all(
        &self,
        workspace: &str,
    ) -> Vec<(String, std::sync::Arc<rmcp::model::ServerPeerInfo>)> {
        self.shared
            .lanes
            .all(workspace)
            .into_iter()
            .filter_map(|(name, live)| Some((name, live.session.peer.peer_info()?)))
            .collect()
    }

    /// Err (naming the ones it knows) unless the daemon knows `workspace`.
    pub fn known_workspace(&self, workspace: &str) -> Result<(), ApiError> {
        let known = self.known_workspaces();
        match known.iter().any(|w| w == workspace) {
            true => Ok(()),
            false => Err(ApiError::WorkspaceNotFound {
                workspace: workspace.to_string(),
                known,
            }),
        }
    }

    /// Whether the boot reload has settled (every installed bundle ready,
    /// failed, or being retried).
    pub fn ready(&self) -> bool {
        self.shared.settled.is_cancelled()
    }

    /// The audit log of `workspace` (docs/gateway.md, "Audit").
    pub fn audit_log(&self, workspace: &str) -> crate::host_resources::access::AuditLog {
        self.shared.audit_log(workspace)
    }

    /// The tool search index of `workspace` (`discovery = "search"`).
    pub fn tool_index(
        &self,
        workspace: &str,
    ) -> Result<Arc<crate::tool_search::ToolIndex>, crate::tool_search::SearchError> {
        self.shared.tool_index(workspace)
    }

    /// The daemon's metrics, in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render()
    }

    /// Every bundle's status (of one workspace), with its resource use
    /// when `usage` and its sandbox's path lists when `paths`.
    pub fn status(
        &self,
        workspace: Option<&str>,
        usage: bool,
        paths: bool,
    ) -> Result<crate::protocol::StatusResult, ApiError> {
        use crate::protocol::{DaemonInfo, StatusResult, Usage};
        let (mut workspaces, mut bundles) = self.shared.board.snapshot(paths);
        self.shared
            .board
            .with_unpacking(&mut workspaces, &mut bundles);
        if let Some(ws) = workspace {
            self.known_workspace(ws)?;
            workspaces.retain(|w| w == ws);
            bundles.retain(|b| b.workspace == ws);
        }
        if usage {
            // Without a cgroup, a bundle's tree is its process group.
            let mut groups = None;
            for b in &mut bundles {
                let (calls, errors) = self.shared.metrics.calls_of(&b.workspace, &b.name);
                let (memory_bytes, cpu_usec) = match b.pid {
                    Some(pid) => match self.shared.cgroups.usage(&b.workspace, &b.name) {
                        (None, None) => groups
                            .get_or_insert_with(crate::daemon::metrics::group_usage)
                            .get(&pid)
                            .map_or((None, None), |(m, c)| (Some(*m), Some(*c))),
                        found => found,
                    },
                    None => (None, None),
                };
                b.usage = Some(Usage {
                    memory_bytes,
                    cpu_usec,
                    rss_bytes: b.pid.and_then(crate::daemon::metrics::rss_bytes),
                    calls,
                    errors,
                });
            }
        }
        let config = &self.shared.config;
        Ok(StatusResult {
            daemon: DaemonInfo {
                version: env!("CARGO_PKG_VERSION").to_string(),
                pid: std::process::id(),
                uptime_secs: self.shared.started_at.elapsed().as_secs(),
                socket: config.socket.display().to_string(),
                state_dir: config.state_dir.display().to_string(),
                metrics_addr: self.shared.metrics_addr.map(|a| a.to_string()),
            },
            workspaces,
            bundles,
        })
    }

    /// The daemon's lifecycle events from now on.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<super::board::Event> {
        self.shared.board.subscribe()
    }

    /// How many lifecycle events were published so far.
    pub fn events_emitted(&self) -> u64 {
        self.shared.board.emitted()
    }
}
