//! The status board: the latest status of every bundle, written by the
//! BundleActors at each transition and read by the control server without
//! a round trip through the actor tree. Every transition is also published
//! as an [`Event`] on a broadcast channel (install and restart wait on it).
//! The counters (`restarts` in the status, `crashes` beside it) are the
//! BundleActor's lifecycle's own: the board only keeps what it was told, so
//! `status` and the metrics cannot disagree.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio::sync::broadcast;

use crate::protocol::{BundleStatus, LifecycleEvent};

/// Lifecycle events are published as they happen.
pub type Event = LifecycleEvent;

struct Entry {
    status: BundleStatus,
    ready_since: Option<Instant>,
    crashes: u64,
}

#[derive(Default)]
struct Inner {
    bundles: BTreeMap<(String, String), Entry>,
    workspaces: BTreeSet<String>,
}

/// What happened to a bundle since the daemon started (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Starts after the first one, except a 401 session rebuild
    /// (`status.restarts`).
    pub restarts: u64,
    /// Stops nobody asked for: exits other than code 0, liveness kills,
    /// failed starts that are retried.
    pub crashes: u64,
}

#[derive(Clone)]
pub struct StatusBoard {
    inner: Arc<RwLock<Inner>>,
    events: broadcast::Sender<Event>,
}

impl Default for StatusBoard {
    fn default() -> Self {
        StatusBoard {
            inner: Arc::default(),
            events: broadcast::channel(1024).0,
        }
    }
}

impl StatusBoard {
    /// Records a bundle's status (its state, or a detail of it, changed).
    pub fn update(&self, status: BundleStatus, ready_since: Option<Instant>, crashes: u64) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(status.workspace.clone());
        let key = (status.workspace.clone(), status.name.clone());
        inner.bundles.insert(
            key,
            Entry {
                status,
                ready_since,
                crashes,
            },
        );
    }

    /// Lists an installed bundle as `starting` unless it is listed already
    /// (the daemon lists its installs before its socket answers).
    pub fn expect(&self, status: BundleStatus) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(status.workspace.clone());
        let key = (status.workspace.clone(), status.name.clone());
        inner.bundles.entry(key).or_insert(Entry {
            status,
            ready_since: None,
            crashes: 0,
        });
    }

    /// Publishes a lifecycle event. No subscriber is fine.
    pub fn emit(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// Restarts and crashes of every installed bundle.
    pub fn counts(&self) -> BTreeMap<(String, String), Counts> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .iter()
            .map(|(k, e)| {
                let counts = Counts {
                    restarts: u64::from(e.status.restarts),
                    crashes: e.crashes,
                };
                (k.clone(), counts)
            })
            .collect()
    }

    /// A bundle's counters as last published, to carry them over to the
    /// actor that replaces a panicked one.
    pub fn counters(&self, workspace: &str, name: &str) -> Option<(u32, u64)> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .get(&(workspace.to_string(), name.to_string()))
            .map(|e| (e.status.restarts, e.crashes))
    }

    pub fn remove(&self, workspace: &str, name: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .remove(&(workspace.to_string(), name.to_string()));
    }

    pub fn add_workspace(&self, workspace: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(workspace.to_string());
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn get(&self, workspace: &str, name: &str) -> Option<BundleStatus> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .bundles
            .get(&(workspace.to_string(), name.to_string()))
            .map(with_uptime)
    }

    /// Every bundle, ordered by workspace then name, with uptimes computed now.
    pub fn snapshot(&self) -> (Vec<String>, Vec<BundleStatus>) {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        (
            inner.workspaces.iter().cloned().collect(),
            inner.bundles.values().map(with_uptime).collect(),
        )
    }
}

fn with_uptime(entry: &Entry) -> BundleStatus {
    let mut status = entry.status.clone();
    status.uptime_secs = entry.ready_since.map(|t| t.elapsed().as_secs());
    status
}
