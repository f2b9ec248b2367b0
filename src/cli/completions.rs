//! `bundlevisor completions bash|zsh|fish` and `bundlevisor man`: shell
//! completions and a man page, generated from the clap definitions (so they
//! never drift from the real command line). Neither needs the daemon.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// The command line as users see it: hidden (internal) subcommands left
/// out, which clap_complete would otherwise offer.
fn visible_command() -> clap::Command {
    let full = super::Cli::command();
    let visible: Vec<clap::Command> = full
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .cloned()
        .collect();
    let mut command = clap::Command::new("bundlevisor")
        .version(env!("CARGO_PKG_VERSION"))
        .args(full.get_arguments().cloned())
        .subcommands(visible);
    if let Some(about) = full.get_about() {
        command = command.about(about.clone());
    }
    command
}

/// Prints the completion script for `shell` on stdout.
pub fn run(args: &Args) -> ExitCode {
    let mut command = visible_command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "bundlevisor", &mut out);
    print(&out)
}

/// Writes generated text to stdout; a closed pipe (`| head`) is not an error.
fn print(text: &[u8]) -> ExitCode {
    match std::io::stdout().write_all(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Prints the man page (roff) on stdout: `bundlevisor man > bundlevisor.1`.
pub fn man() -> ExitCode {
    let page = clap_mangen::Man::new(visible_command());
    let mut out = Vec::new();
    if let Err(e) = page.render(&mut out) {
        eprintln!("error: cannot render the man page: {e}");
        return ExitCode::from(2);
    }
    print(&out)
}
