//! `bundlevisor restart NAME [-w WS]`: waits until the bundle is ready again.

use std::process::ExitCode;

use super::{print_json, with_spinner, Client, ClientError};
use crate::protocol::{BundleRef, BundleResult, DEFAULT_WORKSPACE};
use crate::text::printable_line;

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
    let what = format!(
        "restarting {}/{}",
        printable_line(&args.workspace),
        printable_line(&args.name)
    );
    let r: BundleResult = with_spinner(what, async |on_note| {
        client
            .call::<crate::protocol::typed::Restart>(params, on_note)
            .await
    })
    .await?;
    if args.json {
        print_json(&r)?;
    } else {
        outln!(
            "{}/{} is {} (pid {})",
            printable_line(&r.bundle.workspace),
            printable_line(&r.bundle.name),
            r.bundle.state.as_str(),
            r.bundle
                .pid
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(ExitCode::SUCCESS)
}
