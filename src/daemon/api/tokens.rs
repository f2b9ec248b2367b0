//! The access tokens of the HTTP gateway (docs/gateway.md, "Tokens"). A
//! token is bound to one workspace and perhaps one `[[profile]]`; only its
//! SHA-256 is stored, and its text is in [`Api::token_create`]'s answer
//! only — never in a log line.

use super::{Api, ApiError};
use crate::protocol::{TokenCreated, TokenInfo};
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
        allow: t.allow,
        deny: t.deny,
    }
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    ApiError::Internal(e.to_string())
}

impl Api {
    /// A new token for `workspace` (and `profile`), named `name` (or by the
    /// store), expiring after `expires_secs` (never: None), with its own
    /// `(allow, deny)` rules ([`crate::token_rules`]).
    pub async fn token_create(
        &self,
        name: Option<String>,
        workspace: &str,
        profile: Option<String>,
        expires_secs: Option<u64>,
        (allow, deny): (Vec<String>, Vec<String>),
    ) -> Result<TokenCreated, ApiError> {
        if let Err(problems) = crate::token_rules::Rules::parse(&allow, &deny) {
            return Err(ApiError::InvalidParams(format!(
                "no token was made: {}",
                problems.join("; ")
            )));
        }
        if let Some(profile) = &profile {
            let profiles = &self.shared.config.profiles;
            if !profiles.iter().any(|known| &known.name == profile) {
                return Err(ApiError::NoSuchProfile {
                    profile: profile.clone(),
                    known: profiles.iter().map(|k| k.name.clone()).collect(),
                });
            }
        }
        let now = crate::clock::unix_secs();
        let expires_at = match expires_secs {
            None => None,
            Some(0) => {
                return Err(ApiError::InvalidParams(
                    "a token that expires at once admits nobody; give a positive duration (e.g. --expires 30d) or none".into(),
                ))
            }
            Some(secs) => Some(now.saturating_add(i64::try_from(secs).unwrap_or(i64::MAX))),
        };
        let (asked, workspace) = (name.clone(), workspace.to_string());
        let made = self
            .shared
            .store
            .call(move |s| {
                let scope = crate::store::TokenScope {
                    workspace: &workspace,
                    profile: profile.as_deref(),
                    allow: &allow,
                    deny: &deny,
                };
                s.create_token(asked.as_deref(), &scope, now, expires_at)
            })
            .await
            .map_err(store_error)?;
        let Some(made) = made else {
            return Err(ApiError::TokenExists(name.unwrap_or_default()));
        };
        tracing::info!(token = %made.token.name, id = %made.token.id, workspace = %made.token.workspace, "access token created");
        Ok(TokenCreated {
            token: made.text.to_string(),
            info: info(made.token, now),
        })
    }

    /// Whether the token of id `id` was revoked since the daemon started.
    pub fn token_revoked(&self, id: &str) -> bool {
        let revoked = self.shared.revoked_tokens.lock();
        revoked.unwrap_or_else(|p| p.into_inner()).contains(id)
    }

    /// The live token whose text is `text`.
    pub async fn token_by_text(&self, text: &str) -> Result<Option<AccessToken>, ApiError> {
        let (text, now) = (text.to_string(), crate::clock::unix_secs());
        self.shared
            .store
            .call(move |s| s.token_by_text(&text, now))
            .await
            .map_err(store_error)
    }

    /// The tokens (of one workspace, or all).
    pub async fn tokens(&self, workspace: Option<String>) -> Result<Vec<TokenInfo>, ApiError> {
        let now = crate::clock::unix_secs();
        let tokens = self
            .shared
            .store
            .call(move |s| s.tokens(workspace.as_deref()))
            .await
            .map_err(store_error)?;
        Ok(tokens.into_iter().map(|t| info(t, now)).collect())
    }

    /// Revokes the token named `which` (or of that id): no request is
    /// admitted on it from now on.
    pub async fn token_revoke(&self, which: &str) -> Result<TokenInfo, ApiError> {
        let asked = which.to_string();
        let revoked = self
            .shared
            .store
            .call(move |s| s.revoke_token(&asked))
            .await
            .map_err(store_error)?;
        let Some(t) = revoked else {
            return Err(ApiError::TokenNotFound(which.to_string()));
        };
        // The HTTP gateway's token cache drops it; stdio sessions given it
        // are refused from now on.
        self.shared
            .revoked_tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(t.id.clone());
        self.shared
            .tokens_revoked
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(token = %t.name, id = %t.id, workspace = %t.workspace, "access token revoked");
        Ok(info(t, crate::clock::unix_secs()))
    }
}
