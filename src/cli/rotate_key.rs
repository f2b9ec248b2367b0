//! `bundlevisor rotate-key [--json]`: a new credential encryption key,
//! every stored secret re-sealed with it (docs/operations.md, runbook).

use std::process::ExitCode;

use super::{print_json, with_spinner, Client, ClientError};
use crate::protocol::RotateKeyResult;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let result: RotateKeyResult = with_spinner("rotating the credential key".into(), async |n| {
        client
            .call::<crate::protocol::typed::RotateKey>(crate::protocol::NoParams {}, n)
            .await
    })
    .await?;
    if args.json {
        print_json(&result)?;
    } else {
        outln!(
            "credential key rotated: {} values and {} OAuth token sets re-sealed; the new key is in {}",
            result.values, result.token_sets, result.key_file
        );
        outln!(
            "back up the new key now: backups of the state db taken before this need the old key"
        );
    }
    Ok(ExitCode::SUCCESS)
}
