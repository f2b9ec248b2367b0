//! `bundlevisor restart NAME [-w WS]`: waits until the bundle is ready again.

use std::process::ExitCode;

use super::{print_json, show_progress, Client, ClientError};
use crate::protocol::{method, BundleRef, BundleResult, DEFAULT_WORKSPACE};

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = BundleRef {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
    };
    let r: BundleResult = client
        .request(method::RESTART, params, show_progress)
        .await?;
    if args.json {
        print_json(&r)?;
    } else {
        println!(
            "{}/{} is {} (pid {})",
            r.bundle.workspace,
            r.bundle.name,
            r.bundle.state.as_str(),
            r.bundle
                .pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(ExitCode::SUCCESS)
}
