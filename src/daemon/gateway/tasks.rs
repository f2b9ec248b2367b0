//! Tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension of MCP
//! 2026-07-28) of bundles, as the gateway hands them to agents: a bundle's
//! task id is never shown; the agent gets one of the gateway's, made of
//! 128 random bits, which names the bundle and its id here, and only for
//! the agent (token) it was handed to. `tasks/get`, `tasks/update` and
//! `tasks/cancel` are routed by it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::AgentKey;

/// How long a task id stays routable after it was handed out or last
/// used, unless the bundle's `ttlMs` says longer.
const KEPT: Duration = Duration::from_secs(3600);

/// At most this many routes per endpoint (HTTP) or connection (stdio):
/// the oldest goes first.
const MAX_ROUTES: usize = 10_000;

/// Where a task id the gateway handed out leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRoute {
    pub bundle: String,
    /// The bundle's own task id.
    pub id: String,
}

struct Entry {
    owner: Option<AgentKey>,
    route: TaskRoute,
    until: Instant,
}

/// The task routes of one endpoint (HTTP) or connection (stdio).
#[derive(Default)]
pub struct Tasks(Mutex<HashMap<String, Entry>>);

impl Tasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id an agent gets for a bundle's task (kept `ttl` at least).
    pub fn hand_out(
        &self,
        owner: Option<AgentKey>,
        route: TaskRoute,
        ttl: Option<Duration>,
    ) -> String {
        let id = super::new_state();
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, e| e.until > now);
        if map.len() >= MAX_ROUTES {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.until)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        let until = now + ttl.unwrap_or_default().max(KEPT);
        map.insert(
            id.clone(),
            Entry {
                owner,
                route,
                until,
            },
        );
        id
    }

    /// Where the id leads, for the agent that holds it.
    pub fn route(&self, id: &str, owner: Option<&AgentKey>) -> Option<TaskRoute> {
        let mut map = self.lock();
        let entry = map
            .get_mut(id)
            .filter(|e| e.owner.as_ref() == owner && e.until > Instant::now())?;
        entry.until = entry.until.max(Instant::now() + KEPT);
        Some(entry.route.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_leads_to_its_bundle_for_its_owner_only() {
        let tasks = Tasks::default();
        let route = TaskRoute {
            bundle: "tasker".into(),
            id: "b-1".into(),
        };
        let mine = Some(AgentKey("token-a".into()));
        let id = tasks.hand_out(mine.clone(), route.clone(), None);
        assert_eq!(id.len(), 32, "{id}");
        assert_ne!(id, "b-1");
        assert_eq!(tasks.route(&id, mine.as_ref()), Some(route));
        assert_eq!(tasks.route(&id, Some(&AgentKey("token-b".into()))), None);
        assert_eq!(tasks.route("b-1", mine.as_ref()), None);
    }
}
