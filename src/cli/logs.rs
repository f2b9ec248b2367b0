//! `bundlevisor logs NAME [-w WS] [-n N] [-f]`: the bundle's captured stderr.

use std::process::ExitCode;

use super::{Client, ClientError};
use crate::protocol::{method, LogLine, LogsParams, LogsResult, DEFAULT_WORKSPACE};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Number of lines.
    #[arg(short = 'n', long, default_value_t = 50)]
    lines: usize,
    /// Keep printing new lines as the bundle writes them (until Ctrl-C).
    #[arg(short, long)]
    follow: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = LogsParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
        lines: args.lines,
        follow: args.follow,
    };
    let mut early = Vec::new();
    let r: LogsResult = client
        .call::<crate::protocol::typed::Logs>(params, |n| {
            if n.method == method::LOG {
                early.push(n.params.clone());
            }
        })
        .await?;
    // The bundle's own bytes: escaped, one printed line per captured line.
    for line in r.lines {
        outln!("{}", printable_line(&line));
    }
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    let print = |params: serde_json::Value| {
        if let Ok(l) = serde_json::from_value::<LogLine>(params) {
            outln!("{}", printable_line(&l.line));
        }
    };
    early.into_iter().for_each(print);
    while let Some(n) = client.next_notification().await? {
        if n.method == method::LOG {
            print(n.params);
        }
    }
    Err(ClientError::Protocol(
        "the daemon closed the connection".into(),
    ))
}
