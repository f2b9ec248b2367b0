//! `daemon.hello`, `status`, `metrics`, `events.subscribe`: what the daemon
//! knows without asking any actor (the status board, the counters).

use super::{Ctx, Outbox};
use crate::protocol::typed::Subscribed;
use crate::protocol::{
    method, DaemonInfo, ErrorKind, HelloParams, HelloResult, MetricsResult, NoParams, RpcError,
    StatusParams, StatusResult, Usage, PROTOCOL_VERSION,
};

pub(super) fn hello(p: HelloParams) -> Result<HelloResult, RpcError> {
    if p.protocol != PROTOCOL_VERSION {
        return Err(RpcError::new(
            ErrorKind::ProtocolMismatch,
            format!(
                "client speaks control protocol {} but this daemon speaks {PROTOCOL_VERSION}; use the bundlevisor binary of the same release as the daemon",
                p.protocol
            ),
        )
        .with("daemon_protocol", PROTOCOL_VERSION));
    }
    Ok(HelloResult {
        protocol: PROTOCOL_VERSION,
        daemon_version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
    })
}

pub(super) async fn status(p: StatusParams, ctx: &Ctx) -> Result<StatusResult, RpcError> {
    let (mut workspaces, mut bundles) = ctx.shared.board.snapshot();
    if let Some(ws) = &p.workspace {
        ctx.api.known_workspace(ws)?;
        workspaces.retain(|w| w == ws);
        bundles.retain(|b| &b.workspace == ws);
    }
    if p.usage {
        for b in &mut bundles {
            let (calls, errors) = ctx.shared.metrics.calls_of(&b.workspace, &b.name);
            let (memory_bytes, cpu_usec) = match b.pid {
                Some(_) => ctx.shared.cgroups.usage(&b.workspace, &b.name),
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
    let config = &ctx.shared.config;
    Ok(StatusResult {
        daemon: DaemonInfo {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            uptime_secs: ctx.shared.started_at.elapsed().as_secs(),
            socket: config.socket.display().to_string(),
            state_dir: config.state_dir.display().to_string(),
            metrics_addr: ctx.shared.metrics_addr.map(|a| a.to_string()),
        },
        workspaces,
        bundles,
    })
}

pub(super) async fn metrics(_: NoParams, ctx: &Ctx) -> Result<MetricsResult, RpcError> {
    Ok(MetricsResult {
        text: ctx.shared.metrics.render(),
    })
}

pub(super) async fn events(_: NoParams, ctx: &Ctx, out: &Outbox) -> Result<Subscribed, RpcError> {
    out.stream(method::EVENT, ctx.shared.board.subscribe(), |_| true);
    Ok(Subscribed { subscribed: true })
}
