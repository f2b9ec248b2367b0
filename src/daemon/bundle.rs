//! BundleActor: owns one installed bundle's process and MCP session.
//!
//! Lifecycle (docs/ARCHITECTURE.md): `starting → ready`; `ready → failed`
//! when the process exits; `starting → failed` when a start fails;
//! `any → restarting → starting` on a manual restart; `→ stopped` on
//! uninstall or shutdown. Each start runs in a task that ends in a
//! `Started` message; a generation number discards results and exits that
//! belong to an earlier start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::service::Peer;
use rmcp::RoleClient;
use serde_json::{Map, Value};

use super::Shared;
use crate::bundle::process::{ExitInfo, Lifeline};
use crate::bundle::{connect, ConnectOptions, Connection, HostContext};
use crate::host_resources::{HostRequest, PROVIDED_CAPABILITIES};
use crate::protocol::{BundleState, BundleStatus};

/// Registry name of a bundle's actor.
pub fn actor_name(workspace: &str, name: &str) -> String {
    format!("bundle/{workspace}/{name}")
}

pub struct BundleActor;

pub struct BundleArgs {
    pub workspace: String,
    pub name: String,
    pub source: PathBuf,
    pub shared: Arc<Shared>,
    /// Handle to the owning WorkspaceActor for host-resources requests.
    pub host_port: DerivedActorRef<HostRequest>,
    /// Restarts so far (kept across actor restarts by the WorkspaceActor).
    pub restarts: u32,
}

/// Why a tool call could not be made.
#[derive(Debug)]
pub enum CallError {
    NotReady {
        state: BundleState,
        last_error: Option<String>,
    },
    Timeout(Duration),
    Failed(String),
}

pub enum BundleMsg {
    Start {
        generation: u64,
    },
    Started {
        generation: u64,
        result: Result<Box<Started>, String>,
    },
    Exited {
        generation: u64,
        exit: ExitInfo,
    },
    /// Stop the current process (if any) and start again.
    Restart(RpcReplyPort<()>),
    Call {
        tool: String,
        arguments: Option<Map<String, Value>>,
        timeout: Option<Duration>,
        reply: RpcReplyPort<Result<Value, CallError>>,
    },
    Tools(RpcReplyPort<(BundleState, Vec<Value>)>),
    #[cfg(feature = "fault-injection")]
    Panic,
}

/// A successful start.
pub struct Started {
    connection: Connection,
    version: String,
}

struct Live {
    peer: Peer<RoleClient>,
    lifeline: Lifeline,
    ready_since: Instant,
}

pub struct BundleActorState {
    args: BundleArgs,
    state: BundleState,
    generation: u64,
    live: Option<Live>,
    tools: Vec<Tool>,
    version: Option<String>,
    last_error: Option<String>,
}

impl BundleActorState {
    fn publish(&self, message: impl Into<String>) {
        let status = BundleStatus {
            workspace: self.args.workspace.clone(),
            name: self.args.name.clone(),
            version: self.version.clone(),
            state: self.state,
            pid: self.live.as_ref().map(|l| l.lifeline.pid()),
            uptime_secs: None,
            restarts: self.args.restarts,
            tools: self.tools.len(),
            last_error: self.last_error.clone(),
            source: self.args.source.display().to_string(),
        };
        let ready_since = self
            .live
            .as_ref()
            .filter(|_| self.state == BundleState::Ready)
            .map(|l| l.ready_since);
        self.args.shared.board.publish(status, ready_since, message);
    }

    fn fail(&mut self, reason: String) {
        tracing::warn!(workspace = %self.args.workspace, bundle = %self.args.name, "bundle failed: {reason}");
        self.state = BundleState::Failed;
        self.tools.clear();
        self.last_error = Some(reason.clone());
        self.publish(reason);
    }
}

#[ractor::async_trait]
impl Actor for BundleActor {
    type Msg = BundleMsg;
    type State = BundleActorState;
    type Arguments = BundleArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<BundleMsg>,
        args: BundleArgs,
    ) -> Result<BundleActorState, ActorProcessingErr> {
        myself.send_message(BundleMsg::Start { generation: 0 })?;
        Ok(BundleActorState {
            args,
            state: BundleState::Starting,
            generation: 0,
            live: None,
            tools: Vec::new(),
            version: None,
            last_error: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<BundleMsg>,
        msg: BundleMsg,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            BundleMsg::Start { generation } if generation == st.generation => {
                st.state = BundleState::Starting;
                st.tools.clear();
                st.publish("starting");
                let shared = st.args.shared.clone();
                let (workspace, name, source) = (
                    st.args.workspace.clone(),
                    st.args.name.clone(),
                    st.args.source.clone(),
                );
                let host = HostContext::new(&workspace, &name, st.args.host_port.clone());
                tokio::spawn(async move {
                    let result = start(&shared, &workspace, &name, source, host)
                        .await
                        .map(Box::new);
                    if let Err(ractor::MessagingErr::SendErr(BundleMsg::Started {
                        result: Ok(started),
                        ..
                    })) = myself.send_message(BundleMsg::Started { generation, result })
                    {
                        // The actor is gone: do not leave the process behind.
                        started
                            .connection
                            .lifeline
                            .stop(shared.config.bundles.stop_grace)
                            .await;
                    }
                });
            }
            BundleMsg::Start { .. } => {}
            BundleMsg::Started { generation, result } => {
                if generation != st.generation {
                    if let Ok(started) = result {
                        let grace = st.args.shared.config.bundles.stop_grace;
                        tokio::spawn(async move { started.connection.lifeline.stop(grace).await });
                    }
                    return Ok(());
                }
                match result.map(|started| *started) {
                    Ok(Started {
                        connection,
                        version,
                    }) => {
                        let observer = connection.lifeline.observer();
                        st.version = Some(version);
                        st.tools = connection.tools;
                        st.live = Some(Live {
                            peer: connection.peer,
                            lifeline: connection.lifeline,
                            ready_since: Instant::now(),
                        });
                        st.state = BundleState::Ready;
                        st.last_error = None;
                        tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, pid = observer.pid(), tools = st.tools.len(), "bundle ready");
                        st.publish("ready");
                        tokio::spawn(async move {
                            let exit = observer.wait().await;
                            let _ = myself.send_message(BundleMsg::Exited { generation, exit });
                        });
                    }
                    Err(reason) => st.fail(reason),
                }
            }
            BundleMsg::Exited { generation, exit } => {
                if generation == st.generation && st.live.take().is_some() {
                    st.fail(format!("process exited ({exit})"));
                }
            }
            BundleMsg::Restart(reply) => {
                st.generation += 1;
                st.args.restarts += 1;
                st.state = BundleState::Restarting;
                let live = st.live.take();
                st.publish("restarting");
                let grace = st.args.shared.config.bundles.stop_grace;
                let generation = st.generation;
                tokio::spawn(async move {
                    if let Some(live) = live {
                        live.lifeline.stop(grace).await;
                    }
                    let _ = myself.send_message(BundleMsg::Start { generation });
                });
                let _ = reply.send(());
            }
            BundleMsg::Call {
                tool,
                arguments,
                timeout,
                reply,
            } => {
                let Some(live) = st.live.as_ref().filter(|_| st.state == BundleState::Ready) else {
                    let _ = reply.send(Err(CallError::NotReady {
                        state: st.state,
                        last_error: st.last_error.clone(),
                    }));
                    return Ok(());
                };
                let peer = live.peer.clone();
                let timeout = timeout.unwrap_or(st.args.shared.config.bundles.call_timeout);
                tokio::spawn(async move {
                    let mut params = CallToolRequestParams::new(tool);
                    if let Some(arguments) = arguments {
                        params = params.with_arguments(arguments);
                    }
                    // Dropping the future on timeout sends notifications/cancelled.
                    let result = match tokio::time::timeout(timeout, peer.call_tool(params)).await {
                        Err(_) => Err(CallError::Timeout(timeout)),
                        Ok(Err(e)) => Err(CallError::Failed(e.to_string())),
                        Ok(Ok(r)) => {
                            serde_json::to_value(r).map_err(|e| CallError::Failed(e.to_string()))
                        }
                    };
                    let _ = reply.send(result);
                });
            }
            BundleMsg::Tools(reply) => {
                let tools = st
                    .tools
                    .iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect();
                let _ = reply.send((st.state, tools));
            }
            #[cfg(feature = "fault-injection")]
            BundleMsg::Panic => panic!(
                "fault injection: bundle actor {} panics on request",
                st.args.name
            ),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<BundleMsg>,
        st: &mut BundleActorState,
    ) -> Result<(), ActorProcessingErr> {
        st.generation += 1;
        if let Some(live) = st.live.take() {
            let exit = live
                .lifeline
                .stop(st.args.shared.config.bundles.stop_grace)
                .await;
            tracing::info!(workspace = %st.args.workspace, bundle = %st.args.name, "bundle stopped ({exit})");
        }
        st.state = BundleState::Stopped;
        st.publish("stopped");
        Ok(())
    }
}

/// Reads and gates the manifest again, resolves the launch plan and
/// connects. Runs in a task, never in the actor's handler.
async fn start(
    shared: &Shared,
    workspace: &str,
    name: &str,
    source: PathBuf,
    host: HostContext,
) -> Result<Started, String> {
    let loaded = tokio::task::spawn_blocking(move || crate::manifest::load(&source))
        .await
        .map_err(|e| format!("manifest reader failed: {e}"))?
        .map_err(|e| e.to_string())?;
    let manifest = &loaded.manifest;
    if manifest.name != name {
        return Err(format!(
            "manifest {} now names the bundle {:?}, but it was installed as {name:?}; uninstall and install it again",
            loaded.file.display(),
            manifest.name
        ));
    }
    crate::manifest::gate(manifest, PROVIDED_CAPABILITIES).map_err(|e| e.to_string())?;
    let plan = manifest
        .launch_plan(&loaded.dir, &BTreeMap::new())
        .map_err(|e| e.to_string())?;
    let _permit = shared
        .start_permits
        .acquire()
        .await
        .map_err(|_| "daemon is shutting down".to_string())?;
    let opts = ConnectOptions {
        log_path: shared.config.log_path(workspace, name),
        start_timeout: shared.config.bundles.start_timeout,
        stop_grace: shared.config.bundles.stop_grace,
        host_resources: shared.config.host_resources.clone(),
    };
    let connection = connect(&plan, host, &opts)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Started {
        connection,
        version: manifest.version.clone(),
    })
}
