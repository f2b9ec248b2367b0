//! `bundlevisor status [--json]`

use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::{method, StatusResult};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the documented JSON shape instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let status: StatusResult = client
        .request(method::STATUS, serde_json::json!({}), |_| {})
        .await?;
    if args.json {
        print_json(&status)?;
    } else {
        print!("{}", table(&status));
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn uptime(secs: Option<u64>) -> String {
    match secs {
        None => "-".into(),
        Some(s) if s < 60 => format!("{s}s"),
        Some(s) if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        Some(s) if s < 86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        Some(s) => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn table(status: &StatusResult) -> String {
    let mut rows = vec![[
        "WORKSPACE",
        "BUNDLE",
        "STATE",
        "PID",
        "UPTIME",
        "RESTARTS",
        "TOOLS",
        "LAST ERROR",
    ]
    .map(String::from)
    .to_vec()];
    for b in &status.bundles {
        rows.push(vec![
            b.workspace.clone(),
            b.name.clone(),
            b.state.as_str().to_string(),
            b.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            uptime(b.uptime_secs),
            b.restarts.to_string(),
            b.tools.to_string(),
            b.last_error
                .as_deref()
                .map(|e| e.lines().next().unwrap_or("").to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == row.len() {
                    c.clone()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if status.bundles.is_empty() {
        out.push_str("(no bundles installed; `bundlevisor install PATH` adds one)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{BundleState, BundleStatus, DaemonInfo};

    #[test]
    fn table_aligns_columns_and_shows_the_first_error_line() {
        let status = StatusResult {
            daemon: DaemonInfo {
                version: "0".into(),
                pid: 1,
                uptime_secs: 0,
                socket: "s".into(),
                state_dir: "d".into(),
            },
            workspaces: vec!["default".into()],
            bundles: vec![BundleStatus {
                workspace: "default".into(),
                name: "demo".into(),
                version: Some("0.1.0".into()),
                state: BundleState::Failed,
                pid: None,
                uptime_secs: None,
                restarts: 2,
                tools: 0,
                last_error: Some("process exited (exit code 3)\nmore".into()),
                source: "/b/demo".into(),
                sandbox: None,
            }],
        };
        let text = table(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[1].starts_with("default    demo    failed"), "{text}");
        assert!(lines[1].ends_with("process exited (exit code 3)"), "{text}");
        assert_eq!(lines[0].find("STATE"), lines[1].find("failed"));
        assert_eq!(uptime(Some(3725)), "1h2m");
    }
}
