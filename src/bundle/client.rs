//! The MCP client handler of a bundle connection. It advertises the
//! `ai.nimblebrain/host-resources` extension in `initialize` and forwards the
//! bundle's `ai.nimblebrain/resources/*` requests to its WorkspaceActor.

use std::time::Duration;

use ractor::DerivedActorRef;
use rmcp::handler::client::progress::ProgressDispatcher;
use rmcp::model::ProgressNotificationParam;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CustomRequest, CustomResult, ErrorCode, Implementation,
    ProtocolVersion, RequestMetaObject,
};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde_json::{json, Map, Value};

use crate::host_resources::{self, HostError, HostRequest, Requester};

/// Protocol version used with bundles. rmcp's newest revision has no
/// `initialize` and refuses server→client requests, which would silently
/// break host-resources: pin the last revision that has both.
pub const BUNDLE_PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// How long a bundle's host-resources request may wait for its workspace.
const HOST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who a connection belongs to and where its host-resources requests go.
/// Only the WorkspaceActor creates these (it hands out a handle to itself);
/// a clone serves a rebuilt connection of the same bundle.
#[derive(Clone)]
pub struct HostContext {
    requester: Requester,
    workspace: DerivedActorRef<HostRequest>,
}

impl HostContext {
    pub fn new(workspace: &str, bundle: &str, port: DerivedActorRef<HostRequest>) -> Self {
        HostContext {
            requester: Requester {
                workspace: workspace.to_string(),
                bundle: bundle.to_string(),
            },
            workspace: port,
        }
    }

    pub fn requester(&self) -> &Requester {
        &self.requester
    }
}

/// The rmcp client handler of one bundle connection.
pub(super) struct BundleClient {
    host: HostContext,
    config: ClientConfig,
    /// Routes the bundle's `notifications/progress` to the call that asked.
    progress: ProgressDispatcher,
}

impl BundleClient {
    pub(super) fn new(host: HostContext, extension: Map<String, Value>) -> Self {
        let mut capabilities = ClientCapabilities::default();
        capabilities.extensions = Some([(host_resources::EXTENSION.to_string(), extension)].into());
        let config = ClientConfig::new(
            capabilities,
            Implementation::new("bundlevisor", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(BUNDLE_PROTOCOL_VERSION);
        BundleClient {
            host,
            config,
            progress: ProgressDispatcher::new(),
        }
    }

    pub(super) fn progress(&self) -> ProgressDispatcher {
        self.progress.clone()
    }
}

impl ClientHandler for BundleClient {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.progress.handle_notification(params).await;
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        let CustomRequest {
            method,
            params,
            extensions,
        } = request;
        // rmcp moves a request's `_meta` out of `params` (into the request's
        // extensions, and from there into the context); the contract carries
        // the list filter there (`_meta.filter`), so put it back before the
        // resolver sees the params.
        let meta = Some(&context.meta)
            .filter(|m| !m.0 .0.is_empty())
            .or(extensions.get::<RequestMetaObject>());
        let params = match meta {
            Some(meta) if !meta.0 .0.is_empty() => {
                let mut object = match params {
                    Some(Value::Object(o)) => o,
                    _ => Map::new(),
                };
                object.insert("_meta".into(), Value::Object(meta.0 .0.clone()));
                Some(Value::Object(object))
            }
            _ => params,
        };
        if method != host_resources::METHOD_READ && method != host_resources::METHOD_LIST {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
                None,
            ));
        }
        let requester = self.host.requester.clone();
        let answer = self
            .host
            .workspace
            .call(
                |reply| HostRequest {
                    requester,
                    method,
                    params,
                    reply,
                },
                Some(HOST_REQUEST_TIMEOUT),
            )
            .await;
        match answer {
            Ok(ractor::rpc::CallResult::Success(Ok(value))) => Ok(CustomResult::new(value)),
            Ok(ractor::rpc::CallResult::Success(Err(e))) => Err(to_error_data(e)),
            other => {
                let why = match other {
                    Ok(ractor::rpc::CallResult::Timeout) => "timed out".to_string(),
                    Ok(_) => "reply dropped".to_string(),
                    Err(e) => e.to_string(),
                };
                tracing::warn!(workspace = %self.host.requester.workspace, bundle = %self.host.requester.bundle,
                    "host-resources request could not reach the workspace: {why}");
                Err(ErrorData::new(
                    ErrorCode::INTERNAL_ERROR,
                    "workspace unavailable",
                    Some(json!({ "retry": true })),
                ))
            }
        }
    }
}

fn to_error_data(e: HostError) -> ErrorData {
    ErrorData::new(ErrorCode(e.code), e.message, Some(e.data))
}
