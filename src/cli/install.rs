//! `bundlevisor install PATH|URL [--sha256 HEX] [-w WS]`, and `upgrade`
//! with the same arguments: waits until the bundle is ready. A URL is
//! downloaded by the CLI first (`download.rs`).

use std::path::PathBuf;
use std::process::ExitCode;

use super::{print_json, with_spinner, Client, ClientError};
use crate::protocol::{BundleResult, InstallParams, DEFAULT_WORKSPACE};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A bundle folder (with manifest.json), a manifest file, a `.mcpb`
    /// archive, or the https URL of one (with --sha256).
    path: PathBuf,
    /// The archive's SHA-256 (hex), required to install from a URL: the
    /// download is installed only if it matches.
    #[arg(long)]
    sha256: Option<String>,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Return once the install (or upgrade) is recorded, without waiting
    /// for ready.
    #[arg(long)]
    no_wait: bool,
    #[arg(long)]
    json: bool,
}

/// `upgrade`: the bundle runs in place of the installed one of its name.
pub async fn run(client: &mut Client, args: &Args, upgrade: bool) -> Result<ExitCode, ClientError> {
    let arg = args.path.to_string_lossy().into_owned();
    // Deleted once the daemon has installed (unpacked) it.
    let downloaded = if super::download::is_url(&arg) {
        Some(super::download::fetch(&arg, args.sha256.as_deref()).await?)
    } else {
        if args.sha256.is_some() {
            return Err(ClientError::Usage(
                "--sha256 checks a download: give the archive's URL, or drop --sha256 for a local path".into(),
            ));
        }
        None
    };
    // The daemon resolves the path, so make it absolute here.
    let path = match &downloaded {
        Some(d) => d.path.clone(),
        None => std::path::absolute(&args.path).unwrap_or_else(|_| args.path.clone()),
    };
    let params = InstallParams {
        path: path.display().to_string(),
        workspace: args.workspace.clone(),
        no_wait: args.no_wait,
    };
    let doing = if upgrade {
        "upgrading to"
    } else {
        "installing"
    };
    let what = format!("{doing} {}", printable_line(&path.display().to_string()));
    let result: BundleResult = with_spinner(what, async |on_note| match upgrade {
        true => {
            client
                .call::<crate::protocol::typed::Upgrade>(params, on_note)
                .await
        }
        false => {
            client
                .call::<crate::protocol::typed::Install>(params, on_note)
                .await
        }
    })
    .await?;
    drop(downloaded);
    if args.json {
        print_json(&result)?;
    } else {
        let b = &result.bundle;
        outln!(
            "{}/{} {} is {} (pid {}, {} tools)",
            printable_line(&b.workspace),
            printable_line(&b.name),
            printable_line(b.version.as_deref().unwrap_or("?")),
            b.state.as_str(),
            b.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            b.tools
        );
    }
    Ok(ExitCode::SUCCESS)
}
