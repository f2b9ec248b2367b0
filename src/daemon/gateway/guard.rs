//! What the gateway checks and records for each request
//! (docs/gateway.md, "Token policy" and "Audit"): the request's grant
//! ([`super::grant`]) against what it asks for, lists narrowed to what the
//! grant reaches, and the audit line of each call ([`super::audit`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::Resource;
use rmcp::ErrorData;
use tokio::sync::Mutex;

use super::audit::{Audited, Auditing, Outcome};
use super::facts::Facts;
use super::grant::{marked, refused, Grant};
use super::names::Entry;
use super::server::Gateway;
use crate::token_rules::{Kind, FILES};

impl Gateway {
    /// This request's grant: the listener's mark (HTTP), else the
    /// connection's (stdio).
    pub fn grant(&self, context: &Facts<'_>) -> Option<Arc<Grant>> {
        marked(context).or_else(|| self.0.grant.clone())
    }

    /// Whether a grant's token was revoked or has expired since the
    /// connection began (a stdio session outlives a request).
    fn lapsed(&self, grant: &Grant) -> bool {
        grant.token.as_ref().is_some_and(|(id, expires)| {
            expires.is_some_and(|at| at <= crate::clock::unix_secs())
                || self.0.api.token_revoked(id)
        })
    }

    /// This request's grant, unless its token lapsed: then nothing is
    /// reached.
    pub fn live_grant(&self, context: &Facts<'_>) -> Option<Arc<Grant>> {
        self.grant(context).map(|g| match self.lapsed(&g) {
            true => Arc::new(Grant {
                rules: crate::token_rules::Rules::nothing(),
                ..(*g).clone()
            }),
            false => g,
        })
    }

    /// Whether this request may reach `name` of `bundle` (a `kind`, shown
    /// to the agent as `exposed`); the refusal names the rule.
    pub fn permit(
        &self,
        context: &Facts<'_>,
        kind: Kind,
        (bundle, name): (&str, &str),
        exposed: &str,
    ) -> Result<(), ErrorData> {
        match self.grant(context) {
            Some(grant) if self.lapsed(&grant) => Err(refused(
                kind,
                exposed,
                "the session's token was revoked or has expired; start the agent again with a live token",
            )),
            Some(grant) => grant
                .rules
                .check(kind, bundle, name)
                .map_err(|why| refused(kind, exposed, &why)),
            None => Ok(()),
        }
    }

    /// The listed `items` (named as `exposed` gives, routed by `routes`)
    /// this request's grant reaches.
    pub async fn granted<T>(
        &self,
        context: &Facts<'_>,
        kind: Kind,
        routes: &Mutex<BTreeMap<String, Entry>>,
        items: Vec<T>,
        exposed: impl Fn(&T) -> &str,
    ) -> Vec<T> {
        let Some(grant) = self.live_grant(context).filter(|g| !g.rules.is_empty()) else {
            return items;
        };
        let routes = routes.lock().await;
        items
            .into_iter()
            .filter(|item| {
                routes
                    .get(exposed(item))
                    .is_some_and(|e| grant.rules.allows(kind, &e.bundle, &e.name))
            })
            .collect()
    }

    /// The bundle and own URI a resource URI reaches (the workspace's files
    /// are [`FILES`]'), as the token's rules name them.
    pub fn resource_owner(&self, uri: &str) -> (String, String) {
        self.0
            .naming
            .route_uri(uri)
            .unwrap_or_else(|| (FILES.to_string(), uri.to_string()))
    }

    /// The listed resources this request's grant reaches.
    pub fn granted_resources(
        &self,
        context: &Facts<'_>,
        resources: Vec<Resource>,
    ) -> Vec<Resource> {
        let Some(grant) = self.live_grant(context).filter(|g| !g.rules.is_empty()) else {
            return resources;
        };
        resources
            .into_iter()
            .filter(|r| {
                let (bundle, own) = self.resource_owner(&r.uri);
                grant.rules.allows(Kind::Resource, &bundle, &own)
            })
            .collect()
    }

    /// Whether a resource URI of this gateway may be read or followed by
    /// this request.
    pub fn permit_resource(&self, context: &Facts<'_>, uri: &str) -> Result<(), ErrorData> {
        let (bundle, own) = self.resource_owner(uri);
        self.permit(context, Kind::Resource, (&bundle, &own), uri)
    }

    /// Starts the audit of a request for `name` of `bundle`: its line is
    /// written when it ends, or, dropped before (its future dropped with
    /// the connection of an agent that went away), as failed.
    pub fn audit(
        &self,
        context: &Facts<'_>,
        action: &'static str,
        pair: (&str, &str),
    ) -> Auditing<impl Fn(Audited, Outcome, Option<&str>) + '_> {
        let principal = self
            .grant(context)
            .map_or_else(|| "unknown".to_string(), |g| g.principal.clone());
        let trace = super::audit::trace_of(&self.0.api.shared().telemetry, context);
        let request = super::audit::Request {
            principal,
            workspace: &self.0.workspace,
            action,
            bundle: pair.0,
            name: pair.1,
        };
        let audited = Audited::start(request, &trace, context);
        Auditing::new(audited, |audited, outcome, reason| {
            self.audited(audited, outcome, reason)
        })
    }

    /// Writes the audited request's line, with how it ended (and why, for
    /// a refusal).
    fn audited(&self, audited: Audited, outcome: Outcome, reason: Option<&str>) {
        if let Some(line) = audited.line(&self.0.workspace, outcome, reason) {
            self.0.api.audit_log(&self.0.workspace).record_line(line);
        }
    }
}
