//! `token.create`, `token.list`, `token.revoke`: the HTTP gateway's access
//! tokens ([`crate::daemon::api::tokens`]) on the wire.

use super::Ctx;
use crate::protocol::{
    RpcError, TokenCreateParams, TokenCreated, TokenInfo, TokenListParams, TokenRevokeParams,
    Tokens,
};

pub(super) async fn create(p: TokenCreateParams, ctx: &Ctx) -> Result<TokenCreated, RpcError> {
    Ok(ctx
        .api
        .token_create(
            p.name,
            &p.workspace,
            p.profile,
            p.expires_secs,
            (p.allow, p.deny),
        )
        .await?)
}

pub(super) async fn list(p: TokenListParams, ctx: &Ctx) -> Result<Tokens, RpcError> {
    Ok(Tokens {
        tokens: ctx.api.tokens(p.workspace).await?,
    })
}

pub(super) async fn audit(
    p: crate::protocol::AuditParams,
    ctx: &Ctx,
) -> Result<crate::protocol::AuditEntries, RpcError> {
    Ok(crate::protocol::AuditEntries {
        entries: ctx.api.audit(p).await?,
    })
}

pub(super) async fn revoke(p: TokenRevokeParams, ctx: &Ctx) -> Result<TokenInfo, RpcError> {
    Ok(ctx.api.token_revoke(&p.name).await?)
}
