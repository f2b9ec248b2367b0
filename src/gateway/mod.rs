//! `bundlevisor mcp`: one MCP server (stdio) per workspace that aggregates
//! its bundles, bridged to the daemon over the control socket.
//!
//! - [`server`]: the rmcp `ServerHandler` (tools, prompts, resources,
//!   workspace files, profile filtering, progress and cancellation).
//! - [`names`]: namespacing (`BUNDLE__TOOL`) and its collision rule.
//!
//! Its connection to the daemon is [`crate::client::Link`] (many requests
//! in flight) and, for the lifecycle events, a [`crate::client::Client`].
//!
//! A watcher follows the daemon's lifecycle events and sends
//! `notifications/tools/list_changed` (and the prompt and resource ones)
//! when what the agent sees has changed. See docs/gateway.md.

pub mod names;
pub mod server;

use std::path::PathBuf;
use std::time::Duration;

use rmcp::service::Peer;
use rmcp::{RoleServer, ServiceExt};

use crate::client::{Link, LinkError};
use crate::config::Profile;
use crate::protocol::typed::{self, Status};
use crate::protocol::{EventKind, LifecycleEvent, Method, NoParams, ProfileParams, StatusParams};
pub use server::{Gateway, DEFAULT_WAIT_READY};

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("MCP session with the client failed: {0}")]
    Session(String),
}

pub struct Options {
    pub socket: PathBuf,
    pub workspace: String,
    pub profile: Option<String>,
    pub wait_ready: Duration,
}

/// Serves the gateway on stdin/stdout until the client closes it.
pub async fn serve_stdio(opts: Options) -> Result<(), GatewayError> {
    let link = Link::new(opts.socket.clone());
    // Fails early (and clearly) when the daemon is not there or the profile is unknown.
    let profile = match &opts.profile {
        Some(name) => Some(
            link.request::<_, Profile>(typed::Profile::NAME, ProfileParams { name: name.clone() })
                .await?,
        ),
        None => None,
    };
    // An unknown workspace is an error, not an empty list of tools.
    let only = StatusParams {
        usage: false,
        workspace: Some(opts.workspace.clone()),
    };
    link.call::<Status>(only).await?;
    let gateway = Gateway::new(link, opts.workspace.clone(), profile, opts.wait_ready)
        .notifying_changes(opts.socket);
    let service = gateway
        .serve(crate::stdio::stdio())
        .await
        .map_err(|e| GatewayError::Session(e.to_string()))?;
    let _ = service.waiting().await;
    Ok(())
}

/// What the agent sees, as comparable text: the exposed tools, and the set
/// of bundles whose prompts and resources are offered.
async fn fingerprint(gateway: &Gateway) -> Option<(String, String)> {
    let (tools, ready) = gateway.catalog().await.ok()?;
    Some((serde_json::to_string(&tools).ok()?, ready.join(",")))
}

/// Follows lifecycle events (reconnecting when the daemon restarts) and
/// tells the client when its lists changed.
pub(crate) async fn watch_changes(gateway: Gateway, peer: Peer<RoleServer>, socket: PathBuf) {
    let mut last = fingerprint(&gateway).await;
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut client = match crate::client::Client::connect(&socket).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("event stream: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if client
            .call::<typed::Events>(NoParams {}, |_| {})
            .await
            .is_err()
        {
            continue;
        }
        backoff = Duration::from_millis(200);
        // Whatever changed while not subscribed.
        check(&gateway, &peer, &mut last).await;
        while let Ok(Some(note)) = client.next_notification().await {
            let Ok(event) = serde_json::from_value::<LifecycleEvent>(note.params) else {
                continue;
            };
            if event.workspace != gateway.0.workspace || !changes_lists(event.kind) {
                continue;
            }
            check(&gateway, &peer, &mut last).await;
        }
    }
}

fn changes_lists(kind: EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Installed | EventKind::Starting | EventKind::ManifestRejected
    )
}

async fn check(gateway: &Gateway, peer: &Peer<RoleServer>, last: &mut Option<(String, String)>) {
    let Some(now) = fingerprint(gateway).await else {
        return;
    };
    if let Some(before) = last.as_ref() {
        if before.0 != now.0 {
            let _ = peer.notify_tool_list_changed().await;
        }
        if before.1 != now.1 {
            let _ = peer.notify_prompt_list_changed().await;
            let _ = peer.notify_resource_list_changed().await;
        }
    }
    *last = Some(now);
}
