//! The command-line interface: `bundlevisor daemon` runs the daemon; every
//! other subcommand is a client of its control socket. One file per
//! subcommand; `anyhow` is used only here, at the edge.

/// `println!` for the CLI's output: a closed pipe (`| head`) ends the
/// command quietly with exit 0, as Unix tools do, instead of a panic.
macro_rules! outln {
    () => {
        $crate::cli::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the CLI's output (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!($($arg)*))
    };
}

mod audit;
mod auth;
mod call;
mod completions;
mod configure;
mod connect;
mod credentials;
mod daemon;
mod dashboard;
mod download;
mod events;
mod files;
mod install;
mod logs;
mod mcp;
mod metrics;
mod restart;
mod rotate_key;
mod status;
mod token;
mod tools;
mod uninstall;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::text::{printable, printable_line};

pub use crate::client::{Client, ClientError};

/// Default socket when neither --socket nor BUNDLEVISOR_SOCKET is given
/// (the example config's socket, relative to the current folder).
pub const DEFAULT_SOCKET: &str = ".bundlevisor/bundlevisor.sock";

#[derive(Parser, Debug)]
#[command(
    name = "bundlevisor",
    version,
    about = "Supervisor daemon for MCP bundles"
)]
pub struct Cli {
    /// Control socket of the daemon.
    #[arg(long, global = true, env = "BUNDLEVISOR_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon in the foreground.
    Daemon(daemon::Args),
    /// Show every bundle: state, pid, uptime, restarts, tools, last error
    /// (--watch: a live view with memory and calls per second).
    Status(status::Args),
    /// Install a bundle folder or manifest file and wait until it is ready.
    Install(install::Args),
    /// Run a new version of an installed bundle in its place (a folder,
    /// manifest, `.mcpb` or its URL; its manifest names the bundle) and
    /// wait until it is ready; one the install checks refuse leaves the
    /// running version running.
    Upgrade(install::Args),
    /// Stop and remove an installed bundle.
    Uninstall(uninstall::Args),
    /// Stop a bundle and start it again; waits until it is ready.
    Restart(restart::Args),
    /// Set user_config values (stored encrypted) and respawn the bundle;
    /// without KEY=VALUE, list its keys.
    Configure(configure::Args),
    /// Authorize a remote bundle (OAuth authorization code + PKCE through
    /// a loopback redirect); the bundle starts once it is done.
    Auth(auth::Args),
    /// List the tools of one bundle or of every bundle in a workspace.
    Tools(tools::Args),
    /// Call a tool of a bundle.
    Call(call::Args),
    /// Show the last lines a bundle wrote to stderr (-f to follow).
    Logs(logs::Args),
    /// Stream lifecycle events (installed, ready, exited, restarting, ...).
    Events(events::Args),
    /// Print the daemon's metrics (Prometheus text format).
    Metrics(metrics::Args),
    /// Replace the credential encryption key, re-sealing every stored
    /// user_config value and OAuth token in one transaction.
    RotateKey(rotate_key::Args),
    /// The bundles whose user_config values or OAuth tokens are stored
    /// (keys only, never values), installed or not.
    Credentials(credentials::Args),
    /// Workspace files that bundles read through host-resources.
    Files(files::Args),
    /// Access tokens of the HTTP gateway: create (shown once), ls, revoke.
    Token(token::Args),
    /// The audit log: agents' calls through the gateway, bundles'
    /// host-resources decisions.
    Audit(audit::Args),
    /// Serve a workspace's bundles as one MCP server on stdio (for agents).
    Mcp(mcp::Args),
    /// Print a one-time link that signs you in to the web dashboard
    /// (`[http] dashboard = true`).
    Dashboard(dashboard::Args),
    /// Add this daemon's gateway to an agent's MCP client (Claude Desktop,
    /// Claude Code, VS Code, Cursor) beside its other servers, or print
    /// the entry: over stdio, or over HTTP with a token made for it.
    Connect(connect::Args),
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions(completions::Args),
    /// Print the man page (roff): `bundlevisor man > bundlevisor.1`.
    Man,
    /// Internal: the helper that kills bundle groups when the daemon dies.
    #[command(name = "__reap", hide = true)]
    Reap {
        /// The state dir of the daemon it serves (informational).
        state_dir: Option<PathBuf>,
    },
}

impl Cli {
    fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
    }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Daemon(args) => return daemon::run(args),
        Command::Reap { .. } => return crate::bundle::reaper::run(),
        Command::Mcp(args) => return mcp::run(cli.socket(), args),
        Command::Completions(args) => return completions::run(args),
        Command::Man => return completions::man(),
        _ => {}
    }
    let runtime = match runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let socket = cli.socket();
    let result = runtime.block_on(async {
        let mut client = Client::connect(&socket).await?;
        match &cli.command {
            Command::Daemon(_)
            | Command::Reap { .. }
            | Command::Mcp(_)
            | Command::Completions(_)
            | Command::Man => unreachable!("handled above"),
            Command::Status(a) => status::run(&mut client, a).await,
            Command::Install(a) => install::run(&mut client, a, false).await,
            Command::Upgrade(a) => install::run(&mut client, a, true).await,
            Command::Uninstall(a) => uninstall::run(&mut client, a).await,
            Command::Restart(a) => restart::run(&mut client, a).await,
            Command::Configure(a) => configure::run(&mut client, a).await,
            Command::Auth(a) => auth::run(&mut client, a).await,
            Command::Tools(a) => tools::run(&mut client, a).await,
            Command::Call(a) => call::run(&mut client, a).await,
            Command::Logs(a) => logs::run(&mut client, a).await,
            Command::Events(a) => events::run(&mut client, a).await,
            Command::Metrics(a) => metrics::run(&mut client, a).await,
            Command::RotateKey(a) => rotate_key::run(&mut client, a).await,
            Command::Credentials(a) => credentials::run(&mut client, a).await,
            Command::Audit(a) => audit::run(&mut client, a).await,
            Command::Token(a) => token::run(&mut client, a).await,
            Command::Files(a) => files::run(&mut client, a).await,
            Command::Connect(a) => connect::run(&mut client, a, &socket).await,
            Command::Dashboard(a) => dashboard::run(&mut client, a).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // Error texts carry what bundles said (stderr, tool errors).
            eprintln!("error: {}", printable(&e.to_string()));
            match e {
                ClientError::Rpc(_) => ExitCode::from(1),
                _ => ExitCode::from(2),
            }
        }
    }
}

/// Builds a tokio runtime, or reports why it could not be built.
fn runtime(mut builder: tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, ExitCode> {
    builder.enable_all().build().map_err(|e| {
        eprintln!("error: cannot start the async runtime: {e}");
        ExitCode::from(2)
    })
}

/// Runs `request` behind a spinner on a terminal (nothing when piped);
/// the daemon's progress notifications become the spinner's message. The
/// spinner is gone before the caller prints the answer.
async fn with_spinner<R>(
    what: String,
    request: impl AsyncFnOnce(&mut dyn FnMut(&crate::protocol::Notification)) -> R,
) -> R {
    let spinner = crate::progress::spinner(what);
    let mut on_note = |note: &crate::protocol::Notification| {
        if note.method != crate::protocol::method::PROGRESS {
            return;
        }
        if let Ok(p) = serde_json::from_value::<crate::protocol::Progress>(note.params.clone()) {
            spinner.set_message(format!(
                "{}/{}: {} ({})",
                printable(&p.workspace),
                printable(&p.name),
                p.state.as_str(),
                printable_line(&p.message)
            ));
        }
    };
    request(&mut on_note).await
}

fn print_json(value: &impl serde::Serialize) -> Result<(), ClientError> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| ClientError::Protocol(e.to_string()))?;
    outln!("{text}");
    Ok(())
}

/// Writes the CLI's output to stdout. A reader that went away (`| head`)
/// ends the command at once with exit 0; any other write error with exit 2.
pub(crate) fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        exit_on_write_error(&e);
    }
}

/// Ends the process for an error writing stdout: quietly for a closed pipe.
pub(crate) fn exit_on_write_error(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: cannot write to stdout: {e}");
    std::process::exit(2);
}
