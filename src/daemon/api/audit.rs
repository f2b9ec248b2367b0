//! Reading the audit log (`bundlevisor audit`): the lines of the
//! workspaces' `STATE_DIR/audit/WS.jsonl` files (and their rotated
//! `WS.jsonl.N`), oldest first, filtered — agents' calls through the
//! gateway and bundles' host-resources decisions alike.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Api, ApiError};
use crate::protocol::AuditParams;

/// Lines answered when the caller does not say.
const DEFAULT_LIMIT: u32 = 100;
/// Lines answered at most.
const MAX_LIMIT: u32 = 10_000;

/// A workspace's audit files, oldest first (`WS.jsonl.KEEP` … `WS.jsonl`).
fn files_of(dir: &Path, workspace: &str) -> Vec<PathBuf> {
    let current = format!("{workspace}.jsonl");
    let mut rotated: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u32 = name
                .strip_prefix(&current)?
                .strip_prefix('.')?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    files.push(dir.join(current));
    files
}

/// The workspaces that have an audit log.
fn workspaces(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".jsonl").map(str::to_string)
        })
        .collect();
    found.sort();
    found
}

/// Whether an audit line passes every filter of `p` (`since`: Unix
/// seconds, or none).
fn matches(line: &Value, p: &AuditParams, since: Option<std::time::SystemTime>) -> bool {
    let text = |key: &str| line.get(key).and_then(Value::as_str);
    if let Some(principal) = &p.principal {
        let wanted = if principal.contains(':') {
            principal.clone()
        } else {
            format!("token:{principal}")
        };
        if text("principal") != Some(wanted.as_str()) {
            return false;
        }
    }
    if let Some(bundle) = &p.bundle {
        let own = text("bundle").or_else(|| {
            // A host-resources decision names its bundle in the principal.
            text("principal")?
                .strip_prefix("bundle:")?
                .split('/')
                .nth(1)
        });
        if own != Some(bundle.as_str()) {
            return false;
        }
    }
    if p.action
        .as_deref()
        .is_some_and(|a| text("action") != Some(a))
    {
        return false;
    }
    if let Some(outcome) = &p.outcome {
        let permitted = line.get("permitted").and_then(Value::as_bool);
        let ok = match outcome.as_str() {
            "denied" => permitted == Some(false),
            other => text("outcome") == Some(other),
        };
        if !ok {
            return false;
        }
    }
    if let Some(since) = since {
        let at = text("time").and_then(|t| humantime::parse_rfc3339_weak(t).ok());
        if at.is_none_or(|at| at < since) {
            return false;
        }
    }
    true
}

impl Api {
    /// The audit lines `p` asks for, oldest first (the newest `limit`).
    pub async fn audit(&self, p: AuditParams) -> Result<Vec<Value>, ApiError> {
        if let Some(ws) = &p.workspace {
            crate::names::check_name("workspace", ws).map_err(ApiError::InvalidParams)?;
        }
        let limit = p.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT) as usize;
        let dir = self.shared.config.state_dir.join("audit");
        let since = p
            .since_secs
            .map(|s| std::time::SystemTime::now() - std::time::Duration::from_secs(s));
        tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let spaces = match &p.workspace {
                Some(ws) => vec![ws.clone()],
                None => workspaces(&dir),
            };
            // The newest `limit` of each workspace, then of them all.
            let mut lines: Vec<(String, Value)> = Vec::new();
            for ws in spaces {
                let mut kept: VecDeque<(String, Value)> = VecDeque::with_capacity(limit);
                for file in files_of(&dir, &ws) {
                    let Ok(opened) = std::fs::File::open(&file) else {
                        continue;
                    };
                    for line in std::io::BufReader::new(opened)
                        .lines()
                        .map_while(Result::ok)
                    {
                        let Ok(value) = serde_json::from_str::<Value>(&line) else {
                            continue;
                        };
                        if !matches(&value, &p, since) {
                            continue;
                        }
                        let time = value
                            .get("time")
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        if kept.len() == limit {
                            kept.pop_front();
                        }
                        kept.push_back((time.to_string(), value));
                    }
                }
                lines.extend(kept);
            }
            // Several workspaces' lines, in time order.
            lines.sort_by(|a, b| a.0.cmp(&b.0));
            let skip = lines.len().saturating_sub(limit);
            lines.into_iter().skip(skip).map(|(_, v)| v).collect()
        })
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn filters_match_agents_calls_and_bundles_decisions() {
        let call = json!({"time": "2026-11-26T10:00:00.000Z", "permitted": true,
            "principal": "token:ci", "action": "tools/call", "bundle": "github",
            "name": "create_issue", "outcome": "ok"});
        let refused = json!({"time": "2026-11-26T10:00:01.000Z", "permitted": false,
            "principal": "token:ci", "action": "tools/call", "bundle": "github",
            "name": "delete_repo", "outcome": "refused"});
        let host = json!({"time": "2026-11-26T10:00:02.000Z", "permitted": true,
            "principal": "bundle:default/reader", "action": "read", "resource": "files://x"});
        let with = |f: fn(&mut AuditParams)| {
            let mut p = AuditParams::default();
            f(&mut p);
            [&call, &refused, &host]
                .iter()
                .filter(|l| matches(l, &p, None))
                .count()
        };
        assert_eq!(with(|_| {}), 3);
        assert_eq!(with(|p| p.principal = Some("ci".into())), 2);
        assert_eq!(with(|p| p.outcome = Some("refused".into())), 1);
        assert_eq!(with(|p| p.outcome = Some("denied".into())), 1);
        assert_eq!(with(|p| p.bundle = Some("reader".into())), 1);
        assert_eq!(with(|p| p.action = Some("tools/call".into())), 2);
        let later = humantime::parse_rfc3339("2026-11-26T10:00:01Z").unwrap();
        let p = AuditParams::default();
        assert!(!matches(&call, &p, Some(later)) && matches(&host, &p, Some(later)));
    }

    #[test]
    fn rotated_files_come_first_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["w.jsonl", "w.jsonl.1", "w.jsonl.2", "wx.jsonl", "w.jsonl.x"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let names: Vec<String> = files_of(dir.path(), "w")
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["w.jsonl.2", "w.jsonl.1", "w.jsonl"]);
        assert_eq!(workspaces(dir.path()), ["w", "wx"]);
    }
}
