//! `bundlevisor daemon`: load the config, set up logging and signals, run.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Config file (TOML). Without it, defaults relative to the current folder.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormat {
    Human,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"))
        // rmcp's OAuth client logs the authorization code at debug: never
        // below info, whatever RUST_LOG says.
        .add_directive(
            "rmcp::transport::auth=info"
                .parse()
                .expect("a static directive parses"),
        );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: a journal or a log file gets plain
        // text, in which a raw ESC can only have come from a bug.
        .with_ansi(std::io::stderr().is_terminal())
        // Above the boot-reload bar when stderr is a terminal.
        .with_writer(crate::progress::LogWriter);
    match format {
        // Bundle-controlled fields (stderr lines, error texts) are escaped.
        LogFormat::Human => builder.fmt_fields(crate::text::PrintableFields).init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub fn run(args: &Args) -> ExitCode {
    // Before anything opens a file: the low descriptor numbers a bundle's
    // start hands its child in (bundle::spawn).
    let reserved = crate::bundle::spawn::reserve_slots();
    init_logging(args.log_format);
    if !reserved {
        tracing::debug!("descriptors 64 to 79 were taken at start: each bundle's start copies the daemon's descriptor table");
    }
    let config = match &args.config {
        Some(path) => Config::load(path),
        None => std::env::current_dir()
            .map_err(|source| crate::config::ConfigError::Read {
                path: PathBuf::from("."),
                source,
            })
            .and_then(|cwd| Config::from_toml("", &cwd)),
    };
    let config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", crate::text::printable(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    // One event-loop thread: a message between a bundle, the actors and the
    // control socket never has to wake a second worker thread, which on a
    // VM costs more than the work itself (docs/performance.md). Blocking
    // work (SQLite, manifests, sandbox preparation, large files) runs on the
    // blocking pool, and spawns come from this thread, which lives as long
    // as the daemon (what PR_SET_PDEATHSIG needs).
    let runtime = match super::runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let signals = shutdown.clone();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot install the SIGTERM handler: {e}"))?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
            signals.cancel();
        });
        crate::daemon::run(config, shutdown)
            .await
            .map_err(|e| e.to_string())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("error: {}", crate::text::printable(&e));
            ExitCode::from(1)
        }
    }
}
