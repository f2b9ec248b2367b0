//! The one connect function. Every way a bundle comes up — first spawn,
//! manual restart, boot reload (and, as they land, crash restart, upgrade,
//! credential respawn, OAuth rebuild) — calls [`connect`], which needs a
//! [`HostContext`]: a connection without host-resources handlers cannot be
//! built.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{Implementation, Tool};
use rmcp::service::{serve_client_with_ct, Peer};
use rmcp::{ClientCacheConfig, RoleClient};
use tokio_util::sync::CancellationToken;

use super::client::{BundleClient, HostContext};
use super::logfile::LogTarget;
use super::process::{self, ExitInfo, Lifeline, SpawnError, StderrTail};
use super::reaper::Reaper;
use crate::config::HostResourcesConfig;
use crate::manifest::LaunchPlan;

/// What [`connect`] needs besides the launch plan.
pub struct ConnectOptions {
    /// Where the bundle's stderr goes.
    pub log: LogTarget,
    /// Spawn + `initialize` + `tools/list` must finish within this.
    pub start_timeout: Duration,
    /// Grace period when a failed start is cleaned up or the transport dies.
    pub stop_grace: Duration,
    pub host_resources: HostResourcesConfig,
    /// Kills the bundle's group should the daemon die without stopping it.
    pub reaper: Option<Arc<Reaper>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("bundle exited during start ({exit}){}", stderr_hint(.stderr))]
    Exited {
        exit: ExitInfo,
        stderr: Option<String>,
    },
    #[error("bundle did not finish initialize and tools/list within {}{}", humantime::format_duration(*.after), stderr_hint(.stderr))]
    Timeout {
        after: Duration,
        stderr: Option<String>,
    },
    #[error("MCP handshake with the bundle failed: {message}{}", stderr_hint(.stderr))]
    Handshake {
        message: String,
        stderr: Option<String>,
    },
}

fn stderr_hint(line: &Option<String>) -> String {
    match line {
        Some(l) => {
            let cut: String = l.chars().take(200).collect();
            format!("; last stderr line: {cut}")
        }
        None => String::new(),
    }
}

/// A live, initialized bundle connection.
pub struct Connection {
    /// Cloneable handle for requests; calls on clones run concurrently.
    pub peer: Peer<RoleClient>,
    pub tools: Vec<Tool>,
    pub server: Option<Implementation>,
    /// Owns the process: dropping the last clone kills the group.
    pub lifeline: Lifeline,
    pub stderr: StderrTail,
}

/// Spawns the bundle of `plan`, completes `initialize` (advertising
/// host-resources, answered through `host`) and `tools/list`.
pub async fn connect(
    plan: &LaunchPlan,
    host: HostContext,
    opts: &ConnectOptions,
) -> Result<Connection, ConnectError> {
    let requester = host.requester().clone();
    let spawned = process::spawn(plan)?;
    let stderr = process::capture_stderr(
        spawned.stderr,
        opts.log.clone(),
        &requester.workspace,
        &requester.bundle,
        plan.redactor.clone(),
    );
    let lifeline = Lifeline::watch(spawned.child, spawned.pid, opts.reaper.clone());
    let client = BundleClient::new(
        host,
        crate::host_resources::capability(&opts.host_resources),
    );
    let ct = CancellationToken::new();

    let handshake = async {
        let service = serve_client_with_ct(client, (spawned.stdout, spawned.stdin), ct.clone())
            .await
            .map_err(|e| e.to_string())?;
        // A supervisor must see the bundle's current lists, never a cache.
        service
            .peer()
            .set_response_cache_config(ClientCacheConfig::disabled())
            .await;
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("tools/list: {e}"))?;
        Ok::<_, String>((service, tools))
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(opts.start_timeout, handshake) => match r {
            Ok(Ok(ok)) => Ok(ok),
            Ok(Err(message)) => Err(ConnectError::Handshake { message, stderr: None }),
            Err(_) => Err(ConnectError::Timeout { after: opts.start_timeout, stderr: None }),
        },
        exit = lifeline.wait() => Err(ConnectError::Exited { exit, stderr: None }),
    };
    let (service, tools) = match outcome {
        Ok(ok) => ok,
        Err(mut err) => {
            ct.cancel();
            let exit = lifeline.stop(opts.stop_grace).await;
            // The process may have died mid-handshake: report that, not the broken pipe.
            if let ConnectError::Handshake { .. } = err {
                if exit.code != Some(0)
                    && exit
                        .signal
                        .is_none_or(|s| s != nix::sys::signal::Signal::SIGTERM as i32)
                {
                    err = ConnectError::Exited { exit, stderr: None };
                }
            }
            let last = last_stderr(&stderr).await;
            match &mut err {
                ConnectError::Exited { stderr, .. }
                | ConnectError::Timeout { stderr, .. }
                | ConnectError::Handshake { stderr, .. } => *stderr = last,
                ConnectError::Spawn(_) => {}
            }
            return Err(err);
        }
    };
    let peer = service.peer().clone();
    let server = service
        .peer()
        .peer_info()
        .and_then(|i| i.server_info.clone());

    // The service ends when the process dies (cancel), and the process is
    // stopped when the service ends on its own (transport closed).
    let observer = lifeline.observer();
    let grace = opts.stop_grace;
    tokio::spawn(async move {
        tokio::select! {
            _ = service.waiting() => observer.request_stop(grace),
            _ = observer.wait() => ct.cancel(),
        }
    });
    tracing::debug!(workspace = %requester.workspace, bundle = %requester.bundle, pid = lifeline.pid(), tools = tools.len(), "bundle connected");
    Ok(Connection {
        peer,
        tools,
        server,
        lifeline,
        stderr,
    })
}

/// The last stderr line of a process that was just stopped.
async fn last_stderr(tail: &StderrTail) -> Option<String> {
    tail.drained(Duration::from_millis(500)).await;
    tail.last()
}
