//! `token.create`, `token.list`, `token.revoke`: the access tokens of the
//! HTTP gateway (docs/gateway.md, "Tokens"). A token is bound to one
//! workspace and perhaps one `[[profile]]`; only its SHA-256 is stored, and
//! its text is in `token.create`'s answer only — never in a log line.

use super::Ctx;
use crate::protocol::{
    ErrorKind, RpcError, TokenCreateParams, TokenCreated, TokenInfo, TokenListParams,
    TokenRevokeParams, Tokens,
};
use crate::store::AccessToken;

fn info(t: AccessToken, now: i64) -> TokenInfo {
    TokenInfo {
        expired: t.expires_at.is_some_and(|at| at <= now),
        id: t.id,
        name: t.name,
        workspace: t.workspace,
        profile: t.profile,
        created_at: t.created_at,
        expires_at: t.expires_at,
    }
}

fn store_error(e: crate::store::StoreError) -> RpcError {
    RpcError::new(ErrorKind::Internal, e.to_string())
}

pub(super) async fn create(p: TokenCreateParams, ctx: &Ctx) -> Result<TokenCreated, RpcError> {
    if let Some(profile) = &p.profile {
        let profiles = &ctx.shared.config.profiles;
        if !profiles.iter().any(|known| &known.name == profile) {
            let known: Vec<&str> = profiles.iter().map(|k| k.name.as_str()).collect();
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                format!(
                    "there is no profile {profile:?} in the daemon's config (profiles: {}); add a [[profile]] table, or leave --profile out",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            )
            .with("profile", profile.as_str()));
        }
    }
    let now = crate::clock::unix_secs();
    let expires_at = match p.expires_secs {
        None => None,
        Some(0) => {
            return Err(RpcError::new(
                ErrorKind::InvalidParams,
                "a token that expires at once admits nobody; give a positive duration (e.g. --expires 30d) or none",
            ))
        }
        Some(secs) => Some(now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX))),
    };
    let (name, workspace, profile) = (p.name.clone(), p.workspace.clone(), p.profile.clone());
    let made = ctx
        .shared
        .store
        .call(move |s| {
            s.create_token(
                name.as_deref(),
                &workspace,
                profile.as_deref(),
                now,
                expires_at,
            )
        })
        .await
        .map_err(store_error)?;
    let Some(made) = made else {
        let name = p.name.unwrap_or_default();
        return Err(RpcError::new(
            ErrorKind::TokenExists,
            format!("a token named {name:?} exists already; pick another --name, or `bundlevisor token revoke {name}` first"),
        )
        .with("name", name.as_str()));
    };
    tracing::info!(token = %made.token.name, id = %made.token.id, workspace = %made.token.workspace, "access token created");
    Ok(TokenCreated {
        token: made.text.to_string(),
        info: info(made.token, now),
    })
}

pub(super) async fn list(p: TokenListParams, ctx: &Ctx) -> Result<Tokens, RpcError> {
    let now = crate::clock::unix_secs();
    let tokens = ctx
        .shared
        .store
        .call(move |s| s.tokens(p.workspace.as_deref()))
        .await
        .map_err(store_error)?;
    Ok(Tokens {
        tokens: tokens.into_iter().map(|t| info(t, now)).collect(),
    })
}

pub(super) async fn revoke(p: TokenRevokeParams, ctx: &Ctx) -> Result<TokenInfo, RpcError> {
    let which = p.name.clone();
    let revoked = ctx
        .shared
        .store
        .call(move |s| s.revoke_token(&which))
        .await
        .map_err(store_error)?;
    match revoked {
        Some(t) => {
            // No request is admitted on it from now on (the HTTP cache).
            ctx.shared
                .tokens_revoked
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tracing::info!(token = %t.name, id = %t.id, workspace = %t.workspace, "access token revoked");
            Ok(info(t, crate::clock::unix_secs()))
        }
        None => Err(RpcError::new(
            ErrorKind::TokenNotFound,
            format!(
                "no token is named {:?} or has that id; `bundlevisor token ls` lists them",
                p.name
            ),
        )
        .with("name", p.name.as_str())),
    }
}
