//! Every control method as a type: its name, its params and its result,
//! shared by the daemon's handlers (`daemon/control/`) and the client
//! (`client::Client::call`), so the two ends cannot disagree about a
//! method's shape.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::methods::*;

/// One control method.
pub trait Method {
    const NAME: &'static str;
    type Params: Serialize + DeserializeOwned + Send + 'static;
    type Result: Serialize + DeserializeOwned + Send + 'static;
}

/// The params of a method that takes none: `{}` or `null`; anything else
/// is refused like an unknown param of any other method.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `events.subscribe`'s answer (the events follow as notifications).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Subscribed {
    pub subscribed: bool,
}

/// `cancel`'s answer: whether a request with that id was in flight.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cancelled {
    pub cancelled: bool,
}

/// `files.rm`'s answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileRemoved {
    pub workspace: String,
    pub id: String,
    pub removed: bool,
}

/// An answer with nothing in it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Done {}

macro_rules! methods {
    ($($(#[$doc:meta])* $ty:ident = $name:expr, $params:ty => $result:ty;)*) => {
        $(
            $(#[$doc])*
            pub struct $ty;
            impl Method for $ty {
                const NAME: &'static str = $name;
                type Params = $params;
                type Result = $result;
            }
        )*
        /// The names of the typed methods, in one list.
        pub const TYPED: &[&str] = &[$($name),*];
    };
}

methods! {
    Hello = method::HELLO, HelloParams => HelloResult;
    Status = method::STATUS, StatusParams => StatusResult;
    Metrics = method::METRICS, NoParams => MetricsResult;
    Install = method::INSTALL, InstallParams => BundleResult;
    Uninstall = method::UNINSTALL, UninstallParams => UninstallResult;
    Restart = method::RESTART, BundleRef => BundleResult;
    Tools = method::TOOLS, ToolsParams => ToolsResult;
    /// The result is the bundle's MCP `CallToolResult`, as it sent it.
    Call = method::CALL, CallParams => Value;
    Logs = method::LOGS, LogsParams => LogsResult;
    Configure = method::CONFIGURE, ConfigureParams => ConfigureResult;
    /// The result is the bundle's MCP answer, as it sent it.
    Mcp = method::MCP, McpParams => Value;
    Cancel = method::CANCEL, CancelParams => Cancelled;
    /// The result is the MCP `resources/list` or `resources/read` answer.
    WorkspaceResources = method::WORKSPACE_RESOURCES, WorkspaceResourcesParams => Value;
    /// The result is the `[[profile]]` table of the daemon's config.
    Profile = method::PROFILE, ProfileParams => Value;
    /// Answered once the session is ready; MCP follows on the connection.
    Attach = method::ATTACH, AttachParams => Done;
    AuthBegin = method::AUTH_BEGIN, AuthBeginParams => AuthBeginResult;
    AuthComplete = method::AUTH_COMPLETE, AuthCompleteParams => BundleResult;
    FilesPut = method::FILES_PUT, FilesPutParams => FileRecord;
    FilesLs = method::FILES_LS, FilesParams => FilesList;
    FilesGet = method::FILES_GET, FilesParams => FileContent;
    FilesRm = method::FILES_RM, FilesParams => FileRemoved;
    FilesCheckpoint = method::FILES_CHECKPOINT, FilesParams => Checkpoint;
    FilesRollback = method::FILES_ROLLBACK, FilesParams => Rollback;
    DebugPanic = method::DEBUG_PANIC, BundleRef => Done;
    Events = method::EVENTS, NoParams => Subscribed;
    RotateKey = method::ROTATE_KEY, NoParams => RotateKeyResult;
    TokenCreate = method::TOKEN_CREATE, TokenCreateParams => TokenCreated;
    TokenList = method::TOKEN_LIST, TokenListParams => Tokens;
    TokenRevoke = method::TOKEN_REVOKE, TokenRevokeParams => TokenInfo;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_method_is_typed_once() {
        let mut typed = TYPED.to_vec();
        typed.sort();
        let mut requests = method::REQUESTS.to_vec();
        requests.push(method::DEBUG_PANIC);
        requests.sort();
        requests.dedup();
        assert_eq!(typed, requests);
    }

    #[test]
    fn no_params_refuses_any_param() {
        assert!(serde_json::from_value::<NoParams>(serde_json::json!({})).is_ok());
        let err = serde_json::from_value::<NoParams>(serde_json::json!({"junk": 1})).unwrap_err();
        assert!(err.to_string().contains("unknown field `junk`"), "{err}");
    }
}
