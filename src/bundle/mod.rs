//! Everything about one bundle's connection: the one connect function
//! ([`connect::connect`]), the bundle's child process ([`process`]), its
//! stdio transport, which answers the bundle's host-resources requests
//! ([`transport`]), and the MCP client handler, which answers them for a
//! remote bundle ([`client`]); the host-resources channel of a bundle on
//! MCP 2026-07-28 ([`channel`]), and the stream on which the resources
//! agents follow are heard from such a bundle ([`follow`]).
//!
//! Architecture invariant: [`connect::connect`] is the only place that
//! constructs a bundle's MCP client and stdio transport, and it cannot be
//! called without a [`client::HostContext`].

pub mod cgroup;
pub mod channel;
pub mod client;
pub mod connect;
pub mod follow;
pub mod guard;
pub mod helper;
pub mod orphans;
pub mod process;
pub mod pyproject;
pub mod reach;
pub mod reaper;
pub mod sandbox;
pub mod spawn;
pub mod spliced;
pub mod transport;
pub mod uv;

pub use client::HostContext;
pub use connect::{connect, ConnectError, ConnectOptions, Session};
