//! A ready bundle session as the daemon holds it: [`Live`], the session
//! `bundle::connect` built (the one struct of its handles: peer, lifeline,
//! tools, progress, callers, subscribers) with its generation and the
//! requests in flight on it. One `Arc<Live>` is shared by the lifecycle's
//! `Ready` phase, [`Lanes`] (the call fast path) and every call running on
//! it; a [`Lane`] is one call's hold on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bundle::Session;

/// A bundle's ready session and what the daemon knows of it.
pub struct Live {
    /// The handles `bundle::connect` built; `tools` without the excluded ones.
    pub session: Session,
    /// The start that built it (a 401 on it names it).
    pub generation: u64,
    /// `[bundles] call_timeout`.
    pub timeout: Duration,
    /// `[http] input_timeout`: the time a call's agent gets to answer the
    /// bundle's requests, which does not count against `timeout`.
    pub answer_time: Duration,
    in_flight: InFlight,
}

impl Live {
    /// `session`'s tools already exclude the ones `[[exclude_tools]]` removes.
    pub fn new(
        session: Session,
        generation: u64,
        (timeout, answer_time): (Duration, Duration),
    ) -> Arc<Live> {
        Arc::new(Live {
            session,
            generation,
            timeout,
            answer_time,
            in_flight: InFlight::default(),
        })
    }

    /// Whether the session lists `tool`.
    pub fn serves(&self, tool: &str) -> bool {
        self.session.tools.iter().any(|t| t.name == tool)
    }

    /// The session just ended (its exit is on the way to the actor).
    pub fn closed(&self) -> bool {
        self.session.peer.is_transport_closed()
    }

    /// A hold on the session for one request, counted in flight.
    pub fn lane(self: &Arc<Self>) -> Lane {
        Lane {
            in_flight: self.in_flight.enter(),
            live: self.clone(),
        }
    }

    /// A lane for a call of `tool`, if this session serves it now.
    pub fn lane_for(self: &Arc<Self>, tool: &str) -> Option<Lane> {
        (!self.closed() && self.serves(tool)).then(|| self.lane())
    }

    /// Resolves once no request runs on the session.
    pub async fn idle(&self) {
        self.in_flight.idle().await
    }
}

/// One request's hold on a session: the session, counted in flight while
/// the lane lives.
pub struct Lane {
    pub live: Arc<Live>,
    in_flight: InFlightGuard,
}

impl Lane {
    /// Ends the request's count early (its 401 goes back to the actor).
    pub fn leave(self) -> Arc<Live> {
        drop(self.in_flight);
        self.live
    }
}

/// Counts the requests in flight on one session, so a session being
/// replaced can be closed once they are done.
#[derive(Clone, Default)]
struct InFlight(Arc<(AtomicUsize, tokio::sync::Notify)>);

struct InFlightGuard(InFlight);

impl InFlight {
    fn enter(&self) -> InFlightGuard {
        self.0 .0.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    async fn idle(&self) {
        loop {
            let notified = self.0 .1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.0 .0.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let InFlight(inner) = &self.0;
        if inner.0.fetch_sub(1, Ordering::SeqCst) == 1 {
            inner.1.notify_waiters();
        }
    }
}

/// The ready session of each bundle, as its actor last published it: a
/// tool call reads it and runs on the session in its own task, without a
/// round trip through the actor (whose mailbox and task are two thread
/// wake-ups a call; docs/performance.md). Only a session the actor would
/// send to is here; anything else (starting, restarting, a 401 rebuild, a
/// tool the bundle lacks, a transport just closed) takes the actor's path.
#[derive(Default)]
pub struct Lanes(std::sync::RwLock<LaneMap>);

/// workspace → bundle → its ready session (looked up by `&str`, no key
/// is built per call).
type LaneMap = std::collections::HashMap<String, std::collections::HashMap<String, Arc<Live>>>;

impl Lanes {
    pub fn publish(&self, workspace: &str, name: &str, live: Option<Arc<Live>>) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        match live {
            Some(live) => {
                map.entry(workspace.to_string())
                    .or_default()
                    .insert(name.to_string(), live);
            }
            None => {
                if let Some(bundles) = map.get_mut(workspace) {
                    bundles.remove(name);
                    if bundles.is_empty() {
                        map.remove(workspace);
                    }
                }
            }
        }
    }

    pub fn get(&self, workspace: &str, name: &str) -> Option<Arc<Live>> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(workspace)?.get(name).cloned()
    }

    /// The ready sessions of a workspace, by bundle name.
    pub fn all(&self, workspace: &str) -> Vec<(String, Arc<Live>)> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(workspace)
            .map(|bundles| {
                bundles
                    .iter()
                    .map(|(n, l)| (n.clone(), l.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
