//! `bundle.install`, `bundle.upgrade`, `bundle.uninstall`, `bundle.restart`: asked of the
//! DaemonActor (installs, uninstalls) or the bundle's actor (restart), then
//! the outcome of the start is waited for.

use std::path::PathBuf;

use super::{Ctx, Outbox};
use crate::daemon::bundle::Respawn;
use crate::protocol::{
    BundleRef, BundleResult, ErrorKind, InstallParams, RpcError, UninstallParams, UninstallResult,
};
use crate::store::Origin;

pub(super) async fn install(
    p: InstallParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let path = peers_bundle(&p, ctx).await?;
    let bundle = ctx
        .api
        .install(
            path,
            &p.workspace,
            Origin::Cli,
            !p.no_wait,
            out.forwarding(),
        )
        .await?;
    Ok(BundleResult { bundle })
}

/// The bundle folder, manifest or archive `p` names, if the peer may use
/// it (checked on the blocking pool, never on the event loop).
async fn peers_bundle(p: &InstallParams, ctx: &Ctx) -> Result<PathBuf, RpcError> {
    let path = PathBuf::from(&p.path);
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
    Ok(path)
}

pub(super) async fn upgrade(
    p: InstallParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let path = peers_bundle(&p, ctx).await?;
    let bundle = ctx
        .api
        .upgrade(path, &p.workspace, None, !p.no_wait, out.forwarding())
        .await?;
    Ok(BundleResult { bundle })
}

pub(super) async fn uninstall(p: UninstallParams, ctx: &Ctx) -> Result<UninstallResult, RpcError> {
    let installed = ctx.api.uninstall(&p.workspace, &p.name, p.purge).await?;
    Ok(UninstallResult {
        workspace: p.workspace,
        name: p.name,
        not_installed: !installed,
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
