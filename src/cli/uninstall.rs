//! `bundlevisor uninstall NAME [-w WS] [--purge]`

use std::process::ExitCode;

use super::{Client, ClientError};
use crate::protocol::{UninstallParams, UninstallResult, DEFAULT_WORKSPACE};

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Also delete the bundle's stored credentials and OAuth tokens (also
    /// of a bundle no longer installed, e.g. gone from its watched folder).
    #[arg(long)]
    purge: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = UninstallParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
        purge: args.purge,
    };
    let r: UninstallResult = client
        .call::<crate::protocol::typed::Uninstall>(params, |_| {})
        .await?;
    if r.not_installed {
        outln!(
            "{}/{} was not installed; its stored credentials and tokens were deleted",
            r.workspace,
            r.name
        );
    } else if args.purge {
        outln!(
            "{}/{} uninstalled; its credentials and tokens were deleted",
            r.workspace,
            r.name
        );
    } else {
        outln!("{}/{} uninstalled", r.workspace, r.name);
    }
    Ok(ExitCode::SUCCESS)
}
