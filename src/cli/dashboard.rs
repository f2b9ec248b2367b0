//! `bundlevisor dashboard [--json]`: a one-time link that signs the caller
//! in to the web dashboard (five minutes, one use).

use std::process::ExitCode;

use super::{print_json, Client, ClientError};
use crate::protocol::DashboardLink;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print `{"url": ..., "code": ...}` instead of the link.
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let login: DashboardLink = client
        .call::<crate::protocol::typed::DashboardLogin>(crate::protocol::NoParams {}, |_| {})
        .await?;
    if args.json {
        print_json(&login)?;
    } else {
        out!("{}", login.url);
        out!(
            "(one use, for five minutes; or paste the code {} on the sign-in page)",
            login.code
        );
    }
    Ok(ExitCode::SUCCESS)
}
