//! The workspace gateway: one MCP server per workspace (and profile) that
//! aggregates its bundles. The daemon serves it in-process on both
//! transports — its HTTP endpoint, and the stdio of `bundlevisor mcp`,
//! whose connection the daemon takes over (`gateway.attach`).
//!
//! - [`server`]: the rmcp `ServerHandler` (tools, prompts, resources,
//!   workspace files, profile filtering, progress, cancellation, and the
//!   bundles' sampling, elicitation, roots and log messages passed to the
//!   agent whose call they serve).
//! - [`names`]: namespacing (`BUNDLE__TOOL`) and its collision rule.
//! - [`rounds`]: multi-round-trip requests of 2026-07-28 agents; [`tasks`]:
//!   the task ids of bundles' tasks, as agents are given them.
//!
//! What it asks of the daemon goes through [`crate::daemon::api::Api`],
//! typed (rmcp's model types), so no request crosses a socket twice and no
//! answer is turned into JSON and back.
//!
//! A watcher follows the daemon's lifecycle events and sends
//! `notifications/tools/list_changed` (and the prompt and resource ones)
//! when what the agent sees has changed. See docs/gateway.md.

// Logging is deprecated by SEP-2577 in the newest revision, and still
// there (the severity order below).
#![allow(deprecated)]

pub mod audit;
pub mod direct;
pub mod facts;
pub mod grant;
pub mod guard;
pub mod names;
pub mod rounds;
pub mod search;
pub mod server;
pub mod tasks;

use rmcp::model::{LoggingLevel, ProgressNotificationParam};
use rmcp::service::Peer;
use rmcp::RoleServer;
use tokio::sync::{broadcast, mpsc};

use crate::protocol::EventKind;
pub use server::{Common, Gateway, DEFAULT_WAIT_READY};

/// Runs a call that reports the bundle's progress to the sender it is
/// given (one when `wanted`), passing each report to `forward` in order and
/// ahead of the answer; both the gateway and the control socket's
/// `bundle.call` forward progress this way.
pub async fn with_progress<T, F, Fut>(
    wanted: bool,
    call: impl FnOnce(Option<mpsc::Sender<ProgressNotificationParam>>) -> F,
    mut forward: impl FnMut(ProgressNotificationParam) -> Fut,
) -> T
where
    F: std::future::Future<Output = T>,
    Fut: std::future::Future<Output = ()>,
{
    let (progress, mut reports) = if wanted {
        let (tx, rx) = mpsc::channel(16);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let answer = call(progress);
    tokio::pin!(answer);
    let answer = loop {
        tokio::select! {
            biased;
            Some(report) = async {
                match reports.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => forward(report).await,
            a = &mut answer => break a,
        }
    };
    if let Some(rx) = reports.as_mut() {
        while let Ok(report) = rx.try_recv() {
            forward(report).await;
        }
    }
    answer
}

/// Who made a request, as far as coming back to it goes (a parked call,
/// a task): the access token's id over HTTP (the listener puts it in the
/// request's extensions). On stdio there is one agent per connection, and
/// the connection has its own [`rounds::Rounds`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentKey(pub String);

/// A handle nobody can guess: 128 random bits, as hex.
pub(crate) fn new_state() -> String {
    use chacha20poly1305::aead::rand_core::RngCore;
    let mut bytes = [0u8; 16];
    chacha20poly1305::aead::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 5424 order, least severe first.
pub(crate) fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Which version of what the agent sees it is: of the exposed tools, and
/// of the set of bundles whose prompts and resources are offered (the
/// endpoint's last look, shared by its agents: [`server::Listed`]).
async fn fingerprint(gateway: &Gateway) -> Option<(u64, u64)> {
    // Read first: a look that starts after it has seen what it counts.
    let emitted = gateway.0.api.events_emitted();
    // Held across the look: the endpoint's other watchers wait for it and
    // share it.
    let mut listed = gateway.0.routes.listed.lock().await;
    if listed.after.is_none_or(|after| after < emitted) {
        gateway.0.api.shared().metrics.list_look();
        let (tools, ready) = gateway.catalog().await.ok()?;
        let (tools, ready) = (serde_json::to_string(&tools).ok()?, ready.join(","));
        if tools != listed.tools.0 {
            listed.tools = (tools, listed.tools.1 + 1);
        }
        if ready != listed.ready.0 {
            listed.ready = (ready, listed.ready.1 + 1);
        }
        listed.after = Some(emitted);
    }
    Some((listed.tools.1, listed.ready.1))
}

/// One of the lists an agent sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    Tools,
    Prompts,
    Resources,
}

/// Tells a 2025-11-25 session's agent that a list changed.
pub(crate) async fn tell_session(peer: &Peer<RoleServer>, list: List) {
    let _ = match list {
        List::Tools => peer.notify_tool_list_changed().await,
        List::Prompts => peer.notify_prompt_list_changed().await,
        List::Resources => peer.notify_resource_list_changed().await,
    };
}

/// Follows the daemon's lifecycle events and tells the agent (`tell`: its
/// session, or its `subscriptions/listen` stream) when its lists changed.
pub(crate) async fn watch_changes<F, Fut>(gateway: Gateway, tell: F)
where
    F: Fn(List) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut events = gateway.0.api.events();
    let mut last = fingerprint(&gateway).await;
    loop {
        match events.recv().await {
            Ok(event) => {
                if event.workspace != gateway.0.workspace || !changes_lists(event.kind) {
                    continue;
                }
            }
            // Some were missed: whatever they changed is checked.
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return,
        }
        // What else has already happened is covered by this one check (a
        // boot's hundreds of events are a few checks, not one each).
        loop {
            match events.try_recv() {
                Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(broadcast::error::TryRecvError::Empty) => break,
                Err(broadcast::error::TryRecvError::Closed) => return,
            }
        }
        check(&gateway, &tell, &mut last).await;
    }
}

fn changes_lists(kind: EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Installed
            | EventKind::Starting
            | EventKind::Preparing
            | EventKind::Unpacking
            | EventKind::ManifestRejected
    )
}

async fn check<F, Fut>(gateway: &Gateway, tell: &F, last: &mut Option<(u64, u64)>)
where
    F: Fn(List) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(now) = fingerprint(gateway).await else {
        return;
    };
    if let Some(before) = last.as_ref() {
        if before.0 != now.0 {
            tell(List::Tools).await;
        }
        if before.1 != now.1 {
            tell(List::Prompts).await;
            tell(List::Resources).await;
        }
    }
    *last = Some(now);
}
