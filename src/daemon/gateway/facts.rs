//! What the gateway knows of one request, whoever parsed it: rmcp's
//! service (a `RequestContext`), or the gateway itself below it (a
//! stateless 2026-07-28 request answered directly). Routing, the token's
//! rules, the audit, its span and the rounds of a request that asks the
//! agent for input read a request only through [`Facts`], so both ways
//! run the same policy.

use axum::http::request::Parts;
use rmcp::model::{
    ClientCapabilities, LoggingLevel, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    RequestId,
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
    pub meta: DirectMeta,
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

/// What policy reads of a request's `_meta` (never a map of `Value`s:
/// that was 6,000 instructions a stateless call), read by
/// `gateway::direct` as rmcp would read the whole map: every value checked
/// as a `Value` would be, a key given twice read as its last, and a
/// request whose `_meta` has one of these keys in another shape left to
/// rmcp. Other keys are for nobody here.
#[derive(Default)]
pub struct DirectMeta {
    pub progress_token: Option<ProgressToken>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub protocol_version: Option<ProtocolVersion>,
    pub client_capabilities: Option<ClientCapabilities>,
    /// Only whether it is there, not `null` (a 2026-07-28 request says who
    /// it is).
    pub client_info: bool,
    /// Only whether it is there, not `null`: a request that asks for log
    /// messages is rmcp's.
    pub log_level: bool,
}

impl<'a> Facts<'a> {
    pub fn id(&self) -> &'a RequestId {
        match self {
            Facts::Rmcp(c) => &c.id,
            Facts::Direct(d) => &d.id,
        }
    }

    /// The W3C trace context in the request's `_meta` (SEP-414).
    pub fn traceparent(&self) -> Option<&'a str> {
        match self {
            Facts::Rmcp(c) => c.meta.get_traceparent(),
            Facts::Direct(d) => d.meta.traceparent.as_deref(),
        }
    }

    pub fn tracestate(&self) -> Option<&'a str> {
        match self {
            Facts::Rmcp(c) => c.meta.get_tracestate(),
            Facts::Direct(d) => d.meta.tracestate.as_deref(),
        }
    }

    /// The log level the request asks for (a request below rmcp asks for
    /// none).
    pub fn log_level(&self) -> Option<LoggingLevel> {
        match self {
            Facts::Rmcp(c) => c.meta.log_level(),
            Facts::Direct(_) => None,
        }
    }

    /// The request's progress token, if it asked for progress.
    pub fn progress_token(&self) -> Option<ProgressToken> {
        match self {
            Facts::Rmcp(c) => c.meta.get_progress_token(),
            Facts::Direct(d) => d.meta.progress_token.clone(),
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
                .protocol_version
                .clone()
                .or_else(|| Some(d.declared()?.protocol_version.clone())),
        }
    }

    pub fn client_capabilities(&self) -> Option<ClientCapabilities> {
        match self {
            Facts::Rmcp(c) => c.client_capabilities(),
            Facts::Direct(d) => d
                .meta
                .client_capabilities
                .clone()
                .or_else(|| Some(d.declared()?.capabilities.clone())),
        }
    }
}
