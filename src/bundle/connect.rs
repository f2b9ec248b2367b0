//! The one connect function. Every way a bundle comes up — first spawn,
//! manual restart, boot reload, crash restart, upgrade, credential respawn,
//! OAuth retry rebuild — calls [`connect`], which needs a [`HostContext`]:
//! a connection without host-resources handlers cannot be built. It builds
//! the MCP client once and hands it to the transport the plan names: a
//! child process over stdio, or a remote server over streamable HTTP.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::{Implementation, ProtocolVersion, Tool};
use rmcp::service::{
    serve_client_with_ct, serve_client_with_lifecycle_and_ct, Peer, RunningService,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientCacheConfig, RoleClient};
use tokio_util::sync::CancellationToken;

use super::client::{BundleClient, HostContext};
use super::guard::{Rules, Violation};
use super::process::{self, ExitInfo, Lifeline, SpawnError, StderrTail};
use super::reaper::Reaper;
use super::transport::BundleStdio;
use crate::config::HostResourcesConfig;
use crate::host_resources::Requester;
use crate::logfile::LogTarget;
use crate::manifest::{LaunchPlan, Plan, RemotePlan};
use crate::secret::Secret;
use crate::telemetry::{Attribute, Kind};

/// What [`connect`] needs besides the launch plan.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Where the bundle's stderr goes.
    pub log: LogTarget,
    /// Spawn + `initialize` + `tools/list` must finish within this.
    pub start_timeout: Duration,
    /// Grace period when a failed start is cleaned up or the transport dies.
    pub stop_grace: Duration,
    pub host_resources: HostResourcesConfig,
    /// Kills the bundle's group should the daemon die without stopping it.
    pub reaper: Option<Arc<Reaper>>,
    /// Remote bundles: the OAuth access token sent as `Authorization: Bearer`.
    pub bearer: Option<Secret>,
    /// Longest MCP message a stdio bundle may write.
    pub max_message_bytes: usize,
    /// How a stdio bundle's process is confined.
    pub sandbox: Option<super::sandbox::Sandbox>,
    /// Speak MCP 2025-11-25 only (`initialize`, no `server/discover`), and
    /// why: a bundle that uses host-resources, whose requests from bundle to
    /// host have no path on 2026-07-28.
    pub legacy: Option<String>,
    /// Give a stdio bundle the host-resources channel (its descriptor 3;
    /// [`super::channel`]): one whose manifest declares host-resources.
    pub host_channel: bool,
    /// The start's trace: its spawn and handshake are spans of it.
    pub trace: crate::telemetry::Trace,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("bundle exited during start ({exit}){}", stderr_hint(.stderr))]
    Exited {
        exit: ExitInfo,
        stderr: Option<String>,
    },
    #[error("bundle did not finish initialize and tools/list within {}{}", humantime::format_duration(*.after), stderr_hint(.stderr))]
    Timeout {
        after: Duration,
        stderr: Option<String>,
    },
    #[error("MCP handshake with the bundle failed: {message}{}", stderr_hint(.stderr))]
    Handshake {
        message: String,
        stderr: Option<String>,
        /// The bundle answered, in a way the other revision's handshake may
        /// not meet (not a transport failure): worth one start with it.
        answered: bool,
    },
    /// The remote server answered 401 (or 403 insufficient scope).
    #[error("the remote server refused the connection: authorization required")]
    Unauthorized {
        /// The server's `WWW-Authenticate` challenge, if it sent one.
        challenge: Option<String>,
    },
}

/// Whether a server's refusal asks for a (new) token: a 401, or a 403
/// whose challenge says `insufficient_scope` (any other 403 is the
/// server's answer, not a matter of authorization).
pub fn wants_token(unauthorized: bool, challenge: Option<&str>) -> bool {
    unauthorized || challenge.is_some_and(crate::oauth::insufficient_scope)
}

fn stderr_hint(line: &Option<String>) -> String {
    match line {
        Some(l) => {
            let cut: String = l.chars().take(200).collect();
            format!("; stderr: {cut}")
        }
        None => String::new(),
    }
}

/// A live, initialized bundle session: the one struct that holds its
/// handles. The daemon shares it (behind an `Arc`) between the lifecycle's
/// ready phase and every call that runs on it.
pub struct Session {
    /// Cloneable handle for requests; calls on clones run concurrently.
    pub peer: Peer<RoleClient>,
    pub tools: Vec<Tool>,
    pub server: Option<Implementation>,
    /// Owns the process: dropping the last clone kills the group.
    pub lifeline: Lifeline,
    /// Subscribe a call's progress token here to receive its progress.
    pub progress: ProgressDispatcher,
    /// The agents whose calls the bundle serves (its sampling, elicitation
    /// and roots requests go to them).
    pub callers: crate::bundle::client::Callers,
    /// The agents subscribed to its resources.
    pub subscribers: crate::bundle::client::Subscribers,
    /// How those resources are followed on MCP 2026-07-28, which has no
    /// `resources/subscribe`: on one `subscriptions/listen` stream.
    pub follower: super::follow::Follower,
    /// What the daemon declared to the bundle as its client.
    pub declared: rmcp::model::ClientCapabilities,
    /// And who it said it is (a 2026-07-28 request says so again).
    pub client_info: Implementation,
    /// The stdio bundle's way for tool calls answered below rmcp's client
    /// ([`super::spliced`]); None for a remote bundle.
    pub spliced: Option<super::spliced::Spliced>,
    /// The MCP revision spoken with the bundle, and why when it is not the
    /// newest the daemon knows.
    pub revision: ProtocolVersion,
    pub revision_why: Option<String>,
    /// Set when the bundle broke the transport rules (overlong or non-JSON
    /// output) and its stream was cut: the reason it stopped.
    pub violation: Violation,
    pub stderr: StderrTail,
}

/// Brings up the bundle of `plan` — spawns it, or opens its remote session —
/// and completes `initialize` (advertising host-resources, answered through
/// `host`) and `tools/list`.
pub async fn connect(
    plan: &Plan,
    host: HostContext,
    opts: &ConnectOptions,
) -> Result<Session, ConnectError> {
    let requester = host.requester().clone();
    let client = bundle_client(plan, &host, opts);
    let first = match plan {
        Plan::Stdio(plan) => {
            connect_stdio(
                plan,
                client,
                host.clone(),
                &requester,
                opts,
                opts.legacy.as_deref(),
            )
            .await
        }
        Plan::Remote(plan) => {
            connect_remote(plan, client, &requester, opts, opts.legacy.as_deref()).await
        }
    };
    // A bundle that fails the handshake is started again with the other:
    // one that fails the 2026-07-28 handshake in a way rmcp does not take
    // for "legacy" (it answers `server/discover` with an empty result, say)
    // with `initialize`; a host-resources bundle that refuses `initialize`
    // (it speaks 2026-07-28 only) with `server/discover`, its host-resources
    // requests then on its channel.
    let message = match first {
        Err(ConnectError::Handshake {
            message,
            answered: true,
            ..
        }) => message,
        // A server of one revision only may end at the other's handshake:
        // a 2026-07-28 one at `initialize`, a 2025-11-25 one at the
        // unknown `server/discover` (most answer it with an error).
        Err(e @ ConnectError::Exited { .. }) if matches!(plan, Plan::Stdio(_)) => e.to_string(),
        other => return other,
    };
    let (why, again) = match &opts.legacy {
        None => (
            Some(format!(
                "it failed the MCP 2026-07-28 handshake ({message}); spoken to with initialize"
            )),
            "initialize (2025-11-25)",
        ),
        Some(_) => (None, "server/discover (2026-07-28)"),
    };
    tracing::info!(workspace = %requester.workspace, bundle = %requester.bundle,
        "the bundle failed the MCP handshake ({message}); starting it again with {again}");
    // A stdio bundle's start had a cgroup folder of its own, which went
    // with its process: the new start gets another.
    let mut opts = opts.clone();
    if let Some(cg) = opts.sandbox.as_mut().and_then(|s| s.cgroup.as_mut()) {
        *cg = Arc::new(cg.next_start().map_err(|e| ConnectError::Handshake {
            message: format!("{message}; and no cgroup folder for a second start: {e}"),
            stderr: None,
            answered: false,
        })?);
    }
    let opts = &opts;
    let client = bundle_client(plan, &host, opts);
    match plan {
        Plan::Stdio(plan) => {
            connect_stdio(plan, client, host, &requester, opts, why.as_deref()).await
        }
        Plan::Remote(plan) => connect_remote(plan, client, &requester, opts, why.as_deref()).await,
    }
}

/// The MCP Apps extension, and the UI resources' MIME type.
pub const UI_EXTENSION: &str = "io.modelcontextprotocol/ui";
const UI_MIME_TYPE: &str = "text/html;profile=mcp-app";

/// The extension of Enterprise-Managed Authorization (SEP-990).
const ENTERPRISE_AUTH: &str = "io.modelcontextprotocol/enterprise-managed-authorization";

/// The daemon's client of the bundle: host-resources declared in its
/// capabilities, with the channel a stdio bundle that declares the
/// extension gets (`"channel": {"fd": 3, "env": …}`), and the enterprise
/// authorization extension for a remote bundle that uses it.
fn bundle_client(plan: &Plan, host: &HostContext, opts: &ConnectOptions) -> BundleClient {
    let mut extension = crate::host_resources::capability(&opts.host_resources);
    if opts.host_channel && matches!(plan, Plan::Stdio(_)) {
        extension.insert(
            "channel".into(),
            serde_json::json!({
                "fd": super::spawn::CHANNEL_FD,
                "env": super::channel::CHANNEL_ENV,
            }),
        );
    }
    let mut extensions = vec![
        (crate::host_resources::EXTENSION.to_string(), extension),
        // MCP Apps: the gateway passes a tool's UI resource to agents that
        // render it. A 2025-11-25 bundle is told once, for all its agents;
        // a 2026-07-28 request says per agent (`call::on_behalf`).
        (
            UI_EXTENSION.to_string(),
            serde_json::json!({ "mimeTypes": [UI_MIME_TYPE] })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
    ];
    // A remote bundle authorized the enterprise way says so (the
    // extension's client declaration; its settings are the bundle file's).
    if let Plan::Remote(remote) = plan {
        if remote.auth.as_ref().is_some_and(|a| a.enterprise.is_some()) {
            extensions.push((ENTERPRISE_AUTH.to_string(), Default::default()));
        }
    }
    BundleClient::new(host.clone(), extensions)
}

/// Why `initialize` + `tools/list` did not complete.
struct HandshakeFailure {
    message: String,
    /// `Some(challenge)` when the transport reported HTTP 401/403.
    unauthorized: Option<Option<String>>,
    /// The bundle answered the handshake (an error, or something else than
    /// asked): not a transport failure.
    answered: bool,
}

/// `server/discover` (or, for a bundle that does not know it or must stay
/// on 2025-11-25, `initialize`) + `tools/list` over any transport, with the
/// client's list cache turned off.
async fn handshake<T, E, A>(
    client: BundleClient,
    transport: T,
    ct: CancellationToken,
    legacy: bool,
) -> Result<(RunningService<RoleClient, BundleClient>, Vec<Tool>), HandshakeFailure>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let started = if legacy {
        serve_client_with_ct(client, transport, ct).await
    } else {
        // The newest revision the bundle speaks: `server/discover` first;
        // a bundle that refuses it (or does not answer it within 10 s) is
        // a 2025-11-25 server, spoken to with `initialize`.
        let lifecycle = rmcp::ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(super::client::BUNDLE_PROTOCOL_VERSION),
        };
        serve_client_with_lifecycle_and_ct(client, transport, lifecycle, ct).await
    };
    let service = started.map_err(|e| {
        use rmcp::service::ClientInitializeError as E;
        let answered = !matches!(
            e,
            E::ConnectionClosed(_) | E::TransportError { .. } | E::Cancelled
        );
        HandshakeFailure {
            message: e.to_string(),
            unauthorized: wants_token(e.is_authorization_required(), e.auth_challenge())
                .then(|| e.auth_challenge().map(str::to_string)),
            answered,
        }
    })?;
    // A supervisor must see the bundle's current lists, never a cache.
    service
        .peer()
        .set_response_cache_config(ClientCacheConfig::disabled())
        .await;
    let tools = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| HandshakeFailure {
            message: format!("tools/list: {e}"),
            unauthorized: wants_token(e.is_authorization_required(), e.auth_challenge())
                .then(|| e.auth_challenge().map(str::to_string)),
            answered: false,
        })?;
    Ok((service, tools))
}

/// The span of a start's MCP handshake (`server/discover`, or `initialize`
/// for 2025-11-25) and `tools/list`.
fn handshake_span(opts: &ConnectOptions, legacy: bool) -> crate::telemetry::Span {
    let method = if legacy {
        "initialize"
    } else {
        "server/discover"
    };
    opts.trace.span(
        method,
        Kind::Client,
        vec![Attribute::new("mcp.method.name", method)],
    )
}

async fn connect_stdio(
    plan: &LaunchPlan,
    client: BundleClient,
    host: HostContext,
    requester: &Requester,
    opts: &ConnectOptions,
    legacy: Option<&str>,
) -> Result<Session, ConnectError> {
    // A bundle held by its own uid starts once the kill of its previous
    // process is done (process::uid_free).
    if let Some(uid) = opts.sandbox.as_ref().and_then(|s| s.tree_uid) {
        if !process::uid_free(uid, opts.start_timeout).await {
            tracing::warn!(
                uid,
                "an earlier process of this bundle is still being stopped; starting anyway"
            );
        }
    }
    // The host-resources channel, for a bundle on 2026-07-28 (the bundle's
    // end is closed here once it has it).
    let channel = if opts.host_channel {
        Some(super::channel::pair().map_err(|e| SpawnError {
            command: plan.command.clone(),
            cwd: plan.cwd.clone(),
            source: e,
        })?)
    } else {
        None
    };
    let span = opts.trace.span("bundle.spawn", Kind::Internal, Vec::new());
    let spawned = match process::spawn(plan, opts.sandbox.as_ref(), channel.as_ref().map(|c| &c.1))
    {
        Ok(spawned) => {
            let mut span = span;
            span.set(Attribute::new("process.pid", i64::from(spawned.pid)));
            span.end("ok", None);
            spawned
        }
        Err(e) => {
            span.end("error", Some(&plan.redactor.redact(&e.to_string())));
            return Err(e.into());
        }
    };
    // The bundle's end goes now (it has its copy).
    let channel = channel.map(|(ours, _theirs)| ours);
    let stderr = process::capture_stderr(
        spawned.stderr,
        opts.log.clone(),
        &requester.workspace,
        &requester.bundle,
        plan.redactor.clone(),
    );
    let tree = process::Tree {
        cgroup: opts.sandbox.as_ref().and_then(|s| s.cgroup.clone()),
        uid: opts.sandbox.as_ref().and_then(|s| s.tree_uid),
    };
    let lifeline = Lifeline::watch(spawned.child, spawned.pid, opts.reaper.clone(), tree);
    let ct = CancellationToken::new();
    // Served until the session ends (the process died, or it was stopped):
    // a descendant that kept descriptor 3 is not answered after that.
    if let Some(ours) = channel {
        let served = super::channel::serve(ours, host.clone(), opts.max_message_bytes);
        let ended = ct.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = served => {}
                _ = ended.cancelled() => {}
            }
        });
    }
    let violation = Violation::new(plan.redactor.clone());
    let rules = Rules::new(opts.max_message_bytes, violation.clone());
    let transport = BundleStdio::new(spawned.stdout, spawned.stdin, rules, host);
    let spliced = transport.spliced();

    let span = handshake_span(opts, legacy.is_some());
    let outcome = tokio::select! {
        r = tokio::time::timeout(opts.start_timeout, handshake(client, transport, ct.clone(), legacy.is_some())) => match r {
            Ok(Ok(ok)) => Ok(ok),
            Ok(Err(failure)) => Err(ConnectError::Handshake { message: failure.message, stderr: None, answered: failure.answered }),
            Err(_) => Err(ConnectError::Timeout { after: opts.start_timeout, stderr: None }),
        },
        exit = lifeline.wait() => Err(ConnectError::Exited { exit, stderr: None }),
    };
    let (service, tools) = match outcome {
        Ok(ok) => {
            span.end("ok", None);
            ok
        }
        Err(mut err) => {
            ct.cancel();
            let exit = lifeline.stop(opts.stop_grace).await;
            // The process may have died mid-handshake: report that, not the broken pipe.
            if let ConnectError::Handshake { .. } = err {
                if exit.code != Some(0)
                    && exit
                        .signal
                        .is_none_or(|s| s != nix::sys::signal::Signal::SIGTERM as i32)
                {
                    err = ConnectError::Exited { exit, stderr: None };
                }
            }
            if let Some(reason) = violation.get() {
                err = ConnectError::Handshake {
                    message: reason,
                    stderr: None,
                    answered: false,
                };
            }
            let last = last_stderr(&stderr).await;
            match &mut err {
                ConnectError::Exited { stderr, .. }
                | ConnectError::Timeout { stderr, .. }
                | ConnectError::Handshake { stderr, .. } => *stderr = last,
                ConnectError::Spawn(_) | ConnectError::Unauthorized { .. } => {}
            }
            span.end("error", Some(&plan.redactor.redact(&err.to_string())));
            return Err(err);
        }
    };
    let mut session = connected(
        service, tools, lifeline, stderr, violation, ct, requester, opts, legacy,
    );
    session.spliced = Some(spliced);
    Ok(session)
}

async fn connect_remote(
    plan: &RemotePlan,
    client: BundleClient,
    requester: &Requester,
    opts: &ConnectOptions,
    legacy: Option<&str>,
) -> Result<Session, ConnectError> {
    let handshake_error = |message: String| ConnectError::Handshake {
        message,
        stderr: None,
        answered: false,
    };
    let mut headers = std::collections::HashMap::new();
    for (name, value) in &plan.headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|e| handshake_error(format!("header {name:?}: {e}")))?;
        let mut value = reqwest::header::HeaderValue::from_str(value.expose()).map_err(|_| {
            handshake_error(format!(
                "header {name}: the value is not a valid header value"
            ))
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(plan.url.as_str()).custom_headers(headers);
    if let Some(token) = &opts.bearer {
        config = config.auth_header(token.expose());
    }
    // Same-origin redirects only: the bundle's headers and token must not
    // follow a redirect to a server the bundle file never named.
    let redirects = crate::remote_http::RedirectGuard::default();
    let http = reqwest::Client::builder()
        .connect_timeout(opts.start_timeout)
        .redirect(redirects.policy())
        .build()
        .map_err(|e| handshake_error(format!("HTTP client: {e}")))?;
    let transport = StreamableHttpClientTransport::with_client(http, config);
    let ct = CancellationToken::new();
    let span = handshake_span(opts, legacy.is_some());
    let outcome = tokio::time::timeout(
        opts.start_timeout,
        handshake(client, transport, ct.clone(), legacy.is_some()),
    )
    .await;
    let why = match &outcome {
        Ok(Ok(_)) => None,
        Ok(Err(failure)) if failure.unauthorized.is_some() => {
            Some("authorization required".to_string())
        }
        Ok(Err(failure)) => Some(plan.redactor.redact(&failure.message).into_owned()),
        Err(_) => Some("timed out".to_string()),
    };
    span.end(if why.is_some() { "error" } else { "ok" }, why.as_deref());
    let (service, tools) = match outcome {
        Ok(Ok(ok)) => ok,
        Ok(Err(failure)) => {
            ct.cancel();
            if let Some(refused) = redirects.refused() {
                return Err(handshake_error(refused.to_string()));
            }
            return Err(match failure.unauthorized {
                Some(challenge) => ConnectError::Unauthorized { challenge },
                None => ConnectError::Handshake {
                    message: format!("{} ({})", failure.message, plan.url),
                    stderr: None,
                    answered: failure.answered,
                },
            });
        }
        Err(_) => {
            ct.cancel();
            return Err(ConnectError::Timeout {
                after: opts.start_timeout,
                stderr: None,
            });
        }
    };
    let lifeline = Lifeline::session(ct.clone());
    Ok(connected(
        service,
        tools,
        lifeline,
        StderrTail::none(),
        Violation::default(),
        ct,
        requester,
        opts,
        legacy,
    ))
}

/// Ties the service and the lifeline together: the service ends when the
/// process dies or the session is stopped (cancel), and the lifeline is
/// stopped when the service ends on its own (transport closed).
#[allow(clippy::too_many_arguments)]
fn connected(
    service: RunningService<RoleClient, BundleClient>,
    tools: Vec<Tool>,
    lifeline: Lifeline,
    stderr: StderrTail,
    violation: Violation,
    ct: CancellationToken,
    requester: &Requester,
    opts: &ConnectOptions,
    legacy: Option<&str>,
) -> Session {
    let peer = service.peer().clone();
    let progress = service.service().progress();
    let callers = service.service().callers();
    let subscribers = service.service().subscribers();
    let follower =
        super::follow::Follower::new(peer.clone(), subscribers.clone(), &requester.bundle);
    let info = rmcp::ClientHandler::get_info(service.service());
    let (declared, client_info) = (info.capabilities, info.client_info);
    let server = service
        .peer()
        .peer_info()
        .and_then(|i| i.server_info.clone());
    let revision = service
        .peer()
        .peer_info()
        .map(|i| i.protocol_version.clone())
        .unwrap_or(super::client::BUNDLE_PROTOCOL_VERSION);
    let revision_why = match legacy {
        Some(why) => Some(why.to_string()),
        None if revision < ProtocolVersion::V_2026_07_28 => {
            Some("the bundle does not speak MCP 2026-07-28 (it refused server/discover)".into())
        }
        None => None,
    };
    let observer = lifeline.observer();
    let grace = opts.stop_grace;
    tokio::spawn(async move {
        tokio::select! {
            _ = service.waiting() => observer.request_stop(grace),
            _ = observer.wait() => ct.cancel(),
        }
    });
    tracing::debug!(workspace = %requester.workspace, bundle = %requester.bundle, pid = ?lifeline.pid(), tools = tools.len(), "bundle connected");
    Session {
        peer,
        tools,
        server,
        lifeline,
        progress,
        callers,
        follower,
        subscribers,
        declared,
        client_info,
        spliced: None,
        revision,
        revision_why,
        violation,
        stderr,
    }
}

/// The last stderr line of a process that was just stopped.
async fn last_stderr(tail: &StderrTail) -> Option<String> {
    tail.drained(Duration::from_millis(500)).await;
    super::process::telling_line(&tail.lines())
}
