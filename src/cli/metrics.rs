//! `bundlevisor metrics [--json]`: the daemon's metrics in the Prometheus
//! text format (the same text `metrics_addr` serves on `GET /metrics`).

use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::MetricsResult;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print `{"text": ...}` instead of the text itself.
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let result: MetricsResult = client
        .call::<crate::protocol::typed::Metrics>(crate::protocol::NoParams {}, |_| {})
        .await?;
    if args.json {
        print_json(&result)?;
    } else {
        out!("{}", result.text);
    }
    Ok(ExitCode::SUCCESS)
}
