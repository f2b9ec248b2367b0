//! What the gateway knows of one request, whoever parsed it: rmcp's
//! service (a `RequestContext`), or the gateway itself below it (a
//! stateless 2026-07-28 request answered directly). Routing, the token's
//! rules, the audit, its span and the rounds of a request that asks the
//! agent for input read a request only through [`Facts`], so both ways
//! run the same policy.

use axum::http::request::Parts;
use rmcp::model::{
    ClientCapabilities, ProgressNotificationParam, ProgressToken, ProtocolVersion, RequestId,
    RequestMetaObject,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::RoleServer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One request, as the gateway's checks and records read it.
#[derive(Clone, Copy)]
pub enum Facts<'a> {
    /// Parsed by rmcp's service.
    Rmcp(&'a RequestContext<RoleServer>),
    /// Parsed by the gateway below rmcp.
    Direct(&'a Direct),
}

/// A request the gateway parsed itself: a stateless 2026-07-28 one (no
/// peer to send notifications to), or one on a 2025-11-25 session.
pub struct Direct {
    pub id: RequestId,
    pub meta: RequestMetaObject,
    /// The HTTP request's head (headers, and the listener's marks: the
    /// grant and the agent's key).
    pub parts: Parts,
    /// Cancelled when the agent goes away.
    pub ct: CancellationToken,
    /// The agent's end of its session, for a session's request: what it
    /// declared at `initialize`, and where its notifications go (the
    /// session's own stream, as rmcp sends any not tied to a request).
    pub session: Option<Peer<RoleServer>>,
    /// Where the call's progress goes, when the request asked for it: the
    /// request's own answer (a stream of its reports, then the result),
    /// never the session's stream.
    pub progress: Option<mpsc::Sender<ProgressNotificationParam>>,
}

impl Direct {
    /// What its session's agent declared at `initialize`, for a session's
    /// request.
    fn declared(&self) -> Option<std::sync::Arc<rmcp::model::ClientInfo>> {
        self.session.as_ref()?.peer_info()
    }
}

impl<'a> Facts<'a> {
    pub fn id(&self) -> &'a RequestId {
        match self {
            Facts::Rmcp(c) => &c.id,
            Facts::Direct(d) => &d.id,
        }
    }

    /// The request's `_meta`.
    pub fn meta(&self) -> &'a RequestMetaObject {
        match self {
            Facts::Rmcp(c) => &c.meta,
            Facts::Direct(d) => &d.meta,
        }
    }

    /// The HTTP request's head, for a request that came over HTTP.
    pub fn parts(&self) -> Option<&'a Parts> {
        match self {
            Facts::Rmcp(c) => c.extensions.get::<Parts>(),
            Facts::Direct(d) => Some(&d.parts),
        }
    }

    pub fn ct(&self) -> &'a CancellationToken {
        match self {
            Facts::Rmcp(c) => &c.ct,
            Facts::Direct(d) => &d.ct,
        }
    }

    /// The agent's end of its connection, where notifications go (none
    /// for a stateless request answered below rmcp).
    pub fn peer(&self) -> Option<&'a Peer<RoleServer>> {
        match self {
            Facts::Rmcp(c) => Some(&c.peer),
            Facts::Direct(d) => d.session.as_ref(),
        }
    }

    /// Sends `report` of the request's call to its agent as progress of
    /// `token`: on the request's own answer when it was parsed below rmcp,
    /// else through rmcp (which puts it on the request's stream). Without
    /// a token nothing was asked for, and nothing is sent.
    pub async fn notify_progress(
        &self,
        token: Option<ProgressToken>,
        mut report: ProgressNotificationParam,
    ) {
        let Some(token) = token else { return };
        report.progress_token = token;
        match self {
            Facts::Rmcp(c) => {
                let _ = c.peer.notify_progress(report).await;
            }
            Facts::Direct(d) => {
                if let Some(progress) = &d.progress {
                    let _ = progress.send(report).await;
                }
            }
        }
    }

    pub fn protocol_version(&self) -> Option<ProtocolVersion> {
        match self {
            Facts::Rmcp(c) => c.protocol_version(),
            // As rmcp reads it: the request's, else its session's.
            Facts::Direct(d) => d
                .meta
                .protocol_version()
                .or_else(|| Some(d.declared()?.protocol_version.clone())),
        }
    }

    pub fn client_capabilities(&self) -> Option<ClientCapabilities> {
        match self {
            Facts::Rmcp(c) => c.client_capabilities(),
            Facts::Direct(d) => d
                .meta
                .client_capabilities()
                .or_else(|| Some(d.declared()?.capabilities.clone())),
        }
    }
}
