//! `daemon.hello`, `status`, `metrics`, `events.subscribe`: what the daemon
//! knows without asking any actor (the status board, the counters).

use super::{Ctx, Outbox};
use crate::protocol::typed::Subscribed;
use crate::protocol::{
    method, ErrorKind, HelloParams, HelloResult, MetricsResult, NoParams, RpcError, StatusParams,
    StatusResult, PROTOCOL_VERSION,
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
    Ok(ctx.api.status(p.workspace.as_deref(), p.usage, p.paths)?)
}

/// A one-time sign-in link of the dashboard for this peer (`uid:N`).
pub(super) fn dashboard_login(
    _: NoParams,
    ctx: &Ctx,
) -> Result<crate::protocol::DashboardLink, RpcError> {
    let http = &ctx.shared.config.http;
    let Some(listen) = http.listen.filter(|_| http.dashboard) else {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            "the dashboard is off: set [http] listen and [http] dashboard = true in the daemon's config, then restart it",
        ));
    };
    let scheme = if http.tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let code = ctx.shared.dashboard.issue(format!("uid:{}", ctx.peer.uid));
    Ok(crate::protocol::DashboardLink {
        url: format!("{scheme}://{listen}/ui/login?code={code}"),
        code,
    })
}

pub(super) async fn metrics(_: NoParams, ctx: &Ctx) -> Result<MetricsResult, RpcError> {
    Ok(MetricsResult {
        text: ctx.api.metrics_text(),
    })
}

pub(super) async fn events(_: NoParams, ctx: &Ctx, out: &Outbox) -> Result<Subscribed, RpcError> {
    out.stream(method::EVENT, ctx.api.events(), |_| true);
    Ok(Subscribed { subscribed: true })
}
