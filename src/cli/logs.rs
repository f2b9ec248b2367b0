//! `bundlevisor logs NAME [-w WS] [-n N]`: the bundle's captured stderr.

use std::process::ExitCode;

use super::{Client, ClientError};
use crate::protocol::{method, LogsParams, LogsResult, DEFAULT_WORKSPACE};

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Number of lines.
    #[arg(short = 'n', long, default_value_t = 50)]
    lines: usize,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = LogsParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
        lines: args.lines,
    };
    let r: LogsResult = client.request(method::LOGS, params, |_| {}).await?;
    for line in r.lines {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
