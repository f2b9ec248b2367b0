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
    Read = 0,
    List = 1,
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

/// `at` as an audit line's time (RFC 3339, UTC, milliseconds) at the end
/// of `line`. The part to the second is made once a second (a thread's
/// own copy): formatting it whole cost every audited call 2,500
/// instructions.
pub fn push_time(line: &mut String, at: std::time::SystemTime) {
    use std::cell::RefCell;
    thread_local! {
        static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (secs, millis) = (since.as_secs(), since.subsec_millis());
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            let whole = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            // `YYYY-MM-DDTHH:MM:SS`, without its `Z`.
            *text = humantime::format_rfc3339_seconds(whole).to_string();
            text.pop();
            *second = secs;
        }
        line.push_str(text);
    });
    let digits = [millis / 100, millis / 10 % 10, millis % 10];
    line.push('.');
    line.extend(digits.map(|d| char::from(b'0' + d as u8)));
    line.push('Z');
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

/// A decision for every resource of one principal, action and workspace
/// (it depends on nothing else), with the fixed parts of its audit lines
/// already encoded: the WorkspaceActor makes one per bundle and action,
/// so a request's audit line costs the time and its resource.
pub struct Standing {
    pub decision: AccessDecision,
    /// `"permitted":…,"principal":…,"action":…,"scope":…,"resource":`
    head: String,
    /// `,"reason":…}`
    tail: String,
}

impl Standing {
    pub fn new(principal: &Requester, action: Action, workspace: &str) -> Standing {
        Standing::of(project_access("", principal, action, workspace))
    }

    fn of(decision: AccessDecision) -> Standing {
        let json = |s: &str| serde_json::to_string(s).expect("a string encodes");
        let head = format!(
            r#""permitted":{},"principal":{},"action":"{}","scope":{},"resource":"#,
            decision.permitted,
            json(&decision.principal),
            decision.action.as_str(),
            json(&decision.scope)
        );
        let tail = format!(r#","reason":{}}}"#, json(&decision.reason));
        Standing {
            decision,
            head,
            tail,
        }
    }
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

    /// Appends a line already encoded as one JSON object (the gateway's
    /// audit of agents' calls).
    pub fn record_line(&self, line: String) {
        let _ = self.tx.send(line);
    }

    pub fn record(&self, decision: &AccessDecision) {
        self.record_for(&Standing::of(decision.clone()), &decision.resource);
    }

    /// Records `standing`'s decision on `resource`: one JSON line, the
    /// time first, then the decision's fields.
    pub fn record_for(&self, standing: &Standing, resource: &str) {
        let mut line =
            String::with_capacity(48 + standing.head.len() + resource.len() + standing.tail.len());
        line.push_str(r#"{"time":""#);
        push_time(&mut line, std::time::SystemTime::now());
        line.push_str(r#"","#);
        line.push_str(&standing.head);
        line.push_str(&serde_json::to_string(resource).expect("a string encodes"));
        line.push_str(&standing.tail);
        let _ = self.tx.send(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The time is humantime's RFC 3339 with milliseconds, also across
    /// seconds and for whole and late milliseconds.
    #[test]
    fn an_audit_time_is_rfc3339_with_milliseconds() {
        let base = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        for offset_ms in [0, 7, 45, 999, 1_000, 1_001, 86_400_123, 3_000] {
            let at = base + std::time::Duration::from_millis(offset_ms);
            let mut line = String::from("x");
            push_time(&mut line, at);
            let expected = humantime::format_rfc3339_millis(at).to_string();
            assert_eq!(line, format!("x{expected}"), "{offset_ms} ms");
        }
    }

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
        // A standing decision writes the same line, for any resource.
        log.record_for(&Standing::new(&who, Action::Read, "w"), "files://x");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let lines = loop {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().count() == 3 {
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
        assert_eq!(
            (&first["principal"], &first["scope"], &first["resource"]),
            (
                &json!("bundle:w/b"),
                &json!("workspace:w"),
                &json!("files://x")
            )
        );
        assert_eq!(
            first["reason"],
            "bundles of workspace \"w\" may read its files"
        );
        let third: serde_json::Value = serde_json::from_str(lines.lines().nth(2).unwrap()).unwrap();
        let without_time = |mut v: serde_json::Value| {
            v.as_object_mut().unwrap().remove("time");
            v
        };
        assert_eq!(without_time(third), without_time(first.clone()));

        assert!(first["time"].as_str().unwrap().ends_with('Z'));
        let second: serde_json::Value =
            serde_json::from_str(lines.lines().nth(1).unwrap()).unwrap();
        assert_eq!(
            (second["permitted"].as_bool(), second["scope"].as_str()),
            (Some(false), Some("workspace:other"))
        );
    }
}
