//! The control protocol: JSON-RPC 2.0 over a unix socket, one JSON object per
//! line. Every request, response, notification and error type that crosses
//! the socket lives here and is shared by the daemon and the CLI.
//!
//! This module is an API boundary: it holds serde types only and imports
//! nothing from the daemon. See `docs/protocol.md` for the wire reference.

pub mod error;
pub mod jsonrpc;
pub mod methods;
pub mod typed;

pub use error::{ErrorKind, RpcError};
pub use jsonrpc::{Incoming, Notification, Request, Response};
pub use methods::*;
pub use typed::{Method, NoParams};

/// Major version of the control protocol. A client whose major differs is
/// refused in `daemon.hello`.
pub const PROTOCOL_VERSION: u32 = 1;

/// Longest request line the daemon accepts (bytes, without the newline).
pub const MAX_REQUEST_BYTES: usize = 1024 * 1024;
