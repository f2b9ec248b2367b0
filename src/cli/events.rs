//! `bundlevisor events [--json]`: streams lifecycle events until Ctrl-C.

use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use super::{Client, ClientError};
use crate::protocol::{method, LifecycleEvent, Notification};
use crate::text::{printable, printable_line};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per line (the documented `LifecycleEvent` shape).
    #[arg(long)]
    json: bool,
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let json = args.json;
    let show = move |n: &Notification| {
        if n.method != method::EVENT {
            return;
        }
        if json {
            outln!("{}", n.params);
        } else if let Ok(e) = serde_json::from_value::<LifecycleEvent>(n.params.clone()) {
            outln!("{}", human(&e));
        }
    };
    client
        .call::<crate::protocol::typed::Events>(crate::protocol::NoParams {}, show)
        .await?;
    while let Some(n) = client.next_notification().await? {
        show(&n);
    }
    Err(ClientError::Protocol(
        "the daemon closed the connection".into(),
    ))
}

fn human(e: &LifecycleEvent) -> String {
    let time = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(e.time_ms));
    let kind = serde_json::to_value(e.kind)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    let mut out = format!(
        "{time} {}/{} {kind}: {}",
        printable_line(&e.workspace),
        printable_line(&e.name),
        printable(&e.message)
    );
    for line in &e.stderr {
        out.push_str("\n    | ");
        out.push_str(&printable_line(line));
    }
    out
}
