//! `bundlevisor mcp [-w WS] [--profile P] [--bundle NAME]`: the workspace's
//! bundles as one MCP server on stdin/stdout, or one bundle exactly as
//! itself (docs/gateway.md). The daemon serves the
//! session: on the agent's stdin and stdout themselves, which this process
//! hands over, or relayed by it ([`crate::client::relay`]). Logs go to
//! stderr only; stdout carries MCP.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::protocol::{AttachParams, DEFAULT_WORKSPACE};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// A `[[profile]]` of the daemon config: which bundles and tools are exposed.
    #[arg(long)]
    profile: Option<String>,
    /// Serve this one bundle exactly as itself (its own tool and prompt
    /// names and resource URIs): a drop-in for a per-server stdio bridge.
    #[arg(long)]
    bundle: Option<String>,
    /// How long a call waits for a bundle that is starting or restarting.
    #[arg(long, value_parser = humantime::parse_duration)]
    wait_ready: Option<Duration>,
    /// Relay every message instead of handing stdin and stdout to the
    /// daemon (the default when both are pipes or sockets).
    #[arg(long)]
    relay: bool,
}

pub fn run(socket: PathBuf, args: &Args) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // The agent usually keeps this in a file: colours only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .fmt_fields(crate::text::PrintableFields)
        .init();
    // One agent, one daemon connection: a single thread relays without
    // waking another (docs/performance.md).
    let runtime = match super::runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let params = AttachParams {
        workspace: args.workspace.clone(),
        profile: args.profile.clone(),
        bundle: args.bundle.clone(),
        wait_ready_ms: args.wait_ready.map(|d| d.as_millis() as u64),
        // From the environment only: a command line is visible to every user.
        token: match std::env::var("BUNDLEVISOR_TOKEN") {
            Ok(t) if t.is_empty() => {
                eprintln!("error: BUNDLEVISOR_TOKEN is set but empty; give the token, or unset it to attach without one");
                return ExitCode::from(2);
            }
            Ok(t) => Some(crate::protocol::TokenText(t)),
            Err(_) => None,
        },
        resume: None,
        handover: !args.relay && crate::stdio::can_hand_over(),
    };
    match runtime.block_on(crate::client::relay::relay(&socket, params)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", crate::text::printable(&e.to_string()));
            ExitCode::from(2)
        }
    }
}
