//! WorkspaceActor: one per workspace. Supervises the workspace's
//! BundleActors (a panicked one is started again with the same install)
//! and answers their host-resources requests (it will own the workspace's
//! FileStore and rate buckets).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;

use super::bundle::{actor_name, BundleActor, BundleArgs, BundleMsg};
use super::Shared;
use crate::host_resources::{self, HostError, HostRequest, Requester};

pub struct WorkspaceActor;

pub struct WorkspaceArgs {
    pub name: String,
    pub shared: Arc<Shared>,
}

pub enum WorkspaceMsg {
    /// Start supervising an installed bundle.
    Add {
        name: String,
        source: PathBuf,
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// Stop a bundle (uninstall); replies once its process is gone.
    Remove {
        name: String,
        reply: RpcReplyPort<bool>,
    },
    /// A bundle's `ai.nimblebrain/resources/*` request.
    Host(HostRequest),
    /// Retry starting a bundle actor whose restart failed.
    Respawn { name: String },
}

impl From<HostRequest> for WorkspaceMsg {
    fn from(request: HostRequest) -> Self {
        WorkspaceMsg::Host(request)
    }
}

impl TryFrom<WorkspaceMsg> for HostRequest {
    type Error = ();
    fn try_from(msg: WorkspaceMsg) -> Result<Self, ()> {
        match msg {
            WorkspaceMsg::Host(request) => Ok(request),
            _ => Err(()),
        }
    }
}

struct Slot {
    actor: Option<ActorRef<BundleMsg>>,
    source: PathBuf,
    restarts: u32,
}

pub struct WorkspaceState {
    name: String,
    shared: Arc<Shared>,
    bundles: HashMap<String, Slot>,
}

impl WorkspaceState {
    async fn spawn_bundle(
        &self,
        myself: &ActorRef<WorkspaceMsg>,
        name: &str,
        slot: &Slot,
    ) -> Result<ActorRef<BundleMsg>, String> {
        let args = BundleArgs {
            workspace: self.name.clone(),
            name: name.to_string(),
            source: slot.source.clone(),
            shared: self.shared.clone(),
            host_port: myself.get_derived(),
            restarts: slot.restarts,
        };
        Actor::spawn_linked(
            Some(actor_name(&self.name, name)),
            BundleActor,
            args,
            myself.get_cell(),
        )
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| format!("cannot start the actor of bundle {name:?}: {e}"))
    }
}

#[ractor::async_trait]
impl Actor for WorkspaceActor {
    type Msg = WorkspaceMsg;
    type State = WorkspaceState;
    type Arguments = WorkspaceArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkspaceMsg>,
        args: WorkspaceArgs,
    ) -> Result<WorkspaceState, ActorProcessingErr> {
        args.shared.board.add_workspace(&args.name);
        Ok(WorkspaceState {
            name: args.name,
            shared: args.shared,
            bundles: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        msg: WorkspaceMsg,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkspaceMsg::Add {
                name,
                source,
                reply,
            } => {
                if st.bundles.contains_key(&name) {
                    let _ = reply.send(Err(format!(
                        "bundle {name:?} is already supervised in workspace {:?}",
                        st.name
                    )));
                    return Ok(());
                }
                let mut slot = Slot {
                    actor: None,
                    source,
                    restarts: 0,
                };
                let result = st.spawn_bundle(&myself, &name, &slot).await;
                slot.actor = result.as_ref().ok().cloned();
                if result.is_ok() {
                    st.bundles.insert(name, slot);
                }
                let _ = reply.send(result.map(|_| ()));
            }
            WorkspaceMsg::Remove { name, reply } => {
                let Some(slot) = st.bundles.remove(&name) else {
                    let _ = reply.send(false);
                    return Ok(());
                };
                let board = st.shared.board.clone();
                let ws = st.name.clone();
                let limit = st.shared.config.bundles.stop_grace + Duration::from_secs(5);
                tokio::spawn(async move {
                    if let Some(actor) = slot.actor {
                        if let Err(e) = actor
                            .stop_and_wait(Some("uninstall".into()), Some(limit))
                            .await
                        {
                            tracing::warn!(workspace = %ws, bundle = %name, "bundle actor did not stop in time: {e}");
                        }
                    }
                    board.remove(&ws, &name);
                    let _ = reply.send(true);
                });
            }
            WorkspaceMsg::Host(request) => {
                let HostRequest {
                    requester,
                    method,
                    params,
                    reply,
                } = request;
                let _ = reply.send(answer_host(&st.name, &requester, &method, params.as_ref()));
            }
            WorkspaceMsg::Respawn { name } => {
                let Some(slot) = st.bundles.get(&name) else {
                    return Ok(());
                };
                if slot.actor.is_some() {
                    return Ok(());
                }
                match st.spawn_bundle(&myself, &name, slot).await {
                    Ok(actor) => {
                        if let Some(slot) = st.bundles.get_mut(&name) {
                            slot.actor = Some(actor);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(workspace = %st.name, bundle = %name, "{e}; retrying");
                        myself.send_after(Duration::from_millis(200), move || {
                            WorkspaceMsg::Respawn { name }
                        });
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        event: SupervisionEvent,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        // The default would stop this actor when a child exits: never do that.
        if let SupervisionEvent::ActorFailed(cell, err) = event {
            let failed = st.bundles.iter_mut().find(|(_, slot)| {
                slot.actor
                    .as_ref()
                    .is_some_and(|a| a.get_id() == cell.get_id())
            });
            if let Some((name, slot)) = failed {
                tracing::error!(workspace = %st.name, bundle = %name, "bundle actor failed: {err}; starting it again");
                slot.actor = None;
                slot.restarts += 1;
                let name = name.clone();
                myself.send_message(WorkspaceMsg::Respawn { name })?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<WorkspaceMsg>,
        st: &mut WorkspaceState,
    ) -> Result<(), ActorProcessingErr> {
        let limit = st.shared.config.bundles.stop_grace + Duration::from_secs(5);
        myself
            .stop_children_and_wait(Some("workspace stopping".into()), Some(limit))
            .await;
        Ok(())
    }
}

/// Host-resources requests are answered for the workspace the connection
/// was bound to; a requester claiming another workspace is refused as not
/// found, like any id it cannot see.
fn answer_host(
    workspace: &str,
    requester: &Requester,
    method: &str,
    params: Option<&Value>,
) -> Result<Value, HostError> {
    if requester.workspace != workspace {
        tracing::error!(workspace, requester = ?requester, "host-resources request routed to the wrong workspace");
        let uri = params
            .and_then(|p| p.get("uri"))
            .and_then(Value::as_str)
            .unwrap_or("");
        return Err(HostError::not_found(uri));
    }
    host_resources::handle(requester, method, params)
}
