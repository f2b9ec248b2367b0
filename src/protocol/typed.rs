//! Every control method as a type: its name, its params and its result,
//! shared by the daemon's handlers (`daemon/control/`) and the client
//! (`client::Client::call`), so the two ends cannot disagree about a
//! method's shape.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::methods::*;
use super::{ErrorKind, RpcError};

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

/// The one list of methods makes everything else: a type per method (its
/// name, params and result), the [`Request`] enum of the dispatched ones,
/// the [`Handlers`] trait with one handler per dispatched method (a method
/// without a handler does not compile), [`dispatch`], and [`TYPED`].
/// `connection` methods are answered by the connection itself (before
/// anything else, or about the connection), not dispatched.
macro_rules! methods {
    (
        connection {
            $($(#[$cdoc:meta])* $cty:ident = $cname:path, $cparams:ty => $cresult:ty;)*
        }
        dispatched {
            $($(#[$doc:meta])* $ty:ident($handler:ident) = $name:path, $params:ty => $result:ty;)*
        }
    ) => {
        $(
            $(#[$cdoc])*
            pub struct $cty;
            impl Method for $cty {
                const NAME: &'static str = $cname;
                type Params = $cparams;
                type Result = $cresult;
            }
        )*
        $(
            $(#[$doc])*
            pub struct $ty;
            impl Method for $ty {
                const NAME: &'static str = $name;
                type Params = $params;
                type Result = $result;
            }
        )*
        /// The names of every request method, in one list.
        pub const TYPED: &[&str] = &[$($cname,)* $($name),*];

        /// A dispatched request, with its typed params.
        pub enum Request {
            $($ty($params)),*
        }

        impl Request {
            /// `method` with its `params` (unknown params refused); None
            /// when `method` is not a dispatched one.
            pub fn parse(method: &str, params: Value) -> Option<Result<Request, serde_json::Error>> {
                match method {
                    $($name => Some(serde_json::from_value(params).map(Request::$ty)),)*
                    _ => None,
                }
            }

            /// Its method's name.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Request::$ty(_) => $name),*
                }
            }
        }

        /// One handler per dispatched method.
        pub trait Handlers {
            $(
                fn $handler(&self, p: $params)
                    -> impl std::future::Future<Output = Result<$result, RpcError>> + Send;
            )*
        }

        /// Runs `request` by its handler; the answer as JSON text (written
        /// once: a `status` of thousands of bundles is never a `Value`
        /// tree on its way out).
        pub async fn dispatch<H: Handlers + Sync>(handlers: &H, request: Request) -> Result<Box<RawValue>, RpcError> {
            match request {
                $(Request::$ty(p) => to_json(handlers.$handler(p).await?),)*
            }
        }
    };
}

fn to_json(v: impl Serialize) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(&v)
        .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))
}

methods! {
    connection {
        Hello = method::HELLO, HelloParams => HelloResult;
        Cancel = method::CANCEL, CancelParams => Cancelled;
        /// Answered once the session is ready; MCP follows on the connection.
        Attach = method::ATTACH, AttachParams => Done;
    }
    dispatched {
        Status(status) = method::STATUS, StatusParams => StatusResult;
        Metrics(metrics) = method::METRICS, NoParams => MetricsResult;
        DashboardLogin(dashboard_login) = method::DASHBOARD_LOGIN, NoParams => DashboardLink;
        Events(events) = method::EVENTS, NoParams => Subscribed;
        Install(install) = method::INSTALL, InstallParams => BundleResult;
        Uninstall(uninstall) = method::UNINSTALL, UninstallParams => UninstallResult;
        /// The bundle the path holds (its manifest names it) runs in place
        /// of the installed one of that name.
        Upgrade(upgrade) = method::UPGRADE, InstallParams => BundleResult;
        Restart(restart) = method::RESTART, BundleRef => BundleResult;
        Tools(tools) = method::TOOLS, ToolsParams => ToolsResult;
        /// The result is the bundle's MCP `CallToolResult`, as it sent it.
        Call(call) = method::CALL, CallParams => Value;
        Logs(logs) = method::LOGS, LogsParams => LogsResult;
        Configure(configure) = method::CONFIGURE, ConfigureParams => ConfigureResult;
        /// The result is the bundle's MCP answer, as it sent it.
        Mcp(mcp) = method::MCP, McpParams => Value;
        /// The result is the MCP `resources/list` or `resources/read` answer.
        WorkspaceResources(workspace_resources) = method::WORKSPACE_RESOURCES, WorkspaceResourcesParams => Value;
        /// The result is the `[[profile]]` table of the daemon's config.
        Profile(profile) = method::PROFILE, ProfileParams => Value;
        AuthBegin(auth_begin) = method::AUTH_BEGIN, AuthBeginParams => AuthBeginResult;
        AuthComplete(auth_complete) = method::AUTH_COMPLETE, AuthCompleteParams => BundleResult;
        FilesPut(files_put) = method::FILES_PUT, FilesPutParams => FileRecord;
        FilesLs(files_ls) = method::FILES_LS, FilesParams => FilesList;
        FilesGet(files_get) = method::FILES_GET, FilesParams => FileContent;
        FilesRm(files_rm) = method::FILES_RM, FilesParams => FileRemoved;
        FilesCheckpoint(files_checkpoint) = method::FILES_CHECKPOINT, FilesParams => Checkpoint;
        FilesRollback(files_rollback) = method::FILES_ROLLBACK, FilesParams => Rollback;
        /// Only served by daemons built with the `fault-injection` feature.
        DebugPanic(debug_panic) = method::DEBUG_PANIC, BundleRef => Done;
        RotateKey(rotate_key) = method::ROTATE_KEY, NoParams => RotateKeyResult;
        CredentialsList(credentials_list) = method::CREDENTIALS_LIST, CredentialsListParams => StoredCredentials;
        TokenCreate(token_create) = method::TOKEN_CREATE, TokenCreateParams => TokenCreated;
        TokenList(token_list) = method::TOKEN_LIST, TokenListParams => Tokens;
        TokenRevoke(token_revoke) = method::TOKEN_REVOKE, TokenRevokeParams => TokenInfo;
        Audit(audit) = method::AUDIT, AuditParams => AuditEntries;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_is_listed_once_and_parsed_by_its_name() {
        let mut typed = TYPED.to_vec();
        typed.sort();
        typed.dedup();
        assert_eq!(typed.len(), TYPED.len());
        let parsed = Request::parse(method::STATUS, serde_json::json!({}))
            .unwrap()
            .unwrap();
        assert_eq!(parsed.name(), method::STATUS);
        assert!(Request::parse(method::HELLO, serde_json::json!({})).is_none());
        assert!(Request::parse("no.such", serde_json::json!({})).is_none());
        let junk = Request::parse(method::METRICS, serde_json::json!({"junk": 1})).unwrap();
        assert!(junk.is_err());
    }

    #[test]
    fn no_params_refuses_any_param() {
        assert!(serde_json::from_value::<NoParams>(serde_json::json!({})).is_ok());
        let err = serde_json::from_value::<NoParams>(serde_json::json!({"junk": 1})).unwrap_err();
        assert!(err.to_string().contains("unknown field `junk`"), "{err}");
    }
}
