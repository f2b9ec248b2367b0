//! `bundlevisor status [-w WS] [--json] [--watch [--interval D]]`

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::{print_json, Client, ClientError};
use crate::protocol::{StatusParams, StatusResult};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the documented JSON shape instead of a table (with --watch:
    /// one JSON object per line and interval).
    #[arg(long)]
    json: bool,
    /// Redraw the table (with memory and calls per second) until Ctrl-C;
    /// on a terminal in place, otherwise one plain table per interval.
    #[arg(long)]
    watch: bool,
    /// How often --watch refreshes.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Only this workspace (an error if the daemon knows no such workspace).
    #[arg(short, long)]
    workspace: Option<String>,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    if args.watch {
        return watch(client, args).await;
    }
    let status: StatusResult = client
        .call::<crate::protocol::typed::Status>(
            StatusParams {
                // Scripts get memory and CPU too (a few small reads a
                // bundle), and each sandbox's path lists.
                usage: args.json,
                paths: args.json,
                workspace: args.workspace.clone(),
            },
            |_| {},
        )
        .await?;
    if args.json {
        print_json(&status)?;
    } else {
        out!("{}", table(&status));
    }
    Ok(ExitCode::SUCCESS)
}

/// Terminal control: clear the screen from the top, hide and show the cursor.
const REDRAW: &str = "\x1b[H\x1b[2J";
const HIDE_CURSOR: &str = "\x1b[?25l";
const SHOW_CURSOR: &str = "\x1b[?25h";

async fn watch(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let tty = std::io::stdout().is_terminal() && !args.json;
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| ClientError::Protocol(format!("cannot watch for Ctrl-C: {e}")))?;
    let mut ticker = tokio::time::interval(args.interval.max(Duration::from_millis(50)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut before: Option<(Instant, CallCounts)> = None;
    let mut cpu_before: Option<(Instant, CallCounts)> = None;
    let mut out = std::io::stdout();
    if tty {
        let _ = write!(out, "{HIDE_CURSOR}");
    }
    let ended = loop {
        tokio::select! {
            _ = interrupt.recv() => break Ok(()),
            _ = ticker.tick() => {}
        }
        let params = StatusParams {
            usage: true,
            paths: false,
            workspace: args.workspace.clone(),
        };
        // Ctrl-C ends the watch even while the daemon is slow to answer.
        let status: StatusResult = tokio::select! {
            _ = interrupt.recv() => break Ok(()),
            answer = client.call::<crate::protocol::typed::Status>(params, |_| {}) => match answer {
                Ok(s) => s,
                Err(e) => break Err(e),
            },
        };
        let now = Instant::now();
        let calls: CallCounts = status
            .bundles
            .iter()
            .map(|b| {
                let calls = b.usage.as_ref().map_or(0, |u| u.calls);
                ((b.workspace.clone(), b.name.clone()), calls)
            })
            .collect();
        let rates = per_second(before.as_ref(), now, &calls);
        before = Some((now, calls));
        // CPU time of each bundle's tree (µs), as a share of one CPU.
        let cpu: CallCounts = status
            .bundles
            .iter()
            .filter_map(|b| {
                let usec = b.usage.as_ref()?.cpu_usec?;
                Some(((b.workspace.clone(), b.name.clone()), usec))
            })
            .collect();
        let cpu_share = per_second(cpu_before.as_ref(), now, &cpu);
        cpu_before = Some((now, cpu));
        let text = if args.json {
            serde_json::to_string(&status).map_err(|e| ClientError::Protocol(e.to_string()))? + "\n"
        } else {
            let heading = format!(
                "bundlevisor {} (pid {}, up {}): {} bundles, every {}; Ctrl-C to quit",
                status.daemon.version,
                status.daemon.pid,
                uptime(Some(status.daemon.uptime_secs)),
                status.bundles.len(),
                humantime::format_duration(args.interval)
            );
            format!("{heading}\n\n{}", watch_table(&status, &rates, &cpu_share))
        };
        let written = if tty {
            write!(out, "{REDRAW}{text}")
        } else if args.json {
            write!(out, "{text}")
        } else {
            writeln!(out, "{text}")
        };
        if written.and_then(|_| out.flush()).is_err() {
            // The reader went away (a closed pipe): nothing more to show.
            break Ok(());
        }
    };
    if tty {
        let _ = writeln!(out, "{SHOW_CURSOR}");
        let _ = out.flush();
    }
    ended.map(|_| ExitCode::SUCCESS)
}

/// Tool calls so far, by (workspace, bundle).
type CallCounts = HashMap<(String, String), u64>;

/// Calls per second of each bundle since the previous refresh (none on the
/// first one).
fn per_second(
    before: Option<&(Instant, CallCounts)>,
    now: Instant,
    calls: &CallCounts,
) -> HashMap<(String, String), f64> {
    let Some((then, previous)) = before else {
        return HashMap::new();
    };
    let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
    calls
        .iter()
        .map(|(key, n)| {
            let delta = n.saturating_sub(previous.get(key).copied().unwrap_or(*n));
            (key.clone(), delta as f64 / secs)
        })
        .collect()
}

/// Memory of each bundle's whole tree (its cgroup; its own RSS without
/// one), its CPU use as a share of one CPU, and its calls per second.
fn watch_table(
    status: &StatusResult,
    rates: &HashMap<(String, String), f64>,
    cpu: &HashMap<(String, String), f64>,
) -> String {
    let rows = status.bundles.iter().map(|b| {
        let key = (b.workspace.clone(), b.name.clone());
        let memory = b
            .usage
            .as_ref()
            .and_then(|u| u.memory_bytes.or(u.rss_bytes));
        [
            memory
                .map(|r| format!("{:.1} MiB", r as f64 / 1048576.0))
                .unwrap_or_else(|| "-".into()),
            cpu.get(&key)
                .map(|usec_per_sec| format!("{:.0}%", usec_per_sec / 1e4))
                .unwrap_or_else(|| "-".into()),
            rates
                .get(&key)
                .map(|r| format!("{r:.1}"))
                .unwrap_or_else(|| "-".into()),
        ]
    });
    bundle_table(status, ["MEMORY", "CPU", "CALLS/S"], rows)
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

/// The first line of an error, escaped (it is often what a bundle said).
fn first_line(error: Option<&str>) -> String {
    error
        .map(|e| printable_line(e.lines().next().unwrap_or("")).into_owned())
        .unwrap_or_else(|| "-".into())
}

fn table(status: &StatusResult) -> String {
    let rows = status.bundles.iter().map(|b| [b.tools.to_string()]);
    bundle_table(status, ["TOOLS"], rows)
}

/// One row per bundle: workspace, name, state, pid, uptime, restarts, the
/// `extra` columns, and the first line of the last error.
fn bundle_table<const N: usize>(
    status: &StatusResult,
    extra: [&str; N],
    extra_cells: impl Iterator<Item = [String; N]>,
) -> String {
    let mut header: Vec<String> = ["WORKSPACE", "BUNDLE", "STATE", "PID", "UPTIME", "RESTARTS"]
        .map(String::from)
        .to_vec();
    header.extend(extra.map(String::from));
    header.push("LAST ERROR".into());
    let mut rows = vec![header];
    for (b, cells) in status.bundles.iter().zip(extra_cells) {
        let mut row = vec![
            printable_line(&b.workspace).into_owned(),
            printable_line(&b.name).into_owned(),
            state_cell(b),
            b.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            uptime(b.uptime_secs),
            b.restarts.to_string(),
        ];
        row.extend(cells);
        // A ready bundle's kept error says how long ago it was.
        let ago = b
            .last_error_at
            .filter(|_| b.state == crate::protocol::BundleState::Ready)
            .map(|at| (crate::clock::unix_secs() - at).max(0) as u64);
        row.push(match ago {
            Some(secs) => format!(
                "({} ago) {}",
                uptime(Some(secs)),
                first_line(b.last_error.as_deref())
            ),
            None => first_line(b.last_error.as_deref()),
        });
        rows.push(row);
    }
    aligned(&rows, status.bundles.is_empty())
}

/// A bundle's state, with an unpack's progress: `unpacking 5000/17039`
/// for an archive being installed, `ready (unpacking 5000/17039)` for an
/// upgrade being unpacked beside the running version.
fn state_cell(b: &crate::protocol::BundleStatus) -> String {
    match b.unpacking {
        None => b.state.as_str().to_string(),
        Some(p) if b.state == crate::protocol::BundleState::Unpacking => {
            format!("unpacking {}/{}", p.entries, p.of)
        }
        Some(p) => format!("{} (unpacking {}/{})", b.state.as_str(), p.entries, p.of),
    }
}

/// Rows as columns aligned on the widest cell (the last column is not padded).
fn aligned(rows: &[Vec<String>], empty: bool) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
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
    if empty {
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
                metrics_addr: None,
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
                last_error_at: None,
                source: "/b/demo".into(),
                sandbox: None,
                usage: None,
                archive: None,
                mcp: None,
                unpacking: None,
                secret_refs: Vec::new(),
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

    #[test]
    fn calls_per_second_come_from_the_difference_between_refreshes() {
        let t0 = Instant::now();
        let key = ("w".to_string(), "b".to_string());
        let new = ("w".to_string(), "new".to_string());
        let first: CallCounts = [(key.clone(), 10)].into();
        assert!(
            per_second(None, t0, &first).is_empty(),
            "no rate on the first refresh"
        );
        let second: CallCounts = [(key.clone(), 30), (new.clone(), 7)].into();
        let rates = per_second(Some(&(t0, first)), t0 + Duration::from_secs(2), &second);
        assert_eq!(rates[&key], 10.0);
        assert_eq!(
            rates[&new], 0.0,
            "a bundle seen for the first time has no rate yet"
        );
    }
}
