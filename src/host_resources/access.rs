//! Access decisions for host-resources requests, and the audit log they are
//! written to (`state_dir/audit/WS.jsonl`, one JSON object per decision,
//! rotated like bundle logs).

use std::path::PathBuf;

use serde::Serialize;
use tokio::sync::mpsc;

use super::Requester;
use crate::logfile::RotatingLog;

/// What a bundle asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Read,
    List,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::List => "list",
        }
    }
}

/// The record of one decision (also one audit log line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccessDecision {
    pub permitted: bool,
    /// `bundle:WS/NAME`
    pub principal: String,
    pub action: Action,
    /// `workspace:WS`: the FileStore the request is answered from.
    pub scope: String,
    pub resource: String,
    pub reason: String,
}

/// Decides whether `principal` may perform `action` on `resource` of the
/// FileStore of `workspace`. A bundle may read and list the files of the
/// workspace its connection was bound to, and nothing else.
pub fn project_access(
    resource: &str,
    principal: &Requester,
    action: Action,
    workspace: &str,
) -> AccessDecision {
    let permitted = principal.workspace == workspace;
    let reason = if permitted {
        format!(
            "bundles of workspace {workspace:?} may {} its files",
            action.as_str()
        )
    } else {
        format!(
            "the bundle belongs to workspace {:?}, not {workspace:?}",
            principal.workspace
        )
    };
    AccessDecision {
        permitted,
        principal: format!("bundle:{}/{}", principal.workspace, principal.bundle),
        action,
        scope: format!("workspace:{workspace}"),
        resource: resource.to_string(),
        reason,
    }
}

/// How long a decision may wait in memory for others to share its write.
const AUDIT_BATCH: std::time::Duration = std::time::Duration::from_millis(20);
const AUDIT_BATCH_BYTES: usize = 64 << 10;

/// Appends decisions to the workspace's audit log from a task of its own,
/// so the WorkspaceActor never waits on the disk; written within
/// [`AUDIT_BATCH`] of the decision.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::UnboundedSender<String>,
}

/// An audit line: the time, then the decision's fields (written out, not
/// `#[serde(flatten)]`, which goes through a map serializer on the hot
/// path of every host-resources request).
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    permitted: bool,
    principal: &'a str,
    action: Action,
    scope: &'a str,
    resource: &'a str,
    reason: &'a str,
}

impl AuditLog {
    pub fn start(path: PathBuf, max_bytes: u64, keep: u32) -> AuditLog {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            let mut log = match RotatingLog::open(&path, max_bytes, keep).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(path = %path.display(), "cannot open the audit log: {e}; access decisions are only traced");
                    while let Some(line) = rx.recv().await {
                        tracing::info!(target: "audit", "{line}");
                    }
                    return;
                }
            };
            // Lines are written in batches: what arrives within
            // AUDIT_BATCH of a first line (or 64 KiB) is one write and one
            // flush, not one trip to the blocking pool per decision.
            let mut batch = String::new();
            while let Some(line) = rx.recv().await {
                batch.push_str(&line);
                let until = tokio::time::Instant::now() + AUDIT_BATCH;
                let mut open = true;
                while batch.len() < AUDIT_BATCH_BYTES {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(line)) => {
                            batch.push('\n');
                            batch.push_str(&line);
                        }
                        Ok(None) => {
                            open = false;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Err(e) = log.append(&batch).await {
                    tracing::error!(path = %path.display(), "audit log write failed: {e}");
                }
                let _ = log.flush().await;
                batch.clear();
                if !open {
                    break;
                }
            }
        });
        AuditLog { tx }
    }

    pub fn record(&self, decision: &AccessDecision) {
        let time = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let line = Line {
            time,
            permitted: decision.permitted,
            principal: &decision.principal,
            action: decision.action,
            scope: &decision.scope,
            resource: &decision.resource,
            reason: &decision.reason,
        };
        if let Ok(line) = serde_json::to_string(&line) {
            let _ = self.tx.send(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_may_access_only_its_own_workspace() {
        let who = Requester {
            workspace: "a".into(),
            bundle: "reader".into(),
        };
        let ok = project_access(
            "files://fl_0123456789abcdef01234567",
            &who,
            Action::Read,
            "a",
        );
        assert!(ok.permitted);
        assert_eq!(
            (ok.principal.as_str(), ok.scope.as_str()),
            ("bundle:a/reader", "workspace:a")
        );
        let no = project_access("files://*", &who, Action::List, "b");
        assert!(!no.permitted);
        assert!(
            no.reason.contains("\"a\"") && no.reason.contains("\"b\""),
            "{}",
            no.reason
        );
    }

    #[tokio::test]
    async fn decisions_are_appended_to_the_audit_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit/w.jsonl");
        let log = AuditLog::start(path.clone(), 1 << 20, 1);
        let who = Requester {
            workspace: "w".into(),
            bundle: "b".into(),
        };
        log.record(&project_access("files://x", &who, Action::Read, "w"));
        log.record(&project_access("files://*", &who, Action::List, "other"));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 2 {
                break text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "audit lines never written: {text:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(first["permitted"], true);
        assert_eq!(first["action"], "read");
        assert!(first["time"].as_str().unwrap().ends_with('Z'));
        let second: serde_json::Value =
            serde_json::from_str(lines.lines().nth(1).unwrap()).unwrap();
        assert_eq!(
            (second["permitted"].as_bool(), second["scope"].as_str()),
            (Some(false), Some("workspace:other"))
        );
    }
}
