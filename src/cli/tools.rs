//! `bundlevisor tools [NAME] [-w WS] [--json]`

use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::{ToolsParams, ToolsResult, DEFAULT_WORKSPACE};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One bundle; all bundles of the workspace when omitted.
    name: Option<String>,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let params = ToolsParams {
        workspace: args.workspace.clone(),
        name: args.name.clone(),
    };
    let r: ToolsResult = client
        .call::<crate::protocol::typed::Tools>(params, |_| {})
        .await?;
    if args.json {
        print_json(&r)?;
        return Ok(ExitCode::SUCCESS);
    }
    for b in &r.bundles {
        if b.tools.is_empty() {
            outln!(
                "{}/{} ({}): no tools",
                printable_line(&b.workspace),
                printable_line(&b.name),
                b.state.as_str()
            );
        }
        for t in &b.tools {
            let name = t.get("name").and_then(|v| v.as_str()).unwrap_or("?");
            let desc = t.get("description").and_then(|v| v.as_str()).unwrap_or("");
            outln!(
                "{}/{}\t{}",
                printable_line(&b.name),
                printable_line(name),
                printable_line(desc.lines().next().unwrap_or(""))
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
