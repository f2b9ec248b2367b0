//! The status board: the latest status of every bundle, written by the
//! BundleActors at each transition and read by the control server without
//! a round trip through the actor tree. Every transition is also published
//! as an [`Event`] on a broadcast channel (install and restart wait on it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use tokio::sync::broadcast;

use crate::protocol::{BundleStatus, EventKind, LifecycleEvent};

/// Lifecycle events are published as they happen.
pub type Event = LifecycleEvent;

struct Entry {
    status: BundleStatus,
    ready_since: Option<Instant>,
}

#[derive(Default)]
struct Inner {
    bundles: BTreeMap<(String, String), Entry>,
    workspaces: BTreeSet<String>,
    counts: BTreeMap<(String, String), Counts>,
}

/// What happened to a bundle since the daemon started (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Starts after the first one.
    pub restarts: u64,
    /// Exits nobody asked for, other than a clean exit (code 0).
    pub crashes: u64,
    starts: u64,
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
    /// Records a bundle's status and publishes the event that led to it.
    pub fn publish(&self, status: BundleStatus, ready_since: Option<Instant>, event: Event) {
        self.update(status, ready_since);
        self.emit(event);
    }

    /// Records a bundle's status without an event (a detail changed, not
    /// its state).
    pub fn update(&self, status: BundleStatus, ready_since: Option<Instant>) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.workspaces.insert(status.workspace.clone());
        let key = (status.workspace.clone(), status.name.clone());
        inner.bundles.insert(
            key,
            Entry {
                status,
                ready_since,
            },
        );
    }

    /// Publishes an event that changes no status (installed, uninstalled,
    /// manifest_rejected). No subscriber is fine.
    pub fn emit(&self, event: Event) {
        if matches!(event.kind, EventKind::Starting | EventKind::Exited) {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            let counts = inner
                .counts
                .entry((event.workspace.clone(), event.name.clone()))
                .or_default();
            if event.kind == EventKind::Starting {
                counts.restarts += u64::from(counts.starts > 0);
                counts.starts += 1;
            } else if event.exit.as_ref().is_none_or(|e| e.code != Some(0)) {
                counts.crashes += 1;
            }
        }
        let _ = self.events.send(event);
    }

    /// Restarts and crashes of every installed bundle.
    pub fn counts(&self) -> BTreeMap<(String, String), Counts> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        inner
            .counts
            .iter()
            .filter(|(key, _)| inner.bundles.contains_key(*key))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    pub fn remove(&self, workspace: &str, name: &str) {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let key = (workspace.to_string(), name.to_string());
        inner.bundles.remove(&key);
        inner.counts.remove(&key);
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
