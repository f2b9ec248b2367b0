//! `bundle.install`, `bundle.uninstall`, `bundle.restart`: asked of the
//! DaemonActor (installs, uninstalls) or the bundle's actor (restart), then
//! the outcome of the start is waited for.

use std::path::PathBuf;

use super::ask::{ask, install_error, limit};
use super::{Ctx, Outbox};
use crate::daemon::bundle::Respawn;
use crate::daemon::supervisor::DaemonMsg;
use crate::protocol::{
    BundleRef, BundleResult, ErrorKind, InstallParams, RpcError, UninstallParams, UninstallResult,
};
use crate::store::Origin;

pub(super) async fn install(
    p: InstallParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let path = PathBuf::from(&p.path);
    // File-system checks run on the blocking pool, never on the event loop.
    let (peer, checked) = (ctx.peer, path.clone());
    let allowed = tokio::task::spawn_blocking(move || {
        let manifest = crate::manifest::manifest_file(&checked);
        peer.may_use(&checked) && peer.may_use(&manifest)
    })
    .await
    .unwrap_or(false);
    if !allowed {
        return Err(RpcError::new(
            ErrorKind::PermissionDenied,
            ctx.peer.not_theirs("bundle folder or manifest", &p.path),
        ));
    }
    let events = ctx.shared.board.subscribe();
    let record = ask(
        &ctx.daemon,
        |reply| DaemonMsg::Install {
            path,
            workspace: p.workspace.clone(),
            origin: Origin::Cli,
            reply,
        },
        limit::INSTALL,
        "the daemon",
    )
    .await?
    .map_err(install_error)?;
    if p.no_wait {
        // The bundle's actor may not have published its first status yet.
        let bundle = ctx
            .shared
            .board
            .get(&record.workspace, &record.name)
            .unwrap_or_else(|| crate::daemon::expected_status(&record));
        return Ok(BundleResult { bundle });
    }
    let bundle = ctx
        .api
        .wait_outcome(events, &record.workspace, &record.name, out.forwarding())
        .await?;
    Ok(BundleResult { bundle })
}

pub(super) async fn uninstall(p: UninstallParams, ctx: &Ctx) -> Result<UninstallResult, RpcError> {
    let (workspace, name) = (p.workspace.clone(), p.name.clone());
    ask(
        &ctx.daemon,
        |reply| DaemonMsg::Uninstall {
            workspace,
            name,
            reply,
        },
        limit::UNINSTALL,
        "the uninstall",
    )
    .await?
    .map_err(install_error)?;
    if p.purge {
        ctx.shared
            .credentials_of(&p.workspace, &p.name, |c, w, n| c.purge(w, n))
            .await
            .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?;
        tracing::info!(workspace = %p.workspace, bundle = %p.name, "stored credentials and tokens purged");
    }
    Ok(UninstallResult {
        workspace: p.workspace,
        name: p.name,
    })
}

pub(super) async fn restart(
    p: BundleRef,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let bundle = ctx
        .api
        .respawn_and_wait(&p.workspace, &p.name, Respawn::Operator, out.forwarding())
        .await?;
    Ok(BundleResult { bundle })
}
