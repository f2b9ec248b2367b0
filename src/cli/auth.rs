//! `bundlevisor auth NAME [-w WS] [--port P]`: the authorization-code + PKCE
//! flow of a remote bundle. The CLI listens on a loopback port for the
//! authorization server's redirect, prints the URL to open, and hands the
//! code to the daemon, which exchanges it, stores the tokens encrypted and
//! starts the bundle with them.

use std::process::ExitCode;
use std::time::Duration;

use tokio::net::TcpListener;

use super::{print_json, with_spinner, Client, ClientError};
use crate::http_listener::{serve, Limits, Request, Response};
use crate::protocol::{
    AuthBeginParams, AuthBeginResult, AuthCompleteParams, BundleResult, DEFAULT_WORKSPACE,
};
use crate::text::printable_line;

#[derive(clap::Args, Debug)]
pub struct Args {
    name: String,
    #[arg(short, long, default_value = DEFAULT_WORKSPACE)]
    workspace: String,
    /// Loopback port for the redirect (0: any free port). Set it when the
    /// browser reaches this machine through an SSH tunnel.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Give up waiting for the redirect after this long.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[arg(long)]
    json: bool,
}

/// What the browser brought to the redirect URI.
struct Redirect {
    params: Vec<(String, String)>,
}

impl Redirect {
    fn get(&self, key: &str) -> Option<String> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
}

pub async fn run(client: &mut Client, args: &Args) -> Result<ExitCode, ClientError> {
    let usage = ClientError::Usage;
    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| usage(format!("cannot listen on 127.0.0.1:{}: {e}", args.port)))?;
    let port = listener
        .local_addr()
        .map_err(|e| usage(e.to_string()))?
        .port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let begin: AuthBeginResult = client
        .call::<crate::protocol::typed::AuthBegin>(
            AuthBeginParams {
                workspace: args.workspace.clone(),
                name: args.name.clone(),
                redirect_uri: redirect_uri.clone(),
            },
            |_| {},
        )
        .await?;
    outln!(
        "Open this URL in a browser to authorize {}/{}:",
        args.workspace,
        args.name
    );
    outln!("{}", printable_line(&begin.authorization_url));
    eprintln!("waiting for the redirect to {redirect_uri} ...");
    let limit = args.timeout.min(Duration::from_secs(begin.expires_in_secs));
    let redirect = tokio::time::timeout(limit, wait_redirect(&listener, &begin.state))
        .await
        .map_err(|_| {
            usage(format!(
                "no redirect arrived within {}; run `bundlevisor auth {}` again",
                humantime::format_duration(limit),
                args.name
            ))
        })?;
    let params = AuthCompleteParams {
        state: begin.state,
        code: redirect.get("code"),
        error: redirect.get("error"),
        error_description: redirect.get("error_description"),
        iss: redirect.get("iss"),
    };
    let what = format!("authorizing {}/{}", args.workspace, args.name);
    let result: BundleResult = with_spinner(what, async |on_note| {
        client
            .call::<crate::protocol::typed::AuthComplete>(params, on_note)
            .await
    })
    .await?;
    if args.json {
        print_json(&result)?;
    } else {
        outln!(
            "{}/{} authorized: {}",
            printable_line(&result.bundle.workspace),
            printable_line(&result.bundle.name),
            result.bundle.state.as_str()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Serves the loopback listener until a request to `/callback` carries
/// `state`; anything else (a favicon, a stale tab) gets a 404 and is ignored.
/// Connections are served concurrently, each with a 5 s deadline for its
/// request, at most 16 at once (the oldest is closed for a newcomer): a
/// browser's idle pre-connections or another local user's idle or trickling
/// connections cannot keep the redirect out.
async fn wait_redirect(listener: &TcpListener, state: &str) -> Redirect {
    let limits = Limits {
        max_connections: 16,
        ..Limits::default()
    };
    let state = state.to_string();
    serve(listener, limits, move |r| answer(r, &state)).await
}

fn answer(request: &Request, state: &str) -> (Response, Option<Redirect>) {
    let target = Some(request.target.as_str()).filter(|_| request.method == "GET");
    let parsed = target.and_then(|t| url::Url::parse(&format!("http://127.0.0.1{t}")).ok());
    let redirect = parsed
        .filter(|u| u.path() == "/callback")
        .map(|u| Redirect {
            params: u.query_pairs().into_owned().collect(),
        })
        .filter(|r| r.get("state").as_deref() == Some(state));
    let (status, body) = match &redirect {
        Some(r) if r.get("error").is_some() => (
            "200 OK",
            "Authorization was refused. You can close this window; the terminal says why.",
        ),
        Some(_) => (
            "200 OK",
            "Authorization received. You can close this window and return to the terminal.",
        ),
        None => ("404 Not Found", "Not the authorization redirect."),
    };
    let page = format!("<!doctype html><title>bundlevisor</title><p>{body}</p>\n");
    let response = Response {
        status,
        content_type: "text/html; charset=utf-8",
        body: page,
    };
    (response, redirect)
}
