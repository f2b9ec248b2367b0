//! `bundlevisor uninstall NAME [-w WS]`

use std::process::ExitCode;

use super::{Client, ClientError};
use crate::protocol::{method, BundleRef, UninstallResult, DEFAULT_WORKSPACE};

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = BundleRef {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
    };
    let r: UninstallResult = client.request(method::UNINSTALL, params, |_| {}).await?;
    println!("{}/{} uninstalled", r.workspace, r.name);
    Ok(ExitCode::SUCCESS)
}
