//! Whom a gateway request comes from, and what its token's own rules let
//! it reach ([`crate::token_rules`]): the HTTP listener admits a token and
//! marks each request with its [`Grant`]; a stdio connection has one grant
//! for its life (the admitted uid's, or the token in `BUNDLEVISOR_TOKEN`).
//! Lists show only what the grant reaches; a request for anything else is
//! refused, naming the rule.

use std::sync::Arc;

use super::facts::Facts;
use rmcp::ErrorData;

use crate::token_rules::{Kind, Rules};

/// Who a request comes from: how the audit names them, and their token's
/// rules (none: everything the profile shows).
#[derive(Debug, Clone)]
pub struct Grant {
    /// `token:NAME` (never the token's text) or `uid:N` (stdio).
    pub principal: String,
    pub rules: Rules,
    /// The token's id and expiry (Unix seconds), checked again on each
    /// request of a connection that outlives them (stdio).
    pub token: Option<(String, Option<i64>)>,
}

impl Grant {
    /// The grant of a token. Rules stored that no longer parse (they were
    /// checked when the token was made) refuse everything: fail closed.
    pub fn of_token(token: &crate::store::AccessToken) -> Grant {
        let rules = Rules::parse(&token.allow, &token.deny).unwrap_or_else(|problems| {
            tracing::error!(token = %token.name, "the token's stored rules do not parse ({}); it reaches nothing", problems.join("; "));
            Rules::nothing()
        });
        Grant {
            principal: format!("token:{}", token.name),
            rules,
            token: Some((token.id.clone(), token.expires_at)),
        }
    }

    /// The grant of a request the HTTP listener did not mark (none should
    /// come): it reaches nothing.
    pub fn unmarked() -> Grant {
        Grant {
            principal: "unmarked".into(),
            rules: Rules::nothing(),
            token: None,
        }
    }

    /// The grant of a local agent the control socket admitted by its uid.
    pub fn of_uid(uid: u32) -> Grant {
        Grant {
            principal: format!("uid:{uid}"),
            rules: Rules::default(),
            token: None,
        }
    }
}

/// The grant the HTTP listener marked a request with.
pub fn marked(context: &Facts<'_>) -> Option<Arc<Grant>> {
    context
        .parts()
        .and_then(|parts| parts.extensions.get::<Arc<Grant>>())
        .cloned()
}

/// A refusal by the token's rules, as the agent is told it.
pub fn refused(kind: Kind, exposed: &str, why: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "{} {exposed:?} is not available to this agent: {why}",
            kind.as_str()
        ),
        None,
    )
}
