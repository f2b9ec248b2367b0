//! Daemon configuration (TOML). Every default lives in [`defaults`]; relative
//! paths are resolved against the folder of the config file, so a config can
//! be moved together with the tree it describes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod defaults {
    //! The one place where default values are written down (documented in
    //! `config/bundlevisor.toml`).
    use std::path::PathBuf;
    use std::time::Duration;

    /// `[archives]`: a `.mcpb` file of at most 512 MiB, 50,000 entries,
    /// 1 GiB unpacked, no entry of 1 MiB or more expanding over 100-fold.
    pub fn archive_max_bytes() -> u64 {
        512 * 1024 * 1024
    }
    pub fn archive_max_entries() -> u64 {
        50_000
    }
    pub fn archive_max_unpacked_bytes() -> u64 {
        1024 * 1024 * 1024
    }
    pub fn archive_max_ratio() -> u64 {
        100
    }
    /// `[http] max_body_bytes = 0`: a request body of at most 4 MiB.
    pub fn http_max_body_bytes() -> usize {
        4 * 1024 * 1024
    }

    /// `[http]`: each token 50 requests a second, bursts of 200.
    pub fn http_rate_per_sec() -> f64 {
        50.0
    }
    pub fn http_burst() -> u32 {
        200
    }
    pub fn http_max_sessions() -> usize {
        64
    }
    /// `[http]`: one token holds at most 8 of an endpoint's sessions; at
    /// most 256 connections a listener; a request head within 10 s, its
    /// body within 30 s.
    pub fn http_max_sessions_per_token() -> usize {
        8
    }
    /// `[http]`: a request that asked its agent for input (MCP 2026-07-28)
    /// waits 5 minutes for the retry; one token has at most 16 waiting.
    pub fn http_input_timeout() -> Duration {
        Duration::from_secs(300)
    }
    pub fn http_max_waiting_for_input() -> usize {
        16
    }
    pub fn http_max_connections() -> usize {
        256
    }
    pub fn http_head_timeout() -> Duration {
        Duration::from_secs(10)
    }
    pub fn http_body_timeout() -> Duration {
        Duration::from_secs(30)
    }
    /// rmcp's own default for a session's idle time.
    pub fn http_session_idle() -> Duration {
        Duration::from_secs(300)
    }
    /// `[uv]`: `uv` and `python3` from the daemon's `PATH`, a build of at
    /// most 10 minutes, the system's certificate store.
    pub fn pass_command() -> PathBuf {
        PathBuf::from("pass")
    }
    pub fn gcp_endpoint() -> String {
        "https://secretmanager.googleapis.com".into()
    }
    pub fn gcp_metadata() -> String {
        "http://metadata.google.internal".into()
    }
    pub fn secret_timeout() -> Duration {
        Duration::from_secs(10)
    }
    pub fn uv_command() -> PathBuf {
        PathBuf::from("uv")
    }
    pub fn uv_python() -> PathBuf {
        PathBuf::from("python3")
    }
    pub fn uv_timeout() -> Duration {
        Duration::from_secs(600)
    }
    pub fn uv_system_certs() -> bool {
        true
    }
    pub fn service_name() -> String {
        "bundlevisor".to_string()
    }
    pub fn sample_ratio() -> f64 {
        1.0
    }

    pub fn state_dir() -> PathBuf {
        PathBuf::from(".bundlevisor/state")
    }
    pub fn socket() -> PathBuf {
        PathBuf::from(".bundlevisor/bundlevisor.sock")
    }
    pub fn workspace() -> String {
        crate::protocol::DEFAULT_WORKSPACE.to_string()
    }
    pub fn rate_per_sec() -> f64 {
        100.0
    }
    pub fn burst() -> u32 {
        1000
    }
    pub fn max_read_bytes() -> u64 {
        10 * 1024 * 1024
    }
    pub fn start_timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn call_timeout() -> Duration {
        Duration::from_secs(60)
    }
    pub fn stop_grace() -> Duration {
        Duration::from_secs(5)
    }
    pub fn max_concurrent_starts() -> usize {
        16
    }
    pub fn restart() -> super::RestartPolicy {
        super::RestartPolicy::OnFailure
    }
    pub fn backoff_initial() -> Duration {
        Duration::from_millis(50)
    }
    pub fn backoff_max() -> Duration {
        Duration::from_secs(60)
    }
    pub fn stable_after() -> Duration {
        Duration::from_secs(30)
    }
    pub fn max_restarts() -> u32 {
        5
    }
    pub fn restart_window() -> Duration {
        Duration::from_secs(60)
    }
    pub fn ping_interval() -> Duration {
        Duration::from_secs(30)
    }
    pub fn ping_timeout() -> Duration {
        Duration::from_secs(10)
    }
    pub fn ping_failures() -> u32 {
        3
    }
    pub fn debounce() -> Duration {
        Duration::from_millis(200)
    }
    pub fn log_max_bytes() -> u64 {
        10 * 1024 * 1024
    }
    pub fn log_keep() -> u32 {
        3
    }
    pub fn max_message_bytes() -> usize {
        16 * 1024 * 1024
    }
    pub fn landlock() -> super::Enforcement {
        super::Enforcement::Auto
    }
    pub fn cgroups() -> super::Enforcement {
        super::Enforcement::Auto
    }
    pub fn max_open_files() -> u64 {
        4096
    }
    /// `[sandbox] memory_max`: 1 GiB of a bundle's whole tree (no swap).
    /// The real servers the tests run (Node, Python) stay under 150 MiB.
    pub fn memory_max() -> u64 {
        1024 * 1024 * 1024
    }
    /// `[sandbox] pids_max`: 256 processes and threads of a bundle's whole
    /// tree. A Node server has about a dozen threads, a Python one a few.
    pub fn pids_max() -> u64 {
        256
    }
    /// Bundle uids of a root daemon: above systemd's container range
    /// (524288–1879048191) and below 2^31, where no distribution or
    /// container manager allocates.
    pub fn uid_range() -> super::UidRange {
        super::UidRange {
            first: 2_000_000_000,
            last: 2_000_065_535,
        }
    }
    pub fn max_connections() -> usize {
        256
    }
    pub fn handshake_timeout() -> Duration {
        Duration::from_secs(5)
    }
    /// `[control]`: 64 requests in flight per connection, 4 MiB of unread output.
    pub fn max_in_flight() -> usize {
        64
    }
    pub fn max_output_bytes() -> usize {
        4 * 1024 * 1024
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// SQLite state database, bundle logs and the daemon lock live here.
    #[serde(default = "defaults::state_dir")]
    pub state_dir: PathBuf,
    /// The control socket.
    #[serde(default = "defaults::socket")]
    pub socket: PathBuf,
    /// Serve `GET /metrics` (Prometheus text) here: `HOST:PORT`, or a bare
    /// port for 127.0.0.1. Off unless set.
    #[serde(default, deserialize_with = "metrics_addr")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Folders whose bundles are installed at start.
    #[serde(default)]
    pub watch: Vec<WatchConfig>,
    #[serde(default)]
    pub host_resources: HostResourcesConfig,
    #[serde(default)]
    pub bundles: BundleSettings,
    #[serde(default)]
    pub supervision: Supervision,
    #[serde(default)]
    pub logs: LogSettings,
    #[serde(default)]
    pub credentials: CredentialsConfig,
    /// `[secrets]`: where secret references may point, and the stores
    /// they are read from (docs/credentials.md, "Secret references").
    #[serde(default)]
    pub secrets: SecretsConfig,
    #[serde(default)]
    pub control: ControlSettings,
    #[serde(default)]
    pub sandbox: SandboxSettings,
    /// What a `.mcpb` archive may hold.
    #[serde(default)]
    pub archives: ArchiveSettings,
    /// `[uv]`: how the environments of `uv` bundles are built.
    #[serde(default)]
    pub uv: UvSettings,
    /// `[http]`: the gateway over streamable HTTP (off unless `listen`).
    #[serde(default)]
    pub http: HttpSettings,
    /// `[search]`: how `discovery = "search"` ranks tools.
    #[serde(default)]
    pub search: SearchSettings,
    /// `[telemetry]`: OpenTelemetry traces (off unless `otlp_endpoint`).
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// Tools of a bundle that are never registered (not listed, not callable).
    #[serde(default)]
    pub exclude_tools: Vec<ExcludeTools>,
    /// Named views of a workspace for `bundlevisor mcp --profile`.
    #[serde(default, rename = "profile")]
    pub profiles: Vec<Profile>,
    /// How long the watched folders must be quiet before they are rescanned.
    #[serde(default = "defaults::debounce", with = "humantime_serde")]
    pub watch_debounce: Duration,
}

/// When a bundle that stopped is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// After every exit, clean or not.
    Always,
    /// After a crash, a failed start or a failed liveness check; not after exit code 0.
    OnFailure,
    /// Never: the bundle stays failed (or stopped) until `bundlevisor restart`.
    Never,
}

impl RestartPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "always",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Never => "never",
        }
    }
}

/// Restart policy, backoff, crash-loop breaker and liveness checks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supervision {
    #[serde(default = "defaults::restart")]
    pub restart: RestartPolicy,
    /// Delay before the first restart; doubles per consecutive failure.
    #[serde(default = "defaults::backoff_initial", with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest delay between restarts.
    #[serde(default = "defaults::backoff_max", with = "humantime_serde")]
    pub backoff_max: Duration,
    /// A start counts as successful (and the backoff resets) after this long ready.
    #[serde(default = "defaults::stable_after", with = "humantime_serde")]
    pub stable_after: Duration,
    /// Breaker: this many restarts within `restart_window` → `failed`.
    #[serde(default = "defaults::max_restarts")]
    pub max_restarts: u32,
    #[serde(default = "defaults::restart_window", with = "humantime_serde")]
    pub restart_window: Duration,
    /// MCP `ping` every this long while ready (`0s` turns liveness checks off).
    #[serde(default = "defaults::ping_interval", with = "humantime_serde")]
    pub ping_interval: Duration,
    #[serde(default = "defaults::ping_timeout", with = "humantime_serde")]
    pub ping_timeout: Duration,
    /// Consecutive failed pings before the bundle is killed and restarted.
    #[serde(default = "defaults::ping_failures")]
    pub ping_failures: u32,
    /// Per-bundle exceptions to `restart`.
    #[serde(default, rename = "override")]
    pub overrides: Vec<SupervisionOverride>,
}

impl Default for Supervision {
    fn default() -> Self {
        toml::from_str("").expect("supervision defaults parse")
    }
}

impl Supervision {
    /// The restart policy of one bundle.
    pub fn restart_for(&self, workspace: &str, bundle: &str) -> RestartPolicy {
        self.overrides
            .iter()
            .find(|o| o.workspace == workspace && o.bundle == bundle)
            .map(|o| o.restart)
            .unwrap_or(self.restart)
    }
}

/// `[[sandbox.bundle]]`: what one bundle gets beyond every bundle's grants.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxOverride {
    #[serde(default = "defaults::workspace")]
    pub workspace: String,
    pub bundle: String,
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    #[serde(default)]
    pub read_write_paths: Vec<PathBuf>,
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Its configured `directory`/`file` values are granted read-only.
    #[serde(default)]
    pub configured_read_only: bool,
    /// Runs as this existing, unprivileged user (and its primary group)
    /// instead of a uid of `uid_range`: a stable identity the operator
    /// chooses, so the folders it configures can be owned by it before the
    /// install (root daemons; docs/operations.md, "Running as root").
    #[serde(default)]
    pub user: Option<String>,
    /// Its own cgroup limits, instead of `[sandbox]`'s (0: not limited).
    #[serde(default)]
    pub memory_max: Option<u64>,
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub cpu_max: Option<f64>,
}

/// The cgroup limits of one bundle (None: not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupLimits {
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
    pub cpu_max: Option<f64>,
}

impl SandboxSettings {
    /// The daemon variables a bundle (and the uv build of its environment)
    /// gets through the scrub: `[sandbox] pass_env`, then its own.
    pub fn pass_env_for(&self, workspace: &str, bundle: &str) -> Vec<String> {
        self.pass_env
            .iter()
            .chain(
                self.for_bundle(workspace, bundle)
                    .into_iter()
                    .flat_map(|o| &o.pass_env),
            )
            .cloned()
            .collect()
    }

    /// `[sandbox]` limits, with the bundle's own `[[sandbox.bundle]]` ones first.
    pub fn cgroup_limits(&self, workspace: &str, bundle: &str) -> CgroupLimits {
        let own = self.for_bundle(workspace, bundle);
        CgroupLimits {
            memory_max: Some(own.and_then(|o| o.memory_max).unwrap_or(self.memory_max))
                .filter(|n| *n > 0),
            pids_max: Some(own.and_then(|o| o.pids_max).unwrap_or(self.pids_max))
                .filter(|n| *n > 0),
            cpu_max: Some(own.and_then(|o| o.cpu_max).unwrap_or(self.cpu_max)).filter(|c| *c > 0.0),
        }
    }

    /// The override of one bundle, if any.
    /// The named user a bundle runs as (a root daemon's): its own
    /// `[[sandbox.bundle]] user` (true), else `[sandbox] user` (false); None
    /// when it gets a uid of `uid_range`.
    pub fn user_for(&self, workspace: &str, bundle: &str) -> Option<(&String, bool)> {
        self.for_bundle(workspace, bundle)
            .and_then(|o| o.user.as_ref())
            .map(|u| (u, true))
            .or(self.user.as_ref().map(|u| (u, false)))
    }

    /// What is wrong with the `[[sandbox.bundle]] user`s: one that does not
    /// exist, root, one admitted to the control socket, or one that is in
    /// the range of bundle uids.
    fn bundle_user_problems(&self, control: &ControlSettings) -> Vec<String> {
        let mut problems = Vec::new();
        for o in &self.bundles {
            let Some(name) = &o.user else { continue };
            let at = format!(
                "[[sandbox.bundle]] {}/{}: user {name:?}",
                o.workspace, o.bundle
            );
            let Some(u) = nix::unistd::User::from_name(name).ok().flatten() else {
                problems.push(format!(
                    "{at} does not exist on this machine; create it (e.g. `useradd --system --no-create-home --shell /usr/sbin/nologin {name}`) or remove the line"
                ));
                continue;
            };
            let uid = u.uid.as_raw();
            if uid == 0 {
                problems.push(format!("{at} is root; bundles never run as root"));
            } else if control.allowed_uids.contains(&uid)
                || control.allowed_gids.contains(&u.gid.as_raw())
            {
                problems.push(format!(
                    "{at} (uid {uid}) is admitted to the control socket ([control] allowed_uids/allowed_gids); a bundle must never be"
                ));
            } else if self.uid_range.contains(uid) {
                problems.push(format!(
                    "{at} (uid {uid}) is in uid_range {}, whose uids the daemon gives other bundles",
                    self.uid_range
                ));
            }
        }
        problems
    }

    pub fn for_bundle(&self, workspace: &str, bundle: &str) -> Option<&SandboxOverride> {
        self.bundles
            .iter()
            .find(|o| o.workspace == workspace && o.bundle == bundle)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisionOverride {
    #[serde(default = "defaults::workspace")]
    pub workspace: String,
    pub bundle: String,
    pub restart: RestartPolicy,
}

/// Whether a confinement (`[sandbox] landlock`, `[sandbox] cgroups`) is
/// enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    /// Enforced where the system supports it; `status` says when it cannot be.
    Auto,
    /// A bundle is not started without it.
    Required,
    Off,
}

/// `[sandbox]`: how stdio bundles are confined (docs/security.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSettings {
    #[serde(default = "defaults::landlock")]
    pub landlock: Enforcement,
    /// When the daemon runs as root: one unprivileged user every bundle runs
    /// as (instead of a uid of its own from `uid_range`).
    #[serde(default)]
    pub user: Option<String>,
    /// When the daemon runs as root: each bundle runs under its own uid (and
    /// gid) from this range, kept for as long as its sandbox folder exists.
    #[serde(default = "defaults::uid_range")]
    pub uid_range: UidRange,
    /// A daemon that cannot give bundles their own uids (it does not run as
    /// root) starts them under its own uid only when this is true: a bundle
    /// then shares the daemon's uid, and only Landlock and the control
    /// socket's process-ancestry check stand between them (docs/security.md).
    #[serde(default)]
    pub allow_same_uid: bool,
    /// Extra paths bundles may read and execute (an interpreter outside /usr).
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Extra paths every bundle may read and write (a shared scratch
    /// folder); a bundle's own configured directories are granted anyway.
    #[serde(default)]
    pub read_write_paths: Vec<PathBuf>,
    /// Variables of the daemon's environment passed through the scrub to
    /// every bundle (a proxy, a private CA: `HTTPS_PROXY`, `NO_PROXY`,
    /// `SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`); a manifest's own `env` wins.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Per-bundle additions (`[[sandbox.bundle]]`): more paths and
    /// variables for one bundle, or its configured directories read-only.
    #[serde(default, rename = "bundle")]
    pub bundles: Vec<SandboxOverride>,
    /// RLIMIT_NOFILE (0: not limited).
    #[serde(default = "defaults::max_open_files")]
    pub max_open_files: u64,
    /// RLIMIT_NPROC, counted per user (0: not limited; not enforced for root).
    #[serde(default)]
    pub max_processes: u64,
    /// RLIMIT_AS in bytes (0: not limited).
    #[serde(default)]
    pub max_address_space: u64,
    /// RLIMIT_CPU in seconds of CPU time over the process's life (0: not limited).
    #[serde(default)]
    pub max_cpu_seconds: u64,
    /// Whether each bundle runs in a cgroup of its own (docs/security.md,
    /// "Containment"): `auto` where one is writable (said loudly when not),
    /// `required` (a bundle does not start without it), `off`.
    #[serde(default = "defaults::cgroups")]
    pub cgroups: Enforcement,
    /// Where the bundles' cgroups are made (a cgroup v2 folder). Default:
    /// the daemon's own cgroup when it is delegated (`Delegate=yes`), or
    /// `bundlevisor/` at the top of the hierarchy when the daemon is there.
    #[serde(default)]
    pub cgroup_root: Option<PathBuf>,
    /// cgroup limits of every bundle's whole process tree, where the
    /// controllers are there: `memory.max` in bytes (default 1 GiB),
    /// `pids.max` (default 256), and `cpu.max` in CPUs (1.5 = one and a
    /// half; default none). 0 lifts a limit: an operator's explicit choice.
    #[serde(default = "defaults::memory_max")]
    pub memory_max: u64,
    #[serde(default = "defaults::pids_max")]
    pub pids_max: u64,
    #[serde(default)]
    pub cpu_max: f64,
}

/// An inclusive range of uids, written `"FIRST-LAST"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl UidRange {
    pub fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl<'de> Deserialize<'de> for UidRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let bad = || {
            serde::de::Error::custom(format!(
                "uid_range {text:?} must be \"FIRST-LAST\" with 1000 <= FIRST <= LAST < 4294967295, e.g. \"2000000000-2000065535\""
            ))
        };
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        let first: u32 = a.trim().parse().map_err(|_| bad())?;
        let last: u32 = b.trim().parse().map_err(|_| bad())?;
        if first < 1000 || first > last || last == u32::MAX {
            return Err(bad());
        }
        Ok(UidRange { first, last })
    }
}

impl Default for SandboxSettings {
    fn default() -> Self {
        toml::from_str("").expect("sandbox defaults parse")
    }
}

/// `[control]`: who may use the control socket, and how many at once.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlSettings {
    /// Peer uids admitted besides the daemon's own (checked with SO_PEERCRED).
    #[serde(default)]
    pub allowed_uids: Vec<u32>,
    /// Peer primary gids admitted; the socket is then group-accessible (0660)
    /// to the first of them.
    #[serde(default)]
    pub allowed_gids: Vec<u32>,
    /// Connections served at once; more are refused with a clear error.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// A client must have completed `daemon.hello` this long after it
    /// connected, whatever it sends meanwhile.
    #[serde(default = "defaults::handshake_timeout", with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Requests of one connection being handled at once; the daemon reads
    /// no further from it until one is answered.
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: usize,
    /// Answers and notifications waiting for a client that does not read,
    /// in bytes (besides the one being written); past it the client is cut
    /// off, with the reason logged.
    #[serde(default = "defaults::max_output_bytes")]
    pub max_output_bytes: usize,
}

impl Default for ControlSettings {
    fn default() -> Self {
        toml::from_str("").expect("control defaults parse")
    }
}

/// `[[exclude_tools]]`: tools of one bundle that the daemon drops when the
/// bundle registers its tools: neither listed (`tools`, the gateway) nor
/// callable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExcludeTools {
    #[serde(default = "defaults::workspace")]
    pub workspace: String,
    pub bundle: String,
    pub tools: Vec<String>,
}

/// `[[profile]]`: what `bundlevisor mcp --profile NAME` exposes.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    /// Bundles the profile may use (all when absent).
    #[serde(default)]
    pub bundles: Option<Vec<String>>,
    /// Tools hidden and refused, each named by its bundle and its own
    /// name (never by the exposed name, which a collision may move).
    #[serde(default)]
    pub exclude_tools: Vec<ToolRef>,
    /// How the profile's tools and prompts are named: `BUNDLE__NAME`
    /// (`"prefixed"`, the default) or as their bundles name them
    /// (`"bare"`), which no two of its bundles may share.
    #[serde(default)]
    pub names: NameMode,
    /// How agents find the profile's tools: all listed (`"list"`, the
    /// default), or a few meta-tools that search them (`"search"`:
    /// `find_tools`, `call_tool`, `pin_tools`; docs/gateway.md).
    #[serde(default)]
    pub discovery: Discovery,
}

/// `discovery` of a `[[profile]]`.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Discovery {
    #[default]
    List,
    Search,
}

/// `names` of a `[[profile]]`.
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NameMode {
    #[default]
    Prefixed,
    Bare,
}

/// A tool of a bundle, as a profile's `exclude_tools` names it: by the
/// pair, not by the exposed `BUNDLE__TOOL` string the gateway assigns
/// (a collision gives another tool that string and moves this one to
/// `BUNDLE__TOOL__2`). Written `{ bundle = "a__b", tool = "sh" }`, or as
/// the string `"BUNDLE__TOOL"` when it splits at `__` into a bundle name
/// and a tool in one way only (`"demo__sleep"`); a string that splits in
/// several ways (`"a__b__sh"`: bundle `a` tool `b__sh`, or bundle `a__b`
/// tool `sh`) is refused with both readings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(try_from = "ToolEntry")]
pub struct ToolRef {
    pub bundle: String,
    pub tool: String,
}

/// How a [`ToolRef`] is written in the config.
#[derive(Deserialize)]
#[serde(untagged)]
enum ToolEntry {
    Named(String),
    Pair(ToolPair),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolPair {
    bundle: String,
    tool: String,
}

impl TryFrom<ToolEntry> for ToolRef {
    type Error = String;

    fn try_from(entry: ToolEntry) -> Result<Self, String> {
        match entry {
            ToolEntry::Pair(ToolPair { bundle, tool }) => {
                crate::names::check_name("bundle", &bundle).map_err(|e| {
                    format!("exclude_tools entry {{ bundle = {bundle:?}, tool = {tool:?} }}: {e}")
                })?;
                if tool.is_empty() {
                    return Err(format!(
                        "exclude_tools entry {{ bundle = {bundle:?}, tool = \"\" }}: the tool name is empty"
                    ));
                }
                Ok(ToolRef { bundle, tool })
            }
            ToolEntry::Named(text) => ToolRef::parse(&text),
        }
    }
}

impl ToolRef {
    /// `"BUNDLE__TOOL"`, when it splits into a bundle name and a tool in
    /// exactly one way.
    pub fn parse(text: &str) -> Result<ToolRef, String> {
        // Every `__`, overlapping ones too ("a___b" reads as "a" + "_b"
        // and as "a_" + "b"); `_` is ASCII, so each is a char boundary.
        let readings: Vec<ToolRef> = (0..text.len())
            .filter(|&i| text.as_bytes()[i..].starts_with(b"__"))
            .map(|i| ToolRef {
                bundle: text[..i].to_string(),
                tool: text[i + 2..].to_string(),
            })
            .filter(|r| crate::names::check_name("bundle", &r.bundle).is_ok() && !r.tool.is_empty())
            .collect();
        match readings.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(format!(
                "exclude_tools entry {text:?} must name a tool as BUNDLE__TOOL, or as {{ bundle = \"BUNDLE\", tool = \"TOOL\" }}"
            )),
            several => Err(format!(
                "exclude_tools entry {text:?} is ambiguous: it may mean {}; write the one meant as {{ bundle = \"…\", tool = \"…\" }}",
                several
                    .iter()
                    .map(|r| format!("{{ bundle = {:?}, tool = {:?} }}", r.bundle, r.tool))
                    .collect::<Vec<_>>()
                    .join(" or ")
            )),
        }
    }

    /// Whether this names `tool` of `bundle`.
    pub fn is(&self, bundle: &str, tool: &str) -> bool {
        self.bundle == bundle && self.tool == tool
    }
}

/// Where the key that encrypts stored credentials comes from
/// (docs/credentials.md). At most one of the two; neither means
/// `STATE_DIR/credentials.key`, created on first start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsConfig {
    /// A key file the operator manages (must exist, mode 0600).
    pub key_file: Option<PathBuf>,
    /// An environment variable holding the base64 key.
    pub key_env: Option<String>,
}

/// One `[secrets]` allow rule: references of `scheme` whose location is
/// `prefix` or below it (whole segments: `/run/secrets` allows
/// `/run/secrets/db`, never `/run/secrets-old/db`; for `credential` and
/// `env`, a name, or a name prefix ending in `*`), usable by the daemon's
/// own uid and by `uids`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowRule {
    pub scheme: String,
    pub prefix: String,
    #[serde(default)]
    pub uids: Vec<u32>,
}

/// Whether `text` may be a secret store's address: `https://`, or
/// `http://` only to a loopback address or the cloud metadata server (a
/// token must never cross a network in the clear), without a user,
/// password or query (they would be printed wherever the address is).
pub fn check_store_url(text: &str) -> Result<(), String> {
    let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(format!(
            "{text:?} carries a user, password or query; give the store's token in its token file instead"
        ));
    }
    let near = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback() || ip.is_link_local(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost" || d == "metadata.google.internal",
        None => return Err(format!("{text:?} names no host")),
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" if near => Ok(()),
        _ => Err(format!(
            "{text:?} must be https:// (http:// only to a loopback address or the metadata server), so that no token crosses a network in the clear"
        )),
    }
}

/// `[secrets]`: the sources a `configure --ref` reference may name
/// (`[[secrets.allow]]`; nothing is allowed unless a rule says so) and how
/// the stores are reached.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsConfig {
    #[serde(default)]
    pub allow: Vec<AllowRule>,
    /// The `pass` program (a path, or a name on the daemon's `PATH`).
    #[serde(default = "defaults::pass_command")]
    pub pass_command: PathBuf,
    /// `PASSWORD_STORE_DIR` for `pass:` (pass's own default: `~/.password-store`).
    pub pass_store: Option<PathBuf>,
    /// `GNUPGHOME` for `pass:` (gpg's own default: `~/.gnupg`).
    pub gnupg_home: Option<PathBuf>,
    /// GCP Secret Manager's API.
    #[serde(default = "defaults::gcp_endpoint")]
    pub gcp_endpoint: String,
    /// A file holding an OAuth access token for GCP (kept fresh by
    /// whoever writes it); without it, the metadata server's token of the
    /// machine's service account.
    pub gcp_token_file: Option<PathBuf>,
    /// The GCE/GKE metadata server.
    #[serde(default = "defaults::gcp_metadata")]
    pub gcp_metadata: String,
    /// Vault's (or OpenBao's) address, `https://HOST:8200`.
    pub vault_addr: Option<String>,
    /// A file holding the Vault token (a Vault Agent sink, say).
    pub vault_token_file: Option<PathBuf>,
    /// `X-Vault-Namespace` (Vault Enterprise, HCP).
    pub vault_namespace: Option<String>,
    /// One reference's resolution may take this long.
    #[serde(default = "defaults::secret_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            allow: Vec::new(),
            pass_command: defaults::pass_command(),
            pass_store: None,
            gnupg_home: None,
            gcp_endpoint: defaults::gcp_endpoint(),
            gcp_token_file: None,
            gcp_metadata: defaults::gcp_metadata(),
            vault_addr: None,
            vault_token_file: None,
            vault_namespace: None,
            timeout: defaults::secret_timeout(),
        }
    }
}

impl SecretsConfig {
    /// What is wrong with these settings, each with its fix; `protected`
    /// are the daemon's own files, which no rule may reach into.
    fn problems(&self, protected: &[PathBuf]) -> Vec<String> {
        let mut problems = Vec::new();
        for (i, rule) in self.allow.iter().enumerate() {
            let at = format!("secrets.allow[{i}]");
            match rule.scheme.as_str() {
                "file" => {
                    let prefix = Path::new(&rule.prefix);
                    if !prefix.is_absolute() {
                        problems.push(format!(
                            "{at}.prefix {:?} must be an absolute folder (e.g. \"/run/secrets\")",
                            rule.prefix
                        ));
                    } else if let Some(p) = protected
                        .iter()
                        .find(|p| p.starts_with(prefix) || prefix.starts_with(p))
                    {
                        problems.push(format!(
                            "{at}.prefix {:?} overlaps the daemon's own {} (its state, key or socket are never secret sources); name a folder of its own",
                            rule.prefix,
                            p.display()
                        ));
                    }
                }
                "pass" | "gcp" | "vault" if rule.prefix.starts_with('/') => problems.push(format!(
                    "{at}.prefix {:?}: a {} prefix is a path inside its store, without a leading '/' (e.g. \"team/api\")",
                    rule.prefix, rule.scheme
                )),
                "credential" | "env" | "pass" | "gcp" | "vault" => {}
                other => problems.push(format!(
                    "{at}.scheme {other:?} is not one of credential, file, env, pass, gcp, vault"
                )),
            }
        }
        let urls = [
            ("gcp_endpoint", Some(&self.gcp_endpoint)),
            ("gcp_metadata", Some(&self.gcp_metadata)),
            ("vault_addr", self.vault_addr.as_ref()),
        ];
        for (name, url) in urls {
            if let Some(url) = url {
                if let Err(e) = check_store_url(url) {
                    problems.push(format!("secrets.{name}: {e}"));
                }
            }
        }
        if self.timeout.is_zero() {
            problems.push("secrets.timeout must be above 0".to_string());
        }
        problems
    }
}

/// `[archives]`: the limits a `.mcpb` archive is held to before anything
/// of it is unpacked (a zip bomb is refused, not inflated).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSettings {
    #[serde(default = "defaults::archive_max_bytes")]
    pub max_archive_bytes: u64,
    #[serde(default = "defaults::archive_max_entries")]
    pub max_entries: u64,
    #[serde(default = "defaults::archive_max_unpacked_bytes")]
    pub max_unpacked_bytes: u64,
    #[serde(default = "defaults::archive_max_ratio")]
    pub max_ratio: u64,
}

impl Default for ArchiveSettings {
    fn default() -> Self {
        ArchiveSettings {
            max_archive_bytes: defaults::archive_max_bytes(),
            max_entries: defaults::archive_max_entries(),
            max_unpacked_bytes: defaults::archive_max_unpacked_bytes(),
            max_ratio: defaults::archive_max_ratio(),
        }
    }
}

impl ArchiveSettings {
    pub fn limits(&self) -> crate::archive::ArchiveLimits {
        crate::archive::ArchiveLimits {
            max_archive_bytes: self.max_archive_bytes,
            max_entries: self.max_entries,
            max_unpacked_bytes: self.max_unpacked_bytes,
            max_ratio: self.max_ratio,
        }
    }
}

/// `[uv]`: the environments of `server.type = "uv"` bundles (MCPB 0.4),
/// built by the daemon once per bundle version (docs/manifest.md, "uv bundles").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UvSettings {
    /// The uv program (a path, or a name looked up on the daemon's `PATH`).
    #[serde(default = "defaults::uv_command")]
    pub command: PathBuf,
    /// The Python the environments are made with (a path, or a name on the
    /// daemon's `PATH`). It must be readable by the bundles' uids: a
    /// system Python, not one under a user's home.
    #[serde(default = "defaults::uv_python")]
    pub python: PathBuf,
    /// uv's download cache, shared by every bundle. Default: `STATE_DIR/uv-cache`.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// A build that takes longer is stopped and the bundle fails.
    #[serde(default = "defaults::uv_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Build packages that have no wheel from source. Off: only wheels are
    /// installed, so no code of the bundle's dependencies runs at install
    /// (a build backend runs with the daemon's privileges).
    #[serde(default)]
    pub build_from_source: bool,
    /// Trust the system's certificate store (a registry behind a TLS proxy
    /// or a private CA); off: uv's built-in roots only.
    #[serde(default = "defaults::uv_system_certs")]
    pub system_certs: bool,
    /// Let a bundle's project take packages from elsewhere than the
    /// configured indexes: direct references (`pkg @ https://…`, `pkg @
    /// file:///…`), `[tool.uv.sources]`, indexes of its own, locked
    /// packages from a URL, git or a path. Off: refused at install (uv,
    /// running as the daemon, would fetch those URLs and read those files).
    #[serde(default)]
    pub allow_direct_references: bool,
}

impl Default for UvSettings {
    fn default() -> Self {
        UvSettings {
            command: defaults::uv_command(),
            python: defaults::uv_python(),
            cache_dir: None,
            timeout: defaults::uv_timeout(),
            build_from_source: false,
            system_certs: defaults::uv_system_certs(),
            allow_direct_references: false,
        }
    }
}

/// `[search]`: tool search (docs/gateway.md, "Finding tools").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    /// A sentence-transformers model folder (BERT family, mean pooling,
    /// `model.safetensors`): tools are also ranked by what they mean. By
    /// their words alone when absent.
    #[serde(default)]
    pub model: Option<PathBuf>,
}

/// `[telemetry]`: OpenTelemetry traces exported over OTLP
/// (docs/operations.md, "Traces").
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The collector's OTLP/HTTP URL (`http://HOST:4318`, or the full
    /// `…/v1/traces`). Off when absent.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
    /// Headers sent with every export (a collector's API key): never logged
    /// or shown.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The spans' `service.name`.
    #[serde(default = "defaults::service_name")]
    pub service_name: String,
    /// The share of new traces recorded (0 to 1); an agent's trace is
    /// recorded as the agent decided (its `traceparent`'s sampled flag).
    #[serde(default = "defaults::sample_ratio")]
    pub sample_ratio: f64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            otlp_endpoint: None,
            headers: BTreeMap::new(),
            service_name: defaults::service_name(),
            sample_ratio: defaults::sample_ratio(),
        }
    }
}

// The headers may hold a collector's key: never printed.
impl std::fmt::Debug for TelemetrySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetrySettings")
            .field("otlp_endpoint", &self.otlp_endpoint)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("service_name", &self.service_name)
            .field("sample_ratio", &self.sample_ratio)
            .finish()
    }
}

impl TelemetrySettings {
    /// What is wrong with these settings, each with its fix.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(endpoint) = &self.otlp_endpoint {
            match url::Url::parse(endpoint) {
                // A key in the URL would be printed wherever the endpoint is.
                Ok(url)
                    if !url.username().is_empty()
                        || url.password().is_some()
                        || url.query().is_some() =>
                {
                    problems.push(
                        "telemetry.otlp_endpoint carries credentials (a user, password or query): give the collector's key in telemetry.headers instead, which is never shown".to_string(),
                    )
                }
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
                _ => problems.push(format!(
                    "telemetry.otlp_endpoint {endpoint:?} is not an http:// or https:// URL (e.g. \"http://127.0.0.1:4318\", the collector's OTLP/HTTP port)"
                )),
            }
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            problems.push(format!(
                "telemetry.sample_ratio {} must be between 0 and 1 (1: every trace)",
                self.sample_ratio
            ));
        }
        if self.service_name.trim().is_empty() {
            problems.push("telemetry.service_name must not be empty".to_string());
        }
        for (name, value) in &self.headers {
            let valid = reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok()
                && reqwest::header::HeaderValue::from_str(value).is_ok();
            if !valid {
                problems.push(format!(
                    "telemetry.headers: {name:?} is not a valid HTTP header name and value"
                ));
            }
        }
        problems
    }
}

/// `[http]`: the MCP gateway served by the daemon over streamable HTTP,
/// `/mcp/WS` and `/mcp/WS/PROFILE`, for agents holding an access token
/// (docs/gateway.md, "Over HTTP").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// `HOST:PORT` (or a port: loopback). Off when absent.
    #[serde(default, deserialize_with = "http_listen")]
    pub listen: Option<std::net::SocketAddr>,
    /// Serve plain HTTP beyond loopback (behind a TLS-terminating proxy).
    #[serde(default)]
    pub insecure: bool,
    /// PEM certificate chain and private key: serve HTTPS (rustls).
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// Browser origins allowed to call (`https://app.example`); a request
    /// with any other `Origin` is refused (DNS-rebinding protection).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes (0: the default, 4 MiB).
    #[serde(default)]
    pub max_body_bytes: usize,
    /// Requests per second one token may make (a bucket of `burst`);
    /// beyond it, 429 with `Retry-After`.
    #[serde(default = "defaults::http_rate_per_sec")]
    pub rate_per_sec: f64,
    #[serde(default = "defaults::http_burst")]
    pub burst: u32,
    /// Sessions the HTTP gateway keeps at once, over all its endpoints; a
    /// new one beyond gets 503 with `Retry-After`.
    #[serde(default = "defaults::http_max_sessions")]
    pub max_sessions: usize,
    /// Sessions one token keeps at once, over all its endpoints (so one
    /// token cannot take them all); a new one beyond gets 503 with
    /// `Retry-After`.
    #[serde(default = "defaults::http_max_sessions_per_token")]
    pub max_sessions_per_token: usize,
    /// A 2026-07-28 agent's request whose bundle asked for input (an
    /// `input_required` result) waits this long for the agent's retry;
    /// then it is ended at the bundle.
    #[serde(default = "defaults::http_input_timeout", with = "humantime_serde")]
    pub input_timeout: Duration,
    /// Requests one token may have waiting for its input at once.
    #[serde(default = "defaults::http_max_waiting_for_input")]
    pub max_waiting_for_input: usize,
    /// Connections a listener (this one and `metrics_addr`) keeps open; a
    /// newcomer beyond closes the longest-idle one, or is refused when all
    /// are busy.
    #[serde(default = "defaults::http_max_connections")]
    pub max_connections: usize,
    /// A request head must arrive within this of the connection being ready
    /// for it (accepted, or its previous answer sent); a TLS handshake too.
    #[serde(default = "defaults::http_head_timeout", with = "humantime_serde")]
    pub head_timeout: Duration,
    /// A request body must arrive within this of its head.
    #[serde(default = "defaults::http_body_timeout", with = "humantime_serde")]
    pub body_timeout: Duration,
    /// A session with no request for this long is ended (within a quarter
    /// more); its agent starts a new one (`initialize`).
    #[serde(default = "defaults::http_session_idle", with = "humantime_serde")]
    pub session_idle: Duration,
    /// Serve `GET /metrics` here too, to anyone who reaches the listener
    /// (it names every workspace and bundle; no token is asked).
    /// `/healthz` and `/readyz` are always served.
    #[serde(default)]
    pub metrics: bool,
    /// Serve the operators' web dashboard under `/ui/` (docs/operations.md,
    /// "The dashboard"): signed in with a one-time link from `bundlevisor
    /// dashboard`, never with an agent's token.
    #[serde(default)]
    pub dashboard: bool,
}

impl Default for HttpSettings {
    fn default() -> Self {
        toml::from_str("").expect("http defaults parse")
    }
}

fn http_listen<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_addr(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("http.listen {e}")))
}

/// Rotation of the per-bundle stderr logs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// A bundle's log is rotated when it grows past this size.
    #[serde(default = "defaults::log_max_bytes")]
    pub max_bytes: u64,
    /// Rotated files kept (`NAME.log.1` … `NAME.log.N`).
    #[serde(default = "defaults::log_keep")]
    pub keep: u32,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            max_bytes: defaults::log_max_bytes(),
            keep: defaults::log_keep(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    pub dir: PathBuf,
    #[serde(default = "defaults::workspace")]
    pub workspace: String,
    /// The folder is a read-only volume only its platform writes (a
    /// Kubernetes ConfigMap volume, which kubelet makes 0777): its write
    /// bits do not count where the daemon's mount table shows that nobody
    /// can write it (docs/operations.md).
    #[serde(default)]
    pub read_only_volume: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostResourcesConfig {
    #[serde(default = "defaults::rate_per_sec")]
    pub rate_per_sec: f64,
    #[serde(default = "defaults::burst")]
    pub burst: u32,
    #[serde(default = "defaults::max_read_bytes")]
    pub max_read_bytes: u64,
}

impl Default for HostResourcesConfig {
    fn default() -> Self {
        HostResourcesConfig {
            rate_per_sec: defaults::rate_per_sec(),
            burst: defaults::burst(),
            max_read_bytes: defaults::max_read_bytes(),
        }
    }
}

/// How bundles are started, called and stopped.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleSettings {
    /// Spawn + `initialize` + `tools/list` must finish within this.
    #[serde(default = "defaults::start_timeout", with = "humantime_serde")]
    pub start_timeout: Duration,
    /// Default timeout of one tool call.
    #[serde(default = "defaults::call_timeout", with = "humantime_serde")]
    pub call_timeout: Duration,
    /// Time between SIGTERM and SIGKILL when a bundle is stopped.
    #[serde(default = "defaults::stop_grace", with = "humantime_serde")]
    pub stop_grace: Duration,
    /// Bundles being started at once (boot reload runs in parallel up to this).
    #[serde(default = "defaults::max_concurrent_starts")]
    pub max_concurrent_starts: usize,
    /// Longest MCP message a bundle may write on stdout; a longer one (or
    /// anything that is not a JSON-RPC message) stops and restarts it.
    #[serde(default = "defaults::max_message_bytes")]
    pub max_message_bytes: usize,
    /// What an archive's `mcpb sign` signature must be: `off` (not
    /// checked), `warn` (checked, shown in `status`, a missing or untrusted
    /// one logged), `require` (an unsigned or untrusted archive is refused
    /// before anything of it is unpacked). A signature that does not match
    /// its archive is refused unless `off`.
    #[serde(default)]
    pub signatures: crate::archive::SignaturePolicy,
    /// PEM files of the certificates a signature must chain to.
    #[serde(default)]
    pub trusted_certs: Vec<PathBuf>,
    /// Under `signatures = "require"`, let bundles that are not archives
    /// (bundle folders and manifest files, watched or installed by path,
    /// which cannot be signed) install and start. Off: they are refused.
    #[serde(default)]
    pub allow_unsigned_folders: bool,
}

impl Default for BundleSettings {
    fn default() -> Self {
        BundleSettings {
            start_timeout: defaults::start_timeout(),
            call_timeout: defaults::call_timeout(),
            stop_grace: defaults::stop_grace(),
            max_concurrent_starts: defaults::max_concurrent_starts(),
            max_message_bytes: defaults::max_message_bytes(),
            signatures: Default::default(),
            trusted_certs: Vec::new(),
            allow_unsigned_folders: false,
        }
    }
}

/// `metrics_addr`: `HOST:PORT`, or a bare port for 127.0.0.1.
fn metrics_addr<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    parse_addr(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("metrics_addr {e}")))
}

/// A listen address (`metrics_addr`, `http.listen`): loopback unless the
/// operator wrote another host; a bare port means 127.0.0.1. The error
/// starts with the value (the caller names the setting).
pub fn parse_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    let text = text.trim();
    if let Ok(port) = text.trim_start_matches(':').parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse()
        .map_err(|_| format!("{text:?} is not HOST:PORT (e.g. \"127.0.0.1:9464\") or a port"))
}

impl Config {
    /// Reads, parses and validates a config file; relative paths become
    /// relative to the file's folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        Config::from_toml(&text, &base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            ConfigError::Invalid { message, .. } => ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text, resolving relative paths against `base`.
    pub fn from_toml(text: &str, base: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        config.state_dir = normalize(&base.join(&config.state_dir));
        config.socket = normalize(&base.join(&config.socket));
        for watch in &mut config.watch {
            watch.dir = normalize(&base.join(&watch.dir));
        }
        for p in &mut config.sandbox.read_only_paths {
            *p = normalize(&base.join(&*p));
        }
        if let Some(root) = &mut config.sandbox.cgroup_root {
            *root = normalize(&base.join(&*root));
        }
        for p in &mut config.sandbox.read_write_paths {
            *p = normalize(&base.join(&*p));
        }
        for o in &mut config.sandbox.bundles {
            for p in o.read_only_paths.iter_mut().chain(&mut o.read_write_paths) {
                *p = normalize(&base.join(&*p));
            }
        }
        if let Some(key_file) = &mut config.credentials.key_file {
            *key_file = normalize(&base.join(&*key_file));
        }
        for cert in &mut config.bundles.trusted_certs {
            *cert = normalize(&base.join(&*cert));
        }
        let secrets = &mut config.secrets;
        for p in [
            &mut secrets.pass_store,
            &mut secrets.gnupg_home,
            &mut secrets.gcp_token_file,
            &mut secrets.vault_token_file,
        ]
        .into_iter()
        .flatten()
        {
            *p = normalize(&base.join(&*p));
        }
        // `[uv]` programs: a path is relative to the file, a bare name is
        // looked up on the daemon's PATH.
        for program in [&mut config.uv.command, &mut config.uv.python] {
            if program.components().count() > 1 {
                *program = normalize(&base.join(&*program));
            }
        }
        for pem in [&mut config.http.tls_cert, &mut config.http.tls_key]
            .into_iter()
            .flatten()
        {
            *pem = normalize(&base.join(&*pem));
        }
        if let Some(cache) = &mut config.uv.cache_dir {
            *cache = normalize(&base.join(&*cache));
        }
        if let Some(model) = &mut config.search.model {
            *model = normalize(&base.join(&*model));
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let hr = &self.host_resources;
        if !(hr.rate_per_sec.is_finite() && hr.rate_per_sec > 0.0) {
            problems.push("host_resources.rate_per_sec must be a positive number".to_string());
        }
        if hr.burst == 0 {
            problems.push("host_resources.burst must be at least 1".to_string());
        }
        let sup = &self.supervision;
        if sup.backoff_initial.is_zero() || sup.backoff_initial > sup.backoff_max {
            problems.push(
                "supervision.backoff_initial must be above 0 and at most backoff_max".to_string(),
            );
        }
        if sup.max_restarts == 0 {
            problems.push("supervision.max_restarts must be at least 1".to_string());
        }
        if sup.ping_failures == 0 {
            problems.push("supervision.ping_failures must be at least 1".to_string());
        }
        if self.logs.max_bytes < 1024 {
            problems.push("logs.max_bytes must be at least 1024".to_string());
        }
        if self.control.max_connections == 0 {
            problems.push("control.max_connections must be at least 1".to_string());
        }
        let cpus = std::iter::once(self.sandbox.cpu_max)
            .chain(self.sandbox.bundles.iter().filter_map(|o| o.cpu_max));
        for cpu in cpus {
            if !(cpu.is_finite() && cpu >= 0.0) {
                problems.push(format!(
                    "sandbox cpu_max {cpu} is not a number of CPUs (e.g. 0.5, 2; 0: not limited)"
                ));
            }
        }
        if !(self.http.rate_per_sec.is_finite() && self.http.rate_per_sec > 0.0)
            || self.http.burst == 0
        {
            problems.push(
                "http.rate_per_sec must be a positive number and http.burst at least 1".to_string(),
            );
        }
        let tls = self.http.tls_cert.is_some() || self.http.tls_key.is_some();
        if self.http.tls_cert.is_some() != self.http.tls_key.is_some() {
            problems.push(
                "http.tls_cert and http.tls_key go together: give both (PEM files) or neither"
                    .to_string(),
            );
        }
        if let Some(addr) = self.http.listen {
            if !addr.ip().is_loopback() && !self.http.insecure && !tls {
                problems.push(format!(
                    "http.listen {addr} is not a loopback address: agents' tokens would cross the network in the clear. Give http.tls_cert and http.tls_key, listen on 127.0.0.1, or set http.insecure = true behind a TLS-terminating proxy"
                ));
            }
        }
        problems.extend(self.telemetry.problems());
        if self.uv.timeout.is_zero() {
            problems.push("uv.timeout must be above 0".to_string());
        }
        if self.http.session_idle.is_zero() {
            problems
                .push("http.session_idle must be above 0 (a duration such as \"5m\")".to_string());
        }
        if self.control.max_in_flight == 0 {
            problems.push("control.max_in_flight must be at least 1".to_string());
        }
        if self.control.max_output_bytes < 64 * 1024 {
            problems.push("control.max_output_bytes must be at least 65536".to_string());
        }
        if self.control.handshake_timeout.is_zero() {
            problems.push("control.handshake_timeout must be above 0".to_string());
        }
        if self.bundles.max_message_bytes < 1024 {
            problems.push("bundles.max_message_bytes must be at least 1024".to_string());
        }
        if self.bundles.signatures == crate::archive::SignaturePolicy::Require
            && self.bundles.trusted_certs.is_empty()
        {
            problems.push(
                "bundles.signatures = \"require\" needs bundles.trusted_certs (PEM files of the certificates signatures must chain to); without them no archive would install".to_string(),
            );
        }
        for cert in &self.bundles.trusted_certs {
            if let Err(e) = crate::archive::load_certs(cert) {
                problems.push(format!("bundles.trusted_certs: {e}"));
            }
        }
        if self.bundles.max_concurrent_starts == 0 {
            problems.push("bundles.max_concurrent_starts must be at least 1".to_string());
        }
        problems.extend(self.secrets.problems(&self.never_secret_sources()));
        if self.credentials.key_file.is_some() && self.credentials.key_env.is_some() {
            problems.push(
                "credentials: set key_file or key_env, not both (the key has one source)"
                    .to_string(),
            );
        }
        for name in self
            .sandbox
            .pass_env
            .iter()
            .chain(self.sandbox.bundles.iter().flat_map(|o| &o.pass_env))
        {
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                problems.push(format!(
                    "sandbox.pass_env: {name:?} is not an environment variable name"
                ));
            }
        }
        let range = self.sandbox.uid_range;
        for uid in &self.control.allowed_uids {
            if range.contains(*uid) {
                problems.push(format!(
                    "control.allowed_uids: {uid} is in sandbox.uid_range {range}, which is for bundles; bundles must never be admitted to the control socket"
                ));
            }
        }
        for gid in &self.control.allowed_gids {
            if range.contains(*gid) {
                problems.push(format!(
                    "control.allowed_gids: {gid} is in sandbox.uid_range {range} (bundle gids); bundles must never be admitted to the control socket"
                ));
            }
        }
        problems.extend(self.sandbox.bundle_user_problems(&self.control));
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.profiles {
            if !seen.insert(p.name.as_str()) {
                problems.push(format!("profile {:?} is defined twice", p.name));
            }
            if let Err(e) = crate::names::check_name("profile", &p.name) {
                problems.push(format!("profile {:?}: {e}", p.name));
            }
        }
        for (i, watch) in self.watch.iter().enumerate() {
            if let Err(e) = crate::names::check_name("workspace", &watch.workspace) {
                problems.push(format!("watch[{i}].workspace: {e}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                path: PathBuf::new(),
                message: problems.join("; "),
            })
        }
    }

    /// The tools of a bundle that are never registered.
    pub fn excluded_tools(&self, workspace: &str, bundle: &str) -> Vec<String> {
        self.exclude_tools
            .iter()
            .filter(|e| e.workspace == workspace && e.bundle == bundle)
            .flat_map(|e| e.tools.iter().cloned())
            .collect()
    }

    /// `state_dir/state.db`
    pub fn db_path(&self) -> PathBuf {
        self.state_dir.join("state.db")
    }

    /// The daemon's own files that no bundle grant may cover: the state dir
    /// (database, key, other bundles' sandboxes), the control socket and a
    /// configured key file.
    /// uv's download cache (`[uv] cache_dir`, default `STATE_DIR/uv-cache`).
    pub fn uv_cache(&self) -> PathBuf {
        self.uv
            .cache_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("uv-cache"))
    }

    /// What no secret reference may read: the daemon's own files and the
    /// credentials it reads the secret stores with.
    pub fn never_secret_sources(&self) -> Vec<PathBuf> {
        let secrets = &self.secrets;
        let mut paths = self.protected_paths();
        paths.extend(
            [
                &secrets.gcp_token_file,
                &secrets.vault_token_file,
                &secrets.gnupg_home,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
        paths
    }

    pub fn protected_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.state_dir.clone(), self.socket.clone()];
        paths.extend(self.credentials.key_file.clone());
        paths
    }

    /// `state_dir/logs/WS/NAME.log`
    pub fn log_path(&self, workspace: &str, name: &str) -> PathBuf {
        self.state_dir
            .join("logs")
            .join(workspace)
            .join(format!("{name}.log"))
    }
}

/// Removes `.` and resolves `..` lexically (the paths may not exist yet).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_and_bundle_uids_are_never_admitted() {
        let base = Path::new("/");
        let c = Config::from_toml("[sandbox]\nuid_range = \"300000-300009\"\n", base).unwrap();
        assert_eq!(
            c.sandbox.uid_range,
            UidRange {
                first: 300000,
                last: 300009
            }
        );
        assert!(c.sandbox.uid_range.contains(300009) && !c.sandbox.uid_range.contains(300010));
        for bad in ["\"5-1\"", "\"0-100\"", "\"abc\"", "\"1000-4294967295\""] {
            let err = Config::from_toml(&format!("[sandbox]\nuid_range = {bad}\n"), base)
                .unwrap_err()
                .to_string();
            assert!(err.contains("FIRST-LAST"), "{bad}: {err}");
        }
        let err = Config::from_toml("[control]\nallowed_uids = [2000000005]\n[sandbox]\n", base)
            .unwrap_err()
            .to_string();
        assert!(err.contains("uid_range"), "{err}");
    }

    #[test]
    fn store_addresses_are_https_or_near() {
        for ok in [
            "https://vault.example:8200",
            "http://127.0.0.1:8200",
            "http://[::1]:1",
            "http://metadata.google.internal",
            "http://169.254.169.254",
        ] {
            assert_eq!(super::check_store_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://vault.example:8200",
            "https://user:pw@vault.example",
            "https://vault.example/?token=x",
            "vault.example",
        ] {
            assert!(super::check_store_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secret_rules_never_reach_the_daemons_own_files_and_stores_are_https() {
        let err = |text: &str| {
            Config::from_toml(text, Path::new("/srv/bv/config"))
                .unwrap_err()
                .to_string()
        };
        // The state folder (relative to the config file) is not a source.
        let e = err("state_dir = \"state\"\n[secrets]\nallow = [{ scheme = \"file\", prefix = \"/srv/bv\" }]\n");
        assert!(
            e.contains("overlaps the daemon's own /srv/bv/config/state"),
            "{e}"
        );
        let e = err("[secrets]\nallow = [{ scheme = \"file\", prefix = \"run/secrets\" }]\n");
        assert!(e.contains("must be an absolute folder"), "{e}");
        let e = err("[secrets]\nvault_token_file = \"/run/vault/token\"\nallow = [{ scheme = \"file\", prefix = \"/run/vault\" }]\n");
        assert!(
            e.contains("overlaps the daemon's own /run/vault/token"),
            "{e}"
        );
        let e = err("[secrets]\nallow = [{ scheme = \"vault\", prefix = \"/secret/team\" }]\n");
        assert!(e.contains("without a leading '/'"), "{e}");
        let e = err("[secrets]\nallow = [{ scheme = \"ssm\", prefix = \"x\" }]\n");
        assert!(e.contains("is not one of credential, file"), "{e}");
        let e = err("[secrets]\nvault_addr = \"http://vault.example:8200\"\n");
        assert!(
            e.contains("secrets.vault_addr") && e.contains("https://"),
            "{e}"
        );
        let ok = Config::from_toml(
            "[secrets]\nvault_addr = \"https://vault.example:8200\"\nallow = [{ scheme = \"file\", prefix = \"/run/secrets\", uids = [1000] }]\n",
            Path::new("/srv/bv/config"),
        )
        .unwrap();
        assert_eq!(ok.secrets.allow[0].uids, [1000]);
    }

    #[test]
    fn shipped_example_config_parses_with_documented_values() {
        let text = include_str!("../../config/bundlevisor.toml");
        let config = Config::from_toml(text, Path::new("/srv/bv/config")).unwrap();
        assert_eq!(config.state_dir, Path::new("/srv/bv/.bundlevisor/state"));
        assert_eq!(config.watch[0].dir, Path::new("/srv/bv/bundles"));
        assert_eq!(config.watch.len(), 1);
        assert_eq!(config.watch[0].workspace, "default");
        assert_eq!(config.host_resources.burst, 1000);
        assert_eq!(config.host_resources.max_read_bytes, 10 * 1024 * 1024);
        assert_eq!(config.bundles.stop_grace, Duration::from_secs(5));
        // The example documents the defaults: parsing it equals the defaults.
        let defaults = Config::from_toml("", Path::new("/")).unwrap();
        assert_eq!(
            format!("{:?}", config.supervision),
            format!("{:?}", defaults.supervision)
        );
        assert_eq!(config.logs.max_bytes, defaults.logs.max_bytes);
        assert_eq!(config.watch_debounce, defaults.watch_debounce);
        assert_eq!(
            format!("{:?}", config.control),
            format!("{:?}", defaults.control)
        );
        assert_eq!(
            format!("{:?}", config.telemetry),
            format!("{:?}", defaults.telemetry)
        );
        // `allow_same_uid` is the example's one departure (so that `make
        // run` works as a normal user); the rest are the defaults.
        assert!(config.sandbox.allow_same_uid && !defaults.sandbox.allow_same_uid);
        let sandbox = SandboxSettings {
            allow_same_uid: false,
            ..config.sandbox.clone()
        };
        assert_eq!(format!("{sandbox:?}"), format!("{:?}", defaults.sandbox));
    }

    /// `[telemetry]`: an endpoint that is not an http(s) URL, a ratio
    /// outside 0..1 and a header that cannot be sent are refused, each
    /// naming the key; a collector's key is never in the settings' Debug.
    #[test]
    fn bad_telemetry_settings_are_refused_and_headers_never_printed() {
        let base = Path::new("/");
        for (text, says) in [
            (
                "otlp_endpoint = \"localhost:4318\"",
                "telemetry.otlp_endpoint",
            ),
            (
                "otlp_endpoint = \"file:///tmp/x\"",
                "telemetry.otlp_endpoint",
            ),
            (
                "otlp_endpoint = \"https://u:CANARY@otel:4318\"",
                "never shown",
            ),
            (
                "otlp_endpoint = \"https://otel:4318/v1/traces?key=CANARY\"",
                "never shown",
            ),
            ("sample_ratio = -0.5", "telemetry.sample_ratio"),
            ("service_name = \" \"", "telemetry.service_name"),
            ("headers = { \"bad name\" = \"x\" }", "telemetry.headers"),
            (
                "headers = { \"x-key\" = \"line\\nbreak\" }",
                "telemetry.headers",
            ),
        ] {
            let err = Config::from_toml(&format!("[telemetry]\n{text}\n"), base).unwrap_err();
            assert!(err.to_string().contains(says), "{text}: {err}");
        }
        let config = Config::from_toml(
            "[telemetry]\notlp_endpoint = \"https://otel.example:4318\"\nheaders = { \"x-api-key\" = \"CANARY-k\" }\n",
            base,
        )
        .unwrap();
        assert!(!format!("{config:?}").contains("CANARY-k"));
        assert!(format!("{:?}", config.telemetry).contains("x-api-key"));
    }

    /// Issue 30, finding 15: a config that says nothing caps every bundle's
    /// tree; 0 lifts a cap, for all bundles or one.
    #[test]
    fn bundles_are_capped_unless_the_operator_lifts_the_caps() {
        let config = Config::from_toml("", Path::new("/")).unwrap();
        let limits = config.sandbox.cgroup_limits("default", "any");
        assert_eq!(limits.pids_max, Some(256));
        assert_eq!(limits.memory_max, Some(1024 * 1024 * 1024));
        assert_eq!(limits.cpu_max, None);
        let text =
            "[sandbox]\npids_max = 0\n[[sandbox.bundle]]\nbundle = \"big\"\nmemory_max = 0\n";
        let config = Config::from_toml(text, Path::new("/")).unwrap();
        let limits = config.sandbox.cgroup_limits("default", "big");
        assert_eq!((limits.pids_max, limits.memory_max), (None, None));
        let limits = config.sandbox.cgroup_limits("default", "other");
        assert_eq!(limits.memory_max, Some(1024 * 1024 * 1024));
    }

    #[test]
    fn empty_config_takes_defaults_relative_to_its_folder() {
        let config = Config::from_toml("", Path::new("/etc/bv")).unwrap();
        assert_eq!(
            config.socket,
            Path::new("/etc/bv/.bundlevisor/bundlevisor.sock")
        );
        assert_eq!(config.bundles.call_timeout, defaults::call_timeout());
        assert!(config.watch.is_empty());
    }

    #[test]
    fn per_bundle_restart_overrides_apply_only_to_their_bundle() {
        let text = "[supervision]\nrestart = \"never\"\n[[supervision.override]]\nbundle = \"a\"\nrestart = \"always\"\n";
        let config = Config::from_toml(text, Path::new("/")).unwrap();
        assert_eq!(
            config.supervision.restart_for("default", "a"),
            RestartPolicy::Always
        );
        assert_eq!(
            config.supervision.restart_for("other", "a"),
            RestartPolicy::Never
        );
        assert_eq!(
            config.supervision.restart_for("default", "b"),
            RestartPolicy::Never
        );
        let err = Config::from_toml("[supervision]\nrestart = \"sometimes\"\n", Path::new("/"))
            .unwrap_err();
        assert!(err.to_string().contains("sometimes"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let err = Config::from_toml("sokcet = \"x\"", Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("sokcet"), "{err}");
        let err = Config::from_toml(
            "[host_resources]\nburst = 0\nrate_per_sec = -1\n",
            Path::new("/"),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("burst") && text.contains("rate_per_sec"),
            "{text}"
        );
        let err =
            Config::from_toml("[bundles]\nstop_grace = \"soon\"\n", Path::new("/")).unwrap_err();
        assert!(
            err.to_string().contains("stop_grace") || err.to_string().contains("soon"),
            "{err}"
        );
    }

    /// A profile names a tool by (bundle, tool): a string that splits at
    /// `__` in one way only is that pair, one that splits in several ways
    /// is refused with every reading, and the table form says it exactly.
    #[test]
    fn profile_exclusions_name_one_tool_of_one_bundle() {
        let base = Path::new("/");
        let profile = |entries: &str| {
            Config::from_toml(
                &format!("[[profile]]\nname = \"p\"\nexclude_tools = [{entries}]\n"),
                base,
            )
            .map(|c| c.profiles[0].exclude_tools.clone())
            .map_err(|e| e.to_string())
        };
        let pair = |bundle: &str, tool: &str| ToolRef {
            bundle: bundle.into(),
            tool: tool.into(),
        };
        assert_eq!(
            profile(r#""demo__sleep", "my_bundle__a-b""#).unwrap(),
            [pair("demo", "sleep"), pair("my_bundle", "a-b")]
        );
        // "demo__x/y" is no bundle name: one reading is left.
        assert_eq!(
            profile(r#""demo__x/y__z""#).unwrap(),
            [pair("demo", "x/y__z")]
        );
        assert_eq!(
            profile(r#"{ bundle = "a__b", tool = "sh" }, { bundle = "a", tool = "b__sh" }"#)
                .unwrap(),
            [pair("a__b", "sh"), pair("a", "b__sh")]
        );
        let err = profile(r#""a__b__sh""#).unwrap_err();
        assert!(
            err.contains("ambiguous")
                && err.contains(r#"{ bundle = "a", tool = "b__sh" }"#)
                && err.contains(r#"{ bundle = "a__b", tool = "sh" }"#),
            "{err}"
        );
        let err = profile(r#""a___b""#).unwrap_err();
        assert!(err.contains("ambiguous"), "{err}");
        for bad in [r#""sleep""#, r#""demo__""#, r#""__sleep""#] {
            let err = profile(bad).unwrap_err();
            assert!(err.contains("BUNDLE__TOOL"), "{bad}: {err}");
        }
        let err = profile(r#"{ bundle = "../x", tool = "sh" }"#).unwrap_err();
        assert!(err.contains("../x"), "{err}");
        let err = profile(r#"{ bundle = "a", tool = "sh", extra = 1 }"#).unwrap_err();
        assert!(err.contains("exclude_tools"), "{err}");
    }
}
