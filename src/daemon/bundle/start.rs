//! A bundle's start, run in a task of its own (never in the actor's
//! handler): which manifest, the stored values, the launch plan, the
//! sandbox, then the one connect function — with the OAuth retry of remote
//! bundles.
//!
//! Which manifest is the lifecycle's decision ([`Wanted`]); when it is the
//! file on disk, the start falls back to the last good manifest (kept in
//! memory, and — for MCPB manifests, which hold no secrets — in
//! `STATE_DIR/manifests/WS/NAME.json` across daemon restarts) when the file
//! is broken, half-written or renames the bundle.

use std::path::{Path, PathBuf};

use crate::bundle::{connect, ConnectError, ConnectOptions, HostContext, Session};
use crate::config::Config;
use crate::daemon::secret_watch::ReadRef;
use crate::host_resources::PROVIDED_CAPABILITIES;
use crate::manifest::{LoadedManifest, Plan, PlanError, RemotePlan};
use crate::oauth::Silent;
use crate::protocol::SandboxRecord;
use crate::store::TokenSet;
use crate::telemetry::{Attribute, Kind, Trace};

use super::super::lifecycle::{FailKind, StartFailure, Wanted};
use super::super::Shared;

/// A successful start.
pub struct Started {
    pub session: Session,
    /// The manifest the bundle now runs (the last good one from now on).
    pub manifest: LoadedManifest,
    /// The archive it was unpacked from, with what its signature said.
    pub archive: Option<crate::protocol::ArchiveInfo>,
    /// A remote bundle got a new token on the way (refresh or client credentials).
    pub reauthorized: bool,
    /// The manifest on disk was refused, and the last good one runs instead.
    pub rejected: Option<String>,
    /// The secret references its values were read from.
    pub refs: Vec<crate::daemon::secret_watch::ReadRef>,
}

/// The archive a bundle folder was unpacked from, and its signature.
fn archive_info(loaded: &LoadedManifest, state_dir: &Path) -> Option<crate::protocol::ArchiveInfo> {
    use crate::archive::Signature;
    let root = crate::archive::root(state_dir);
    let sha256 = crate::archive::unpacked_sha(&loaded.dir, &root)?;
    let (signature, signer) = match crate::archive::recorded_signature(&loaded.dir) {
        Some(Signature::NotChecked) | None => ("not_checked", None),
        Some(Signature::Unsigned) => ("unsigned", None),
        Some(Signature::Signed { signer }) => ("signed", Some(signer)),
        Some(Signature::Untrusted { signer, .. }) => ("untrusted", Some(signer)),
    };
    Some(crate::protocol::ArchiveInfo {
        sha256,
        unpacked: loaded.dir.display().to_string(),
        signature: signature.to_string(),
        signer,
    })
}

/// Where the last good manifest of a bundle is kept across daemon restarts.
pub fn snapshot_path(state_dir: &Path, workspace: &str, name: &str) -> PathBuf {
    state_dir
        .join("manifests")
        .join(workspace)
        .join(format!("{name}.json"))
}

/// Keeps `text` as the bundle's last good manifest (atomically: a crash
/// leaves the old copy or the new one, never half of one).
fn save_snapshot(path: &Path, loaded: &LoadedManifest) -> std::io::Result<()> {
    // The manifest's text and where it was read (a bundle folder, or the
    // unpacked copy of an archive, which is then kept while this names it).
    let text = serde_json::json!({
        "file": loaded.file,
        "manifest": &*loaded.text,
    })
    .to_string();
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    // The daemon's alone, like the rest of the state dir.
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Why the manifest on disk cannot be used.
enum Refused {
    /// There is no manifest any more (the folder is gone): nothing to run.
    Gone(String),
    /// It is there but broken, half-written, renamed or gated out: the
    /// last good one may run instead.
    Invalid(String),
}

/// The last good manifest kept at `path`, validated again.
fn read_snapshot(path: &Path) -> Option<LoadedManifest> {
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let file = PathBuf::from(kept.get("file")?.as_str()?);
    crate::manifest::from_text(file, kept.get("manifest")?.as_str()?).ok()
}

/// The files the kept last good manifests were read from.
pub fn snapshot_files(state_dir: &Path) -> Vec<PathBuf> {
    let root = state_dir.join("manifests");
    let Ok(workspaces) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    workspaces
        .flatten()
        .filter_map(|ws| std::fs::read_dir(ws.path()).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| read_snapshot(&e.path()))
        .map(|m| m.file)
        .collect()
}

/// Reads and checks the manifest on disk: valid, still naming this bundle,
/// and accepted by the install gate.
fn from_disk(
    source: &Path,
    name: &str,
    config: &Config,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<LoadedManifest, Refused> {
    let loaded = super::super::source::load_with(source, config, progress).map_err(|e| {
        if e.is_gone() {
            Refused::Gone(e.to_string())
        } else {
            Refused::Invalid(e.to_string())
        }
    })?;
    check(&loaded, name).map_err(Refused::Invalid)?;
    Ok(loaded)
}

fn check(loaded: &LoadedManifest, name: &str) -> Result<(), String> {
    if loaded.manifest.name != name {
        return Err(format!(
            "manifest {} now names the bundle {:?}, but it was installed as {name:?}; uninstall and install it again",
            loaded.file.display(),
            loaded.manifest.name
        ));
    }
    crate::manifest::gate(&loaded.manifest, PROVIDED_CAPABILITIES).map_err(|e| e.to_string())
}

/// The manifest a start uses, and why the disk's was refused if it was
/// (an archive whose unpacked copy is gone is unpacked again, its progress
/// told to `progress`). Runs on the blocking pool.
fn choose(
    wanted: Wanted<LoadedManifest>,
    (source, name): (&Path, &str),
    snapshot: &Path,
    config: &Config,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(LoadedManifest, Option<String>), String> {
    let (loaded, rejected) = match wanted {
        Wanted::Exactly(m) => (m, None),
        Wanted::FromDisk { last_good } => match from_disk(source, name, config, progress) {
            Ok(m) => (m, None),
            Err(Refused::Gone(why)) => return Err(why),
            Err(Refused::Invalid(why)) => {
                let kept = last_good.or_else(|| {
                    let m = read_snapshot(snapshot)?;
                    check(&m, name).ok().map(|()| m)
                });
                match kept {
                    Some(m) => (m, Some(why)),
                    None => return Err(why),
                }
            }
        },
    };
    // A remote bundle file may hold a client secret or header values: its
    // last good version is kept in memory only, never in the clear on disk.
    let remote = matches!(
        loaded.manifest.transport,
        crate::manifest::Transport::Remote(_)
    );
    if rejected.is_none() && !remote {
        if let Err(e) = save_snapshot(snapshot, &loaded) {
            tracing::warn!(bundle = name, file = %snapshot.display(), "cannot keep a copy of the manifest: {e}");
        }
    }
    Ok((loaded, rejected))
}

/// What one start is asked to do.
pub struct Attempt {
    /// Which manifest, as the lifecycle decided.
    pub wanted: Wanted<LoadedManifest>,
    /// The challenge of the 401 or 403 that ended the last session (a
    /// remote bundle gets a token for it before connecting).
    pub challenge: Option<String>,
    /// The start's trace: its phases are spans of it.
    pub trace: Trace,
}

/// A start failure that a restart cannot fix.
fn config(reason: String) -> StartFailure {
    StartFailure {
        kind: FailKind::Config,
        reason,
    }
}

/// Chooses the manifest, resolves the launch plan, prepares the sandbox and
/// connects.
pub async fn start(
    shared: &Shared,
    workspace: &str,
    name: &str,
    source: PathBuf,
    Attempt {
        wanted,
        challenge,
        trace,
    }: Attempt,
    host: HostContext,
    report_sandbox: impl FnOnce(SandboxRecord),
) -> Result<Started, StartFailure> {
    let owner = crate::daemon::secret_watch::source_owner(&source).await;
    let (loaded, rejected, archive) =
        read_manifest(shared, (workspace, name), source, wanted).await?;
    let (mut plan, refs) = resolve_plan(shared, (workspace, name, owner), &loaded).await?;
    // A uv bundle runs in the environment built for its version (built
    // now if there is none yet: after an install or an upgrade).
    let environment = match &mut plan {
        Plan::Stdio(launch) if loaded.manifest.is_uv() => {
            Some(uv_environment(shared, workspace, name, &loaded, launch).await?)
        }
        _ => None,
    };
    let _permit = shared
        .start_permits
        .acquire()
        .await
        .map_err(|_| config("daemon is shutting down".into()))?;
    // The sandbox of a stdio bundle: created (or found) before each start.
    let sandbox = match &plan {
        Plan::Stdio(launch) => {
            let span = trace.span("bundle.sandbox", Kind::Internal, Vec::new());
            let prepared =
                prepare_sandbox(shared, (workspace, name), &loaded, launch, environment).await;
            match &prepared {
                Ok(_) => span.end("ok", None),
                Err(failed) => span.end("error", Some(&failed.reason)),
            }
            Some(prepared?)
        }
        Plan::Remote(_) => None,
    };
    if let Some(s) = &sandbox {
        report_sandbox(s.record.clone());
    }
    // Removed if the start fails (a process that ran is reaped from it by
    // its watcher; one that never ran leaves it empty).
    let cgroup = sandbox.as_ref().and_then(|s| s.cgroup.clone());
    let opts = ConnectOptions {
        log: crate::logfile::LogTarget {
            path: shared.config.log_path(workspace, name),
            max_bytes: shared.config.logs.max_bytes,
            keep: shared.config.logs.keep,
            bus: Some(shared.log_lines.clone()),
        },
        start_timeout: shared.config.bundles.start_timeout,
        stop_grace: shared.config.bundles.stop_grace,
        host_resources: shared.config.host_resources.clone(),
        reaper: shared.reaper.clone(),
        bearer: None,
        max_message_bytes: shared.config.bundles.max_message_bytes,
        sandbox,
        legacy: legacy_revision(&loaded.manifest),
        host_channel: legacy_revision(&loaded.manifest).is_some(),
        trace,
    };
    let (session, reauthorized) = match &plan {
        Plan::Stdio(_) => match connect(&plan, host, &opts).await {
            Ok(session) => (session, false),
            Err(e) => {
                if let ConnectError::Exited { exit, .. } = &e {
                    if exit.oom_killed {
                        shared.metrics.oom_killed(workspace, name);
                    }
                }
                if let Some(cg) = cgroup {
                    let _ = tokio::task::spawn_blocking(move || cg.finish()).await;
                }
                // Refused by the kernel (permissions, Landlock): starting
                // again changes nothing, so it is not a crash. (What is not
                // there was said before the spawn; a mount that comes late
                // is worth a retry.)
                if let ConnectError::Spawn(spawn) = &e {
                    if spawn.source.kind() == std::io::ErrorKind::PermissionDenied {
                        let reason = plan.redactor().redact(&e.to_string()).into_owned();
                        return Err(config(format!(
                            "{reason}; not retried: fix the permissions (or [sandbox] read_only_paths), then `bundlevisor restart {name}`"
                        )));
                    }
                }
                return Err(transient(&plan, e));
            }
        },
        Plan::Remote(remote) => {
            connect_with_auth(
                shared,
                (workspace, name),
                &plan,
                remote,
                host,
                opts,
                challenge,
            )
            .await?
        }
    };
    Ok(Started {
        refs,
        session,
        manifest: loaded,
        archive,
        reauthorized,
        rejected,
    })
}

/// What a start runs: the manifest, why the disk's was refused (if it
/// was), and the archive it came from.
type Chosen = (
    LoadedManifest,
    Option<String>,
    Option<crate::protocol::ArchiveInfo>,
);

/// The manifest the start uses, its files and signature judged again
/// (whichever manifest runs), and the archive it came from. On the
/// blocking pool.
async fn read_manifest(
    shared: &Shared,
    (workspace, name): (&str, &str),
    source: PathBuf,
    wanted: Wanted<LoadedManifest>,
) -> Result<Chosen, StartFailure> {
    let snapshot = snapshot_path(&shared.config.state_dir, workspace, name);
    let (name, settings) = (name.to_string(), shared.config.clone());
    let mut progress = shared.board.unpack_progress(workspace, &source);
    tokio::task::spawn_blocking(move || {
        let (loaded, rejected) = choose(
            wanted,
            (&source, &name),
            &snapshot,
            &settings,
            &mut progress,
        )?;
        super::super::trusted::may_run(&loaded, &source, &settings)?;
        let archive = archive_info(&loaded, &settings.state_dir);
        Ok::<_, String>((loaded, rejected, archive))
    })
    .await
    .map_err(|e| config(format!("manifest reader failed: {e}")))?
    .map_err(config)
}

/// The launch plan, with the bundle's stored user_config values; a
/// missing required one is `needs_config`.
async fn resolve_plan(
    shared: &Shared,
    (workspace, name, owner): (&str, &str, Option<u32>),
    loaded: &LoadedManifest,
) -> Result<(Plan, Vec<ReadRef>), StartFailure> {
    let (values, refs) = shared
        .user_values(workspace, name, owner)
        .await
        .map_err(|e| e.start_failure(workspace, name))?;
    // `${HOME}` is the bundle's own home (its sandbox data folder).
    let home = crate::bundle::sandbox::data_dir(&shared.config.state_dir, workspace, name);
    let plan = loaded
        .manifest
        .plan_with_home(&loaded.dir, &values, Some(&home))
        .map_err(|e| match e {
            PlanError::MissingConfig(keys) => StartFailure {
                kind: FailKind::NeedsConfig,
                reason: format!(
                    "required user_config value(s) not set: {}; set them with `bundlevisor configure {name} -w {workspace} {}`",
                    keys.join(", "),
                    keys.iter().map(|k| format!("{k}=VALUE")).collect::<Vec<_>>().join(" ")
                ),
            },
            other => config(other.to_string()),
        })?;
    Ok((plan, refs))
}

/// The sandbox of a stdio bundle, created (or found) and its cgroup
/// joined, on the blocking pool.
async fn prepare_sandbox(
    shared: &Shared,
    (workspace, name): (&str, &str),
    loaded: &LoadedManifest,
    launch: &crate::manifest::LaunchPlan,
    environment: Option<PathBuf>,
) -> Result<crate::bundle::sandbox::Sandbox, StartFailure> {
    let (settings, state_dir, protected, ws, bundle, cwd, command) = (
        shared.config.sandbox.clone(),
        shared.config.state_dir.clone(),
        shared.config.protected_paths(),
        workspace.to_string(),
        name.to_string(),
        launch.cwd.clone(),
        launch.command.clone(),
    );
    let configured = launch.paths.clone();
    let path = launch.env.get("PATH").cloned();
    let cgroups = shared.cgroups.clone();
    // A bare manifest file's folder is not the bundle's to read.
    let folder = (!loaded.is_bare()).then(|| loaded.dir.clone());
    tokio::task::spawn_blocking(move || {
        let target = crate::bundle::sandbox::Target {
            workspace: &ws,
            bundle: &bundle,
            folder: folder.as_deref(),
            command: &command,
            cwd: &cwd,
            configured: &configured,
            environment: environment.as_deref(),
            path: path.as_deref().map(std::ffi::OsStr::new),
        };
        let mut sandbox =
            crate::bundle::sandbox::prepare(&settings, &state_dir, &protected, &target)
                .map_err(|e| e.to_string())?;
        sandbox
            .contain(&cgroups, &settings, &ws, &bundle)
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(sandbox)
    })
    .await
    .map_err(|e| config(format!("sandbox task failed: {e}")))?
    .map_err(config)
}

/// Finds or builds the environment of the uv bundle `loaded` (each line uv
/// prints is a `preparing` event, with the bundle in `state`). Used by a
/// start, and ahead of an upgrade while the running version serves.
pub(super) async fn build_uv_environment(
    shared: &Shared,
    workspace: &str,
    name: &str,
    loaded: &LoadedManifest,
    state: crate::protocol::BundleState,
) -> Result<crate::bundle::uv::Environment, crate::bundle::uv::UvError> {
    use crate::protocol::{EventKind, LifecycleEvent};
    let pass_env = shared.config.sandbox.pass_env_for(workspace, name);
    let project = crate::bundle::uv::Project {
        state_dir: &shared.config.state_dir,
        workspace,
        bundle: name,
        folder: &loaded.dir,
        pass_env: &pass_env,
    };
    let progress = |line: &str| {
        shared.board.emit(LifecycleEvent::new(
            workspace,
            name,
            EventKind::Preparing,
            state,
            line,
        ));
    };
    let env = crate::bundle::uv::ensure(
        &shared.config.uv,
        &shared.config.uv_cache(),
        &project,
        progress,
    )
    .await?;
    if env.built {
        tracing::info!(workspace, bundle = name, env = %env.dir.display(), "built the bundle's Python environment");
    }
    Ok(env)
}

/// Points a uv bundle's launch at its environment (built now if there is
/// none yet: after an install or an upgrade): `python` is its Python, `uv`
/// the daemon's uv, which finds it through `UV_PROJECT_ENVIRONMENT` and
/// never syncs. A build that fails is `failed`, not retried: the operator
/// fixes the bundle, the index or the network, then restarts it.
async fn uv_environment(
    shared: &Shared,
    workspace: &str,
    name: &str,
    loaded: &LoadedManifest,
    launch: &mut crate::manifest::LaunchPlan,
) -> Result<PathBuf, StartFailure> {
    let state = crate::protocol::BundleState::Starting;
    let env = build_uv_environment(shared, workspace, name, loaded, state)
        .await
        .map_err(|e| StartFailure {
            kind: FailKind::Config,
            reason: launch.redactor.redact(&e.to_string()).into_owned(),
        })?;
    // The previous version's process has stopped: its environment may go.
    let cleanup = env.clone();
    let _ = tokio::task::spawn_blocking(move || cleanup.remove_others()).await;
    let bin = env.dir.join("bin");
    match launch.command.as_str() {
        crate::manifest::UV_PYTHON | "python3" => {
            launch.command = bin.join("python").to_string_lossy().into_owned();
        }
        "uv" => {
            if let Some(uv) = crate::bundle::uv::uv_program(&shared.config.uv) {
                launch.command = uv.to_string_lossy().into_owned();
            }
        }
        _ => {}
    }
    let path = std::env::var("PATH").unwrap_or_default();
    let tmp = crate::bundle::sandbox::data_dir(&shared.config.state_dir, workspace, name)
        .with_file_name("tmp");
    for (key, value) in [
        ("VIRTUAL_ENV", env.dir.to_string_lossy().into_owned()),
        (
            "UV_PROJECT_ENVIRONMENT",
            env.dir.to_string_lossy().into_owned(),
        ),
        ("UV_NO_SYNC", "1".into()),
        ("UV_OFFLINE", "1".into()),
        ("UV_NO_CONFIG", "1".into()),
        ("UV_PYTHON_DOWNLOADS", "never".into()),
        (
            "UV_CACHE_DIR",
            tmp.join("uv-cache").to_string_lossy().into_owned(),
        ),
        ("PATH", format!("{}:{path}", bin.display())),
    ] {
        launch.env.entry(key.to_string()).or_insert(value);
    }
    Ok(env.dir)
}

/// A start failure worth retrying; the text is redacted (a command line or
/// a stderr line may carry a secret).
fn transient(plan: &Plan, e: ConnectError) -> StartFailure {
    StartFailure {
        kind: FailKind::Transient,
        reason: plan.redactor().redact(&e.to_string()).into_owned(),
    }
}

/// Silent re-grants for a scope a new token lacks, per start.
const MAX_STEP_UPS: usize = 1;

/// A stored access token this close to its expiry is refreshed before use.
const EXPIRY_MARGIN_SECS: i64 = 30;

/// Connects a remote bundle with its stored token. On 401: one silent
/// token attempt (stored refresh token, then client credentials), stored at
/// once, and one rebuild through the one connect function. When only the
/// interactive flow can help: `needs_auth`, never a restart loop.
async fn connect_with_auth(
    shared: &Shared,
    (workspace, name): (&str, &str),
    plan: &Plan,
    remote: &RemotePlan,
    host: HostContext,
    mut opts: ConnectOptions,
    // The challenge that ended the last session (its token lacked a scope).
    pending: Option<String>,
) -> Result<(Session, bool), StartFailure> {
    let stored = {
        shared
            .credentials_of(workspace, name, |c, w, n| c.tokens(w, n))
            .await
            .map_err(|e| StartFailure {
                kind: FailKind::Config,
                reason: e.to_string(),
            })?
            .unwrap_or_default()
    };
    opts.bearer = stored.access_token.clone();
    // A token known to have expired is refreshed first: no 401 round trip.
    let expired = stored.refresh_token.is_some()
        && stored
            .expires_at
            .is_some_and(|at| at <= crate::clock::unix_secs() + EXPIRY_MARGIN_SECS);
    // A scope the last session's token lacked is asked for at once.
    let pending = pending.filter(|c| crate::oauth::insufficient_scope(c));
    let challenge = if pending.is_some() {
        pending
    } else if expired {
        None
    } else {
        match connect(plan, host.clone(), &opts).await {
            Ok(session) => return Ok((session, false)),
            Err(ConnectError::Unauthorized { challenge }) => challenge,
            Err(e) => return Err(transient(plan, e)),
        }
    };
    let needs_auth = |why: &str| needs_auth(&remote.url, (workspace, name), why);
    let http = crate::oauth::http_client();
    let (mut stored, mut challenge) = (stored, challenge);
    // Kept with the tokens: `bundlevisor auth` discovers from it and asks
    // for its scope (rmcp's own probe is a GET, which a server without a
    // GET stream answers 405, with no challenge).
    if challenge.is_some() {
        stored.challenge = challenge.clone();
    }
    // The first silent grant, then at most one step-up for a scope the
    // new token lacks (403 `insufficient_scope`): bounded, never a loop.
    for attempt in 0..=MAX_STEP_UPS {
        let silent = Silently {
            http: &http,
            remote,
            stored: &stored,
            challenge: challenge.as_deref(),
        };
        let tokens = obtain_traced(shared, (workspace, name), silent, &opts.trace).await?;
        opts.bearer = tokens.access_token.clone();
        store_tokens(shared, (workspace, name), tokens.clone()).await?;
        tracing::info!(
            workspace,
            bundle = name,
            "new token; rebuilding the session"
        );
        match connect(plan, host.clone(), &opts).await {
            Ok(session) => return Ok((session, true)),
            Err(ConnectError::Unauthorized { challenge: again }) => {
                let scope = crate::oauth::step_up(again.as_deref());
                match scope {
                    Some(_) if attempt < MAX_STEP_UPS => {
                        tracing::info!(
                            workspace,
                            bundle = name,
                            "the new token lacks a scope; asking for it too"
                        );
                        (stored, challenge) = (
                            TokenSet {
                                challenge: again.clone(),
                                ..tokens
                            },
                            again,
                        );
                    }
                    Some(scope) => {
                        // `bundlevisor auth` asks for it next.
                        let wanted = TokenSet {
                            wanted_scopes: crate::oauth::union(
                                tokens.wanted_scopes.clone(),
                                scope.clone(),
                            ),
                            challenge: again,
                            ..tokens
                        };
                        keep_tokens(shared, (workspace, name), wanted, "store the wanted scope")
                            .await;
                        return Err(needs_auth(&format!(
                            "it needs the scope {:?}, which a silent grant did not get",
                            scope.join(" ")
                        )));
                    }
                    None => return Err(needs_auth("it refused a freshly issued token")),
                }
            }
            Err(e) => return Err(transient(plan, e)),
        }
    }
    unreachable!("the last attempt returns")
}

/// What a silent grant is asked with.
struct Silently<'a> {
    http: &'a crate::oauth::Http,
    remote: &'a RemotePlan,
    stored: &'a TokenSet,
    challenge: Option<&'a str>,
}

/// A token obtained without the operator (refresh token, client
/// credentials, an enterprise grant), an `oauth.refresh` span of the
/// start's trace; refused: the tokens worth keeping kept, and `needs_auth`.
async fn obtain_traced(
    shared: &Shared,
    (workspace, name): (&str, &str),
    ask: Silently<'_>,
    trace: &Trace,
) -> Result<TokenSet, StartFailure> {
    let span = trace.span(
        "oauth.refresh",
        Kind::Client,
        vec![
            Attribute::new(
                "bundlevisor.refresh_token",
                ask.stored.refresh_token.is_some(),
            ),
            // The host only: a URL's path or query may carry a key.
            Attribute::new(
                "server.address",
                url::Url::parse(&ask.remote.url)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string))
                    .unwrap_or_default(),
            ),
        ],
    );
    let obtained =
        crate::oauth::obtain_silently(ask.http, ask.remote, ask.stored, ask.challenge).await;
    match obtained {
        Err(e) => {
            let failed = grant_failed(e);
            span.end("error", Some(&failed.reason));
            Err(failed)
        }
        Ok(Silent::Interactive(why)) => {
            let (keep, why) = refused_silently(ask.stored, ask.challenge, why);
            keep_tokens(shared, (workspace, name), keep, "forget refused tokens").await;
            span.end("needs_auth", Some(&why));
            Err(needs_auth(&ask.remote.url, (workspace, name), &why))
        }
        Ok(Silent::Tokens(tokens)) => {
            span.end("ok", None);
            Ok(tokens)
        }
    }
}

/// A remote bundle that waits for `bundlevisor auth`, and why.
fn needs_auth(url: &str, (workspace, name): (&str, &str), why: &str) -> StartFailure {
    StartFailure {
        kind: FailKind::NeedsAuth,
        reason: format!(
            "the remote server {url} requires authorization ({why}); run `bundlevisor auth {name} -w {workspace}`"
        ),
    }
}

/// A silent grant that failed. A URL or metadata the rules refuse does not
/// get better by retrying: the operator has to change the bundle or the
/// server.
fn grant_failed(e: crate::oauth::OAuthError) -> StartFailure {
    StartFailure {
        kind: match e {
            crate::oauth::OAuthError::InsecureUrl { .. }
            | crate::oauth::OAuthError::Mismatch(_)
            | crate::oauth::OAuthError::Config(_) => FailKind::Config,
            _ => FailKind::Transient,
        },
        reason: format!("the remote server wants a new token, and getting one failed: {e}"),
    }
}

/// Only `bundlevisor auth` can help: the tokens to keep meanwhile, and why.
/// A scope the server wants is asked for by `bundlevisor auth`; tokens that
/// no longer work are forgotten (a registered client is kept), tokens that
/// only lack a scope work for what they cover and are kept.
fn refused_silently(stored: &TokenSet, challenge: Option<&str>, why: String) -> (TokenSet, String) {
    let wanted = crate::oauth::step_up(challenge).unwrap_or_default();
    let wanted_scopes = crate::oauth::union(stored.wanted_scopes.clone(), wanted.clone());
    if wanted.is_empty() {
        let keep = TokenSet {
            client_id: stored.client_id.clone(),
            client_secret: stored.client_secret.clone(),
            wanted_scopes,
            issuer: stored.issuer.clone(),
            challenge: stored.challenge.clone(),
            ..Default::default()
        };
        return (keep, why);
    }
    let keep = TokenSet {
        wanted_scopes,
        ..stored.clone()
    };
    let why = format!(
        "it needs the scope {:?}, which a silent grant did not get: {why}",
        wanted.join(" ")
    );
    (keep, why)
}

/// Stores `tokens` for the bundle; a failure to (`what`) is logged only.
/// Stores a new token set; a start that cannot is retried later.
async fn store_tokens(
    shared: &Shared,
    (workspace, name): (&str, &str),
    tokens: TokenSet,
) -> Result<(), StartFailure> {
    shared
        .credentials_of(workspace, name, move |c, w, n| {
            c.set_tokens(w, n, Some(&tokens))
        })
        .await
        .map_err(|e| StartFailure {
            kind: FailKind::Transient,
            reason: format!("cannot store the new token: {e}"),
        })
}

async fn keep_tokens(
    shared: &Shared,
    (workspace, name): (&str, &str),
    tokens: TokenSet,
    what: &str,
) {
    let stored = shared
        .credentials_of(workspace, name, move |c, w, n| {
            c.set_tokens(w, n, Some(&tokens))
        })
        .await;
    if let Err(e) = stored {
        tracing::warn!(workspace, bundle = name, "cannot {what}: {e}");
    }
}

/// Why a bundle is spoken to in MCP 2025-11-25 only, if it is: its manifest
/// declares `ai.nimblebrain/host-resources` (required or not), whose
/// requests from bundle to host have no path on 2026-07-28 (a stdio server
/// must not write requests there; docs/host-resources.md).
fn legacy_revision(manifest: &crate::manifest::Manifest) -> Option<String> {
    let declared = manifest.host.as_ref().is_some_and(|h| {
        h.capabilities
            .contains_key(crate::host_resources::EXTENSION)
    });
    declared.then(|| {
        format!(
            "kept on MCP 2025-11-25: its manifest declares {}, whose requests from bundle to host have no path on 2026-07-28",
            crate::host_resources::EXTENSION
        )
    })
}
