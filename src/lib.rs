//! bundlevisor: a supervisor daemon for MCP bundles.
//!
//! Map of the crate (see docs/ARCHITECTURE.md for the why):
//!
//! - [`archive`]: `.mcpb` archives: the hostile-archive rules, unpacked
//!   once per SHA-256 into the state dir.
//! - [`protocol`]: control-socket wire types shared by the daemon and the
//!   CLI (an API boundary: serde types only).
//! - [`config`]: the daemon's TOML config and its defaults.
//! - [`manifest`]: MCPB manifests: parse, validate, substitute, host gate.
//! - [`store`]: the SQLite state database (installs, file metadata,
//!   encrypted credentials and OAuth tokens).
//! - [`files`]: workspace files (FileStore) and the one MIME module.
//! - [`bundle`]: one bundle's connection: the one connect function, the
//!   child process, the MCP client handler.
//! - [`host_resources`]: the `ai.nimblebrain/host-resources` contract.
//! - [`daemon`]: the actor tree, its one typed door ([`daemon::api`]) and
//!   the faces over it: the control server, the workspace MCP server
//!   agents reach ([`daemon::gateway`], over `bundlevisor mcp`'s stdio and
//!   over streamable HTTP), the ops endpoints; [`daemon::run`].
//! - [`cli`]: the `bundlevisor` command line.
//! - [`client`]: the control-socket client of the CLI, and the stdio relay of
//!   `bundlevisor mcp`.
//! - [`names`]: rules for bundle and workspace names.
//! - [`oauth`]: the OAuth 2.1 client of remote bundles.
//! - [`remote_http`]: the network rules of remote bundles (https or
//!   loopback, same-origin redirects only).
//! - [`secret`]: secret values and the redactor that masks them.
//! - [`secret_ref`]: references to secrets kept elsewhere (systemd
//!   credentials, files, the environment, pass, GCP, Vault), their allow
//!   rules and their resolution at each start.
//! - [`lines`]: bounded line reading for untrusted streams.
//! - [`logfile`]: size-rotated log files (bundle stderr, the audit log).
//! - [`http_listener`]: one-request HTTP connections served with deadlines
//!   and a cap (the `auth` redirect).
//! - [`progress`]: spinners and bars on a terminal (indicatif), log lines above them.
//! - [`stdio`]: stdin/stdout polled by the event loop (MCP stdio servers).
//! - [`text`]: bundle-controlled text made safe to show on a terminal.
//! - [`tool_search`]: the ranked search over a workspace's tools
//!   (`discovery = "search"`), in memory with tantivy.
//! - [`token_rules`]: an access token's own allow and deny rules.
//! - [`telemetry`]: OpenTelemetry traces: spans, the trace context taken
//!   from agents and passed to bundles, the OTLP exporter.

pub mod archive;
pub mod bundle;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod files;
pub mod host_resources;
pub mod http_listener;
pub mod lines;
pub mod logfile;
pub mod manifest;
pub mod names;
pub mod oauth;
pub mod progress;
pub mod protocol;
pub mod remote_http;
pub mod secret;
pub mod secret_ref;
pub mod stdio;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod token_rules;
pub mod tool_search;
