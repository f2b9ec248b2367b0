//! `bundle.configure`, `auth.begin`, `auth.complete` and
//! `credentials.rotate_key`: a bundle's credentials
//! ([`crate::daemon::api::credentials`]) on the wire, with the start that
//! follows reported as progress notifications.

use super::{Ctx, Outbox};
use crate::protocol::{
    AuthBeginParams, AuthBeginResult, AuthCompleteParams, BundleResult, ConfigureParams,
    ConfigureResult, CredentialsListParams, NoParams, RotateKeyResult, RpcError, StoredCredentials,
};

pub(super) async fn rotate_key(_: NoParams, ctx: &Ctx) -> Result<RotateKeyResult, RpcError> {
    Ok(ctx.api.rotate_key().await?)
}

pub(super) async fn list(
    p: CredentialsListParams,
    ctx: &Ctx,
) -> Result<StoredCredentials, RpcError> {
    Ok(ctx.api.credentials_list(p.workspace, p.orphaned).await?)
}

pub(super) async fn configure(
    p: ConfigureParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<ConfigureResult, RpcError> {
    Ok(ctx.api.configure(p, ctx.peer, out.forwarding()).await?)
}

pub(super) async fn auth_begin(p: AuthBeginParams, ctx: &Ctx) -> Result<AuthBeginResult, RpcError> {
    Ok(ctx.api.auth_begin(p).await?)
}

pub(super) async fn auth_complete(
    p: AuthCompleteParams,
    ctx: &Ctx,
    out: &Outbox,
) -> Result<BundleResult, RpcError> {
    let bundle = ctx.api.auth_complete(p, out.forwarding()).await?;
    Ok(BundleResult { bundle })
}
