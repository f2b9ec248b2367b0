//! The sandbox of a stdio bundle (docs/security.md):
//!
//! - a private folder per (workspace, bundle): `STATE_DIR/sandboxes/WS/NAME`
//!   with `data/` (the bundle's `HOME` and `BUNDLEVISOR_DATA_DIR`) and
//!   `tmp/` (its `TMPDIR`);
//! - a uid that is not the daemon's: when the daemon runs as root, each
//!   bundle gets its own from `[sandbox] uid_range` (recorded as the owner of
//!   its `data/` folder), or the one `[sandbox] user`; a daemon that is not
//!   root runs bundles under its own uid only when the operator opted in
//!   (`allow_same_uid`) or Landlock denies them the control socket (ABI 9);
//! - `no_new_privs`, always, and resource limits;
//! - Landlock, where the kernel has it, from one [`Grants`] value: read and
//!   execute only system folders, the bundle's own folder, the interpreter
//!   its command runs and `[sandbox] read_only_paths`; write only its
//!   `data/` and `tmp/` (never device files); signals and abstract unix
//!   sockets scoped to the bundle. No grant may cover the daemon's own files.
//!
//! [`prepare`] is idempotent: the same bundle always gets the same folder and
//! uid. What was actually applied — every granted path and the ABI really
//! enforced — is reported in `status` ([`SandboxRecord`]), including
//! "Landlock unavailable": never a silent downgrade.

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use landlock::{
    make_bitflags, path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr,
    Scope, ABI,
};

use crate::config::{Enforcement, SandboxSettings, UidRange};
use crate::protocol::SandboxRecord;

/// The highest Landlock ABI whose rights this build uses (9: connecting to
/// pathname unix sockets); older kernels enforce what they have.
const WANTED_ABI: ABI = ABI::V9;
const WANTED_ABI_NUMBER: u32 = 9;
/// Signal and abstract-socket scoping arrived in ABI 6.
const SCOPE_ABI: u32 = 6;

/// `/etc` entries a bundle may read (the rest of `/etc`, `shadow` among it, stays closed).
const ETC_READABLE: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/alternatives",
    "/etc/os-release",
    "/etc/mime.types",
];

/// System folders a bundle may read and execute from.
const SYSTEM_READABLE: &[&str] = &[
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/opt",
    "/proc",
    "/sys",
    "/dev/urandom",
    "/dev/random",
];

/// Devices a bundle may write.
const DEVICES_WRITABLE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// How deep the bundle folder is searched for links that leave it.
const LINK_SEARCH_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot prepare the sandbox folder {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("[sandbox] user {0:?} does not exist on this machine")]
    NoSuchUser(String),
    #[error("[sandbox] user {0:?} is root; bundles never run as root: remove `user` (each bundle then gets a uid of its own from uid_range) or name an unprivileged user")]
    RootUser(String),
    #[error("Landlock is required by [sandbox] landlock = \"required\", but {0}")]
    LandlockRequired(String),
    #[error("every uid of [sandbox] uid_range {0} belongs to a bundle; widen the range, or purge uninstalled bundles (`bundlevisor uninstall --purge`)")]
    UidRangeExhausted(UidRange),
    #[error("this daemon runs as uid {uid}, not root, so it cannot give bundles uids of their own, and {landlock}; a bundle under the daemon's uid could drive the control socket. Run the daemon as root (bundles then get uids from [sandbox] uid_range), or accept the risk with [sandbox] allow_same_uid = true (docs/security.md)")]
    NoSeparation { uid: u32, landlock: String },
    #[error("{what} {path} would let the bundle read {protected}, which belongs to the daemon (state, key or control socket); {fix}")]
    CoversDaemonFiles {
        what: &'static str,
        path: PathBuf,
        protected: PathBuf,
        fix: &'static str,
    },
    #[error("cannot look at the bundle folder with the rights of its owner (uid {uid}); the bundle is not started")]
    NotAsUser { uid: u32 },
    #[error("the bundle cannot start: {0}")]
    Unreachable(#[from] super::reach::Unreachable),
    #[error("the bundle folder {folder} has links that point outside it and outside every read grant: {links}; a bundle reads only its own folder, system folders, its interpreter and [sandbox] read_only_paths. Copy the files into the bundle folder, or add their location to [sandbox] read_only_paths")]
    LinksOutside { folder: PathBuf, links: String },
}

/// Resource limits applied before exec (`None`: not limited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rlimits {
    pub open_files: Option<u64>,
    pub processes: Option<u64>,
    pub address_space: Option<u64>,
    pub cpu_seconds: Option<u64>,
}

/// Everything the spawn needs to sandbox one bundle process.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub record: SandboxRecord,
    pub data: PathBuf,
    pub tmp: PathBuf,
    /// (uid, gid) to run as; None: the daemon's own.
    pub user: Option<(u32, u32)>,
    pub limits: Rlimits,
    /// Landlock rules, when enforced.
    pub landlock: Option<Grants>,
    /// `[sandbox] pass_env`: daemon variables passed through the scrub.
    pub pass_env: Vec<String>,
    /// The bundle's cgroup, which its process joins before it runs.
    pub cgroup: Option<std::sync::Arc<super::cgroup::BundleCgroup>>,
    /// Without a cgroup, the bundle's own uid (no other process has it):
    /// every process of it is the bundle's, and is killed with it.
    pub tree_uid: Option<u32>,
}

/// What one bundle may touch: the one value the Landlock ruleset and
/// `status` are both built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// Read and execute, files and folders below.
    pub read: Vec<PathBuf>,
    /// Read, write, execute (no device files).
    pub write: Vec<PathBuf>,
}

/// The bundle being sandboxed.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub workspace: &'a str,
    pub bundle: &'a str,
    /// The bundle folder; None for a bare manifest file, whose containing
    /// folder is not the bundle's to read.
    pub folder: Option<&'a Path>,
    /// The resolved command and the folder it runs in.
    pub command: &'a str,
    pub cwd: &'a Path,
    /// The directories and files the operator configured for it
    /// (user_config values): granted read-write.
    pub configured: &'a [PathBuf],
    /// The environment the daemon built for it (a uv bundle's, in its
    /// sandbox folder): granted read-only.
    pub environment: Option<&'a Path>,
    /// The `PATH` its manifest sets (else it gets the daemon's).
    pub path: Option<&'a std::ffi::OsStr>,
}

impl Target<'_> {
    /// Checks that `who` can reach the bundle's folder, the folder it runs
    /// in and its command (with the command's interpreter); the program
    /// that will run.
    fn reachable(&self, who: &super::reach::Identity) -> Result<PathBuf, SandboxError> {
        use super::reach::{check, resolve, Need};
        if let Some(folder) = self.folder {
            check(who, folder, Need::Read)?;
        }
        check(who, self.cwd, Need::Read)?;
        let daemon = std::env::var_os("PATH");
        let path = self
            .path
            .or(daemon.as_deref())
            .unwrap_or(std::ffi::OsStr::new("/usr/local/bin:/usr/bin:/bin"));
        Ok(resolve(who, self.command, self.cwd, path)?)
    }
}

/// A bundle's private folder: its `HOME`, its `${HOME}` and
/// `BUNDLEVISOR_DATA_DIR`, kept across restarts.
pub fn data_dir(state_dir: &Path, workspace: &str, bundle: &str) -> PathBuf {
    state_dir
        .join("sandboxes")
        .join(workspace)
        .join(bundle)
        .join("data")
}

/// The kernel's Landlock ABI version, or why there is none.
pub fn landlock_abi() -> Result<i64, String> {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // SAFETY: a query syscall with no pointers to memory.
    let v = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<nix::libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v >= 1 {
        Ok(v)
    } else {
        let err = std::io::Error::last_os_error();
        Err(match err.raw_os_error() {
            Some(nix::libc::ENOSYS) => "this kernel has no Landlock support".into(),
            Some(nix::libc::EOPNOTSUPP) => {
                "Landlock is disabled on this kernel (boot option lsm=)".into()
            }
            _ => format!("Landlock cannot be queried: {err}"),
        })
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn private_dir(path: &Path, owner: Option<(u32, u32)>) -> Result<bool, SandboxError> {
    let existed = path.is_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io_error(path))?;
    if let Some((uid, gid)) = owner {
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(|e| io_error(path)(std::io::Error::from(e)))?;
    }
    Ok(!existed)
}

/// Serializes uid allocation: the owner of a bundle's `data/` folder is the
/// record of its uid, so finding a free one and taking it is one step. Holds
/// the uids in use under one sandboxes folder, read from the folders once
/// (a uid freed by deleting a sandbox is reused after a daemon restart).
static UID_ALLOCATION: std::sync::Mutex<Option<(PathBuf, BTreeSet<u32>)>> =
    std::sync::Mutex::new(None);

/// The bundle's own uid: the owner of its `data/` folder when that is in the
/// range already, else the lowest uid of the range no other sandbox owns
/// (taken by creating and chowning `data/` under the allocation lock).
fn own_uid(sandboxes: &Path, data: &Path, range: UidRange) -> Result<u32, SandboxError> {
    let owner = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .filter(|m| m.is_dir())
            .map(|m| m.uid())
            .filter(|uid| range.contains(*uid))
    };
    if let Some(uid) = owner(data) {
        return Ok(uid);
    }
    let mut allocation = UID_ALLOCATION.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(uid) = owner(data) {
        return Ok(uid);
    }
    if allocation
        .as_ref()
        .is_none_or(|(root, _)| root != sandboxes)
    {
        let mut used = BTreeSet::new();
        for ws in std::fs::read_dir(sandboxes).into_iter().flatten().flatten() {
            for b in std::fs::read_dir(ws.path()).into_iter().flatten().flatten() {
                used.extend(owner(&b.path().join("data")));
            }
        }
        *allocation = Some((sandboxes.to_path_buf(), used));
    }
    let Some((_, used)) = allocation.as_mut() else {
        unreachable!("filled above");
    };
    let uid = (range.first..=range.last)
        .find(|uid| !used.contains(uid))
        .ok_or(SandboxError::UidRangeExhausted(range))?;
    used.insert(uid);
    let existed = data.is_dir();
    private_dir(data, Some((uid, uid)))?;
    if existed {
        // A folder an older version (or another uid) filled: the bundle
        // must own what is in it.
        give_tree(data, (uid, uid))?;
    }
    Ok(uid)
}

/// Makes `uid` (and gid) the owner of everything below `dir`, links
/// themselves rather than what they point at.
fn give_tree(dir: &Path, (uid, gid): (u32, u32)) -> Result<(), SandboxError> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(io_error(&d))?.flatten() {
            let path = entry.path();
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).map_err(io_error(&path))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// Runs `look` with the file-system rights of `uid` — its fsuid, its
/// primary gid as fsgid, no supplementary groups, and so (the kernel drops
/// them with a non-zero fsuid) none of root's file capabilities — on a
/// thread of its own, whose credentials die with it. For the daemon's own
/// uid it runs `look` here. What a user's path or link leads to is then
/// found as that user would find it: a root-only path looks to the daemon
/// exactly as it looks to the user (unreachable), never "exists".
///
/// `None` when the rights could not be taken (the caller fails closed).
pub fn as_user<T: Send>(uid: u32, look: impl FnOnce() -> T + Send) -> Option<T> {
    if uid == nix::unistd::geteuid().as_raw() {
        return Some(look());
    }
    let gid = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(NO_GROUP, |u| u.gid.as_raw());
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                use nix::unistd::{setfsgid, setfsuid, Gid, Uid};
                // Per thread: glibc's setfsuid/setfsgid are the bare system
                // calls, and setgroups is called bare too (glibc's wrapper
                // would change every thread of the daemon).
                setfsgid(Gid::from_raw(gid));
                // SAFETY: setgroups(0, NULL) reads no memory.
                let no_groups = unsafe {
                    nix::libc::syscall(
                        nix::libc::SYS_setgroups,
                        0,
                        std::ptr::null::<nix::libc::gid_t>(),
                    )
                };
                setfsuid(Uid::from_raw(uid));
                // Each call returns the previous value: ask again to check.
                let taken = setfsuid(Uid::from_raw(uid)).as_raw() == uid
                    && setfsgid(Gid::from_raw(gid)).as_raw() == gid
                    && no_groups == 0;
                taken.then(look)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The fsgid of a uid without a passwd entry (`nogroup`).
const NO_GROUP: u32 = 65534;

/// The owner of the bundle folder when it is not the daemon's uid or root
/// (an admitted user installed it): its links are followed with that
/// user's rights.
pub(crate) fn folder_owner(folder: &Path) -> Option<u32> {
    let owner = std::fs::metadata(folder).ok()?.uid();
    (owner != 0 && owner != nix::unistd::geteuid().as_raw()).then_some(owner)
}

/// The installation an executable belongs to: `PREFIX` of `PREFIX/bin/x`
/// (its folder's parent), resolved through links.
fn install_prefix(command: &str, cwd: &Path) -> Option<PathBuf> {
    let path = Path::new(command);
    let found = if path.is_absolute() {
        path.to_path_buf()
    } else if command.contains('/') {
        cwd.join(path)
    } else {
        std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(command))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
            .into_iter()
            .find(|p| p.is_file())?
    };
    let real = found.canonicalize().ok()?;
    let bin = real.parent()?;
    Some(bin.parent().unwrap_or(bin).to_path_buf())
}

fn canonical(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// The protected path a grant would expose: one it contains, or the
/// protected folder it lies in. An unpacked archive's own folder
/// (`STATE_DIR/archives/SHA256/…`) lies in the state dir but exposes
/// nothing of it: it holds that bundle's files only.
fn covered<'p>(grant: &Path, protected: &'p [PathBuf]) -> Option<&'p PathBuf> {
    let grant = canonical(grant);
    protected.iter().find(|p| {
        let p = canonical(p);
        let unpacked = crate::archive::unpacked_sha(&grant, &crate::archive::root(&p)).is_some();
        p.starts_with(&grant) || (p.is_dir() && grant.starts_with(&p) && !unpacked)
    })
}

/// Links below `folder` (not following linked folders) whose canonical
/// target is outside both the folder and `allowed`, as `link -> target`.
fn links_outside(folder: &Path, allowed: &[PathBuf]) -> Vec<String> {
    let root = canonical(folder);
    let mut outside = Vec::new();
    let mut stack = vec![(folder.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_symlink() {
                // A dangling link reaches nothing, so it needs no grant.
                let Ok(target) = path.canonicalize() else {
                    continue;
                };
                if !target.starts_with(&root) && !allowed.iter().any(|a| target.starts_with(a)) {
                    outside.push(format!("{} -> {}", path.display(), target.display()));
                }
            } else if kind.is_dir() && depth < LINK_SEARCH_DEPTH {
                stack.push((path, depth + 1));
            }
        }
    }
    outside.sort();
    outside
}

/// What `target` may touch, checked: no grant covers a `protected` path,
/// and the bundle folder links nowhere else.
pub fn grants(
    settings: &SandboxSettings,
    protected: &[PathBuf],
    target: &Target<'_>,
    data: &Path,
    tmp: &Path,
) -> Result<Grants, SandboxError> {
    let system: Vec<PathBuf> = SYSTEM_READABLE
        .iter()
        .chain(ETC_READABLE)
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    let check = |what, path: &Path, fix| match covered(path, protected) {
        Some(p) => Err(SandboxError::CoversDaemonFiles {
            what,
            path: path.to_path_buf(),
            protected: p.clone(),
            fix,
        }),
        None => Ok(()),
    };
    let own = settings.for_bundle(target.workspace, target.bundle);
    let mut extra = Vec::new();
    for p in settings
        .read_only_paths
        .iter()
        .chain(own.into_iter().flat_map(|o| &o.read_only_paths))
    {
        check(
            "[sandbox] read_only_paths entry",
            p,
            "remove it, or name a folder that holds only what bundles need",
        )?;
        extra.push(canonical(p));
    }
    // A bundle folder of another user (an admitted user's install): the
    // command and the folder's links are resolved with that user's rights,
    // so what root alone can see changes nothing in the answer.
    let owner = target.folder.and_then(folder_owner);
    let prefix = match owner {
        None => install_prefix(target.command, target.cwd),
        Some(uid) => as_user(uid, || install_prefix(target.command, target.cwd)).flatten(),
    };
    if let Some(prefix) = prefix {
        check(
            "the installation of the bundle's command",
            &prefix,
            "install the program it runs elsewhere, or into the bundle folder",
        )?;
        extra.push(prefix);
    }
    // Made by the daemon for this bundle alone (its own sandbox folder).
    extra.extend(target.environment.map(canonical));
    let mut read = system.clone();
    if let Some(folder) = target.folder {
        check(
            "the bundle folder",
            folder,
            "install the bundle from a folder of its own, away from the daemon's files",
        )?;
        let allowed: Vec<PathBuf> = system.iter().chain(&extra).cloned().collect();
        let outside = match owner {
            None => links_outside(folder, &allowed),
            Some(uid) => as_user(uid, || links_outside(folder, &allowed))
                .ok_or(SandboxError::NotAsUser { uid })?,
        };
        if !outside.is_empty() {
            return Err(SandboxError::LinksOutside {
                folder: folder.to_path_buf(),
                links: outside.join(", "),
            });
        }
        read.push(canonical(folder));
    }
    read.extend(extra);
    read.sort();
    read.dedup();
    let mut write: Vec<PathBuf> = DEVICES_WRITABLE
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    write.push(data.to_path_buf());
    write.push(tmp.to_path_buf());
    let configured_read_only = own.is_some_and(|o| o.configured_read_only);
    let mut configured_read = Vec::new();
    for p in target.configured {
        check(
            "the configured path",
            p,
            "configure a folder or file of its own, away from the daemon's files",
        )?;
        if configured_read_only {
            configured_read.push(canonical(p));
        } else {
            write.push(canonical(p));
        }
    }
    for p in settings
        .read_write_paths
        .iter()
        .chain(own.into_iter().flat_map(|o| &o.read_write_paths))
    {
        check(
            "[sandbox] read_write_paths entry",
            p,
            "remove it, or name a folder of its own",
        )?;
        write.push(canonical(p));
    }
    write.sort();
    write.dedup();
    read.extend(configured_read);
    read.sort();
    read.dedup();
    Ok(Grants { read, write })
}

/// The install-time check of a bundle's grants (its folder's links, and
/// that no grant covers the daemon's files), so that a bundle that could
/// never start is refused before it is recorded. Skipped when Landlock is
/// off, and when the command depends on user_config values not set yet
/// (every start checks again, with the values).
pub fn check_install(
    settings: &SandboxSettings,
    protected: &[PathBuf],
    loaded: &crate::manifest::LoadedManifest,
    workspace: &str,
) -> Result<(), SandboxError> {
    let no_values = std::collections::BTreeMap::new();
    let Ok(crate::manifest::Plan::Stdio(launch)) = loaded.manifest.plan(&loaded.dir, &no_values)
    else {
        return Ok(());
    };
    let path = launch.env.get("PATH").map(std::ffi::OsStr::new);
    let target = Target {
        workspace: "",
        bundle: &loaded.manifest.name,
        folder: (!loaded.is_bare()).then_some(loaded.dir.as_path()),
        command: &launch.command,
        cwd: &launch.cwd,
        configured: &[],
        environment: None,
        path,
    };
    // A uv bundle's command is its environment's Python, built at start
    // (which checks it).
    // What is not there yet (a watched folder still arriving, a runtime
    // checked elsewhere) is for those checks and the start to say.
    let named = (workspace, loaded.manifest.name.as_str());
    if let Some(who) = prospective(settings, named)?.filter(|_| !loaded.manifest.is_uv()) {
        match target.reachable(&who) {
            Err(SandboxError::Unreachable(u)) if matches!(u.lacks, "exist" | "find") => {}
            other => {
                other?;
            }
        }
    }
    if settings.landlock == Enforcement::Off {
        return Ok(());
    }
    let nowhere = Path::new("/nonexistent");
    grants(settings, protected, &target, nowhere, nowhere).map(|_| ())
}

/// Who a bundle about to be installed will run as, for the checks before
/// it has a uid: `[sandbox] user`, or (a root daemon) a uid of the range,
/// which owns nothing; None when it runs as the daemon.
fn prospective(
    settings: &SandboxSettings,
    (workspace, bundle): (&str, &str),
) -> Result<Option<super::reach::Identity>, SandboxError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    if let Some((name, _)) = settings.user_for(workspace, bundle) {
        let u = nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .ok_or_else(|| SandboxError::NoSuchUser(name.clone()))?;
        let mut who = super::reach::Identity::bundle(u.uid.as_raw(), u.gid.as_raw());
        who.name = format!("the bundle's user {name} (uid {})", u.uid);
        return Ok(Some(who));
    }
    let uid = settings.uid_range.first;
    let mut who = super::reach::Identity::bundle(uid, uid);
    who.name = format!(
        "a bundle's own uid (from [sandbox] uid_range {})",
        settings.uid_range
    );
    Ok(Some(who))
}

/// The uid a bundle runs under, and what that means for its isolation.
fn identity(
    settings: &SandboxSettings,
    (workspace, bundle): (&str, &str),
    sandboxes: &Path,
    data: &Path,
    landlock: &Result<i64, String>,
) -> Result<(Option<(u32, u32)>, String), SandboxError> {
    let me = nix::unistd::geteuid();
    if me.is_root() {
        if let Some((name, own)) = settings.user_for(workspace, bundle) {
            let u = nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| SandboxError::NoSuchUser(name.clone()))?;
            if u.uid.is_root() {
                return Err(SandboxError::RootUser(name.clone()));
            }
            let (uid, gid) = (u.uid.as_raw(), u.gid.as_raw());
            let owner = std::fs::metadata(data).ok().map(|m| (m.uid(), m.gid()));
            if owner.is_some_and(|o| o != (uid, gid)) {
                // It ran as another user before: what it kept is this
                // one's, given while the folder is not yet this user's (so
                // no process of it can swap a folder for a link meanwhile).
                give_tree(data, (uid, gid))?;
            }
            private_dir(data, Some((uid, gid)))?;
            let whose = if own {
                "its own, [[sandbox.bundle]] user"
            } else {
                "shared by every bundle; [sandbox] user"
            };
            return Ok((
                Some((uid, gid)),
                format!("user {name} (uid {uid}, {whose})"),
            ));
        }
        let uid = own_uid(sandboxes, data, settings.uid_range)?;
        private_dir(data, Some((uid, uid)))?;
        return Ok((
            Some((uid, uid)),
            format!(
                "own uid {uid} (from [sandbox] uid_range {})",
                settings.uid_range
            ),
        ));
    }
    let landlock_on = settings.landlock != Enforcement::Off;
    let abi = landlock.as_ref().ok().copied().unwrap_or(0);
    private_dir(data, None)?;
    if landlock_on && abi >= WANTED_ABI_NUMBER as i64 {
        return Ok((
            None,
            format!("same uid as the daemon ({}); Landlock ABI {abi} denies connecting to the control socket", me.as_raw()),
        ));
    }
    if settings.allow_same_uid {
        return Ok((
            None,
            format!(
                "same uid as the daemon ({}; [sandbox] allow_same_uid): only the control socket's process-ancestry check keeps the bundle off it",
                me.as_raw()
            ),
        ));
    }
    Err(SandboxError::NoSeparation {
        uid: me.as_raw(),
        landlock: match (landlock_on, landlock) {
            (false, _) => "Landlock is off ([sandbox] landlock = \"off\")".to_string(),
            (true, Ok(abi)) => format!(
                "this kernel's Landlock (ABI {abi}) cannot deny unix-socket connections (ABI {WANTED_ABI_NUMBER} can)"
            ),
            (true, Err(why)) => why.clone(),
        },
    })
}

/// Creates (or finds) the bundle's sandbox folder and uid and decides what
/// applies.
pub fn prepare(
    settings: &SandboxSettings,
    state_dir: &Path,
    protected: &[PathBuf],
    target: &Target<'_>,
) -> Result<Sandbox, SandboxError> {
    let (workspace, bundle) = (target.workspace, target.bundle);
    let sandboxes = state_dir.join("sandboxes");
    let path = sandboxes.join(workspace).join(bundle);
    debug_assert_eq!(path.join("data"), data_dir(state_dir, workspace, bundle));
    // The parents stay the daemon's (0700, made traversable below when the
    // bundle has a uid of its own); only `data/` and `tmp/` are the bundle's.
    let created = private_dir(&path, None)?;
    let data = path.join("data");
    let tmp = path.join("tmp");
    let kernel = landlock_abi();
    let (user, isolation) = identity(settings, (workspace, bundle), &sandboxes, &data, &kernel)?;
    let tmp_owner = std::fs::metadata(&tmp).ok().map(|m| m.uid());
    private_dir(&tmp, user)?;
    if let (Some((uid, gid)), Some(was)) = (user, tmp_owner) {
        if was != uid {
            give_tree(&tmp, (uid, gid))?;
        }
    }
    if user.is_some() {
        // The bundle's user must traverse (not list) down to its folders;
        // everything else in the state dir is 0700/0600.
        use std::os::unix::fs::PermissionsExt;
        for p in [state_dir, &sandboxes, &sandboxes.join(workspace), &path] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711))
                .map_err(io_error(p))?;
        }
    }
    let uid = user
        .map(|(u, _)| u)
        .unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    // A bundle under a uid of its own must reach what it runs; the grants
    // are those of the program it will run (not what the daemon's own PATH
    // would find).
    let program = match user {
        Some((uid, gid)) => Some(target.reachable(&super::reach::Identity::bundle(uid, gid))?),
        None => None,
    };
    let command = program.as_ref().map(|p| p.to_string_lossy().into_owned());
    let target = &Target {
        command: command.as_deref().unwrap_or(target.command),
        ..*target
    };

    let mut parts = vec!["private data dir".to_string(), "no_new_privs".to_string()];
    let limits = Rlimits {
        open_files: Some(settings.max_open_files).filter(|n| *n > 0),
        processes: Some(settings.max_processes).filter(|n| *n > 0),
        address_space: Some(settings.max_address_space).filter(|n| *n > 0),
        cpu_seconds: Some(settings.max_cpu_seconds).filter(|n| *n > 0),
    };
    parts.push("rlimits".into());
    if user.is_some() {
        parts.push(format!("uid {uid}"));
    }
    let (landlock, landlock_state, abi) = match settings.landlock {
        Enforcement::Off => (None, "off ([sandbox] landlock = \"off\")".to_string(), None),
        mode => match kernel {
            Ok(kernel) => {
                let grants = grants(settings, protected, target, &data, &tmp)?;
                let abi = (kernel as u32).min(WANTED_ABI_NUMBER);
                let mut enforced = vec!["filesystem"];
                if abi >= SCOPE_ABI {
                    enforced.push("signals and abstract unix sockets scoped to the bundle");
                }
                if abi >= WANTED_ABI_NUMBER {
                    enforced.push("no unix-socket connections outside its folders");
                }
                parts.push(format!("landlock ABI {abi}"));
                (
                    Some(grants),
                    format!("enforced (ABI {abi}): {}", enforced.join("; ")),
                    Some(abi),
                )
            }
            Err(why) if mode == Enforcement::Required => {
                return Err(SandboxError::LandlockRequired(why))
            }
            Err(why) => (None, format!("unavailable: {why}"), None),
        },
    };
    let shown = |paths: &[PathBuf]| -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    };
    let (read, write) = match &landlock {
        Some(g) => (shown(&g.read), shown(&g.write)),
        None => (Vec::new(), Vec::new()),
    };
    let mut execute = read.clone();
    execute.extend(write.iter().cloned());
    execute.sort();
    execute.dedup();
    Ok(Sandbox {
        record: SandboxRecord {
            sandbox_id: format!("{workspace}/{bundle}"),
            sandbox_path: path.display().to_string(),
            strategy: parts.join(" + "),
            landlock: landlock_state,
            created,
            uid,
            isolation,
            landlock_abi: abi,
            read,
            write,
            execute,
            containment: String::new(),
            cgroup: None,
            limits: Vec::new(),
        },
        data,
        tmp,
        user,
        limits,
        landlock,
        pass_env: settings.pass_env_for(workspace, bundle),
        cgroup: None,
        tree_uid: None,
    })
}

impl Sandbox {
    /// Puts the bundle in its cgroup (made empty, with its limits), or says
    /// why it runs in a process group only.
    pub fn contain(
        &mut self,
        cgroups: &super::cgroup::Cgroups,
        settings: &SandboxSettings,
        workspace: &str,
        bundle: &str,
    ) -> Result<(), super::cgroup::CgroupError> {
        let limits = settings.cgroup_limits(workspace, bundle);
        let cgroup = cgroups.create(workspace, bundle, limits)?;
        self.record.containment = cgroups.containment.clone();
        if let Some(cg) = &cgroup {
            self.record.cgroup = cg.path().map(|p| p.display().to_string());
            self.record.limits = cg.limits.clone();
            self.record.strategy.push_str(" + cgroup");
        } else {
            let asked = [
                limits.memory_max.map(|_| "memory_max"),
                limits.pids_max.map(|_| "pids_max"),
                limits.cpu_max.map(|_| "cpu_max"),
            ];
            // A bundle under a uid of its own is the only user of that uid,
            // so the kernel's per-user process count is its own: pids_max
            // holds as RLIMIT_NPROC (unless max_processes says otherwise).
            let own_uid = self.user.is_some() && settings.user_for(workspace, bundle).is_none();
            if let (true, Some((uid, _))) = (own_uid, self.user) {
                self.tree_uid = Some(uid);
                self.record.containment = format!(
                    "process group and own uid {uid}: every process of that uid is killed with the bundle, setsid or not ({})",
                    cgroups.containment
                );
            }
            let by_uid = match (limits.pids_max, self.limits.processes) {
                (Some(n), None) if own_uid => {
                    // Never above the daemon's own hard limit, which the
                    // bundle could not raise to.
                    let hard =
                        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC)
                            .map_or(n, |(_, hard)| hard);
                    let n = n.min(hard);
                    self.limits.processes = Some(n);
                    Some(n)
                }
                _ => None,
            };
            self.record.limits = asked
                .into_iter()
                .flatten()
                .map(|l| match by_uid {
                    Some(n) if l == "pids_max" => {
                        format!("pids_max: {n} as RLIMIT_NPROC of the bundle's own uid (no cgroup)")
                    }
                    _ => format!("{l}: not in force (no cgroup)"),
                })
                .collect();
        }
        self.cgroup = cgroup.map(std::sync::Arc::new);
        Ok(())
    }
}

impl Grants {
    /// The Landlock ruleset as a file descriptor, to be applied in the child
    /// (`landlock_restrict_self`) right before exec. Best effort below
    /// [`WANTED_ABI`]: an older kernel enforces the rights it knows.
    pub fn ruleset_fd(&self) -> Result<Option<OwnedFd>, String> {
        let devices = make_bitflags!(AccessFs::{MakeChar | MakeBlock});
        let created = Ruleset::default()
            .handle_access(AccessFs::from_all(WANTED_ABI))
            .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
            .and_then(|r| r.create())
            .and_then(|r| {
                r.add_rules(path_beneath_rules(
                    &self.read,
                    AccessFs::from_read(WANTED_ABI),
                ))
            })
            .and_then(|r| {
                r.add_rules(path_beneath_rules(
                    &self.write,
                    AccessFs::from_all(WANTED_ABI) & !devices,
                ))
            })
            .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
        Ok(created.into())
    }
}

/// In the forked child, before exec: `no_new_privs`, the limits, then
/// Landlock. Only async-signal-safe system calls.
pub fn apply_in_child(limits: &Rlimits, ruleset: Option<&OwnedFd>) -> std::io::Result<()> {
    use nix::sys::resource::{setrlimit, Resource};
    let set = |resource, value: Option<u64>| -> std::io::Result<()> {
        if let Some(v) = value {
            setrlimit(resource, v, v).map_err(std::io::Error::from)?;
        }
        Ok(())
    };
    set(Resource::RLIMIT_NOFILE, limits.open_files)?;
    set(Resource::RLIMIT_NPROC, limits.processes)?;
    set(Resource::RLIMIT_AS, limits.address_space)?;
    set(Resource::RLIMIT_CPU, limits.cpu_seconds)?;
    nix::sys::prctl::set_no_new_privs().map_err(std::io::Error::from)?;
    if let Some(fd) = ruleset {
        // SAFETY: landlock_restrict_self(fd, 0) takes no pointers.
        let r = unsafe {
            nix::libc::syscall(nix::libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32)
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target<'a>(folder: Option<&'a Path>, command: &'a str) -> Target<'a> {
        Target {
            workspace: "ws",
            bundle: "b",
            folder,
            command,
            cwd: Path::new("/"),
            configured: &[],
            environment: None,
            path: None,
        }
    }

    fn settings() -> SandboxSettings {
        // A test run that is not root still gets a sandbox.
        SandboxSettings {
            allow_same_uid: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_sandbox_folder_and_uid_are_created_once_and_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        std::fs::create_dir_all(&bundle).unwrap();
        let state = dir.path().join("state");
        let t = target(Some(&bundle), "/bin/sh");
        let a = prepare(&settings(), &state, std::slice::from_ref(&state), &t).unwrap();
        assert!(a.record.created);
        assert_eq!(a.record.sandbox_id, "ws/b");
        assert!(a.data.is_dir() && a.tmp.is_dir());
        let b = prepare(&settings(), &state, std::slice::from_ref(&state), &t).unwrap();
        assert!(!b.record.created);
        assert_eq!(a.record.sandbox_path, b.record.sandbox_path);
        assert_eq!(a.record.uid, b.record.uid);
        assert!(a.record.strategy.contains("no_new_privs"));
        if nix::unistd::geteuid().is_root() {
            assert!(SandboxSettings::default().uid_range.contains(a.record.uid));
            // A second bundle gets another uid.
            let other = Target { bundle: "c", ..t };
            let c = prepare(&settings(), &state, std::slice::from_ref(&state), &other).unwrap();
            assert_ne!(c.record.uid, a.record.uid);
            assert!(
                a.record.isolation.starts_with("own uid"),
                "{}",
                a.record.isolation
            );
        }
        match landlock_abi() {
            Ok(_) => {
                let rules = a.landlock.unwrap();
                assert!(rules.read.contains(&bundle.canonicalize().unwrap()));
                assert!(rules.write.contains(&a.data));
                assert!(!rules
                    .read
                    .iter()
                    .any(|p| p == Path::new("/etc") || p == dir.path()));
                assert!(a.record.landlock.starts_with("enforced"));
                assert_eq!(a.record.read.len(), rules.read.len());
                assert!(a.record.landlock_abi.is_some());
            }
            Err(_) => assert!(a.record.landlock.starts_with("unavailable")),
        }
    }

    #[test]
    fn a_data_folder_left_by_an_older_version_is_handed_to_the_bundles_uid() {
        if !nix::unistd::geteuid().is_root() {
            return; // chown needs root
        }
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let data = state.join("sandboxes/ws/old/data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("sub/notes.json"), "{}").unwrap();
        let bundle = dir.path().join("old");
        std::fs::create_dir_all(&bundle).unwrap();
        let t = Target {
            bundle: "old",
            ..target(Some(&bundle), "/bin/sh")
        };
        let sb = prepare(&settings(), &state, &[], &t).unwrap();
        let uid = sb.record.uid;
        assert!(settings().uid_range.contains(uid));
        for p in [data.clone(), data.join("sub"), data.join("sub/notes.json")] {
            assert_eq!(std::fs::metadata(&p).unwrap().uid(), uid, "{}", p.display());
        }
    }

    #[test]
    fn links_out_of_the_bundle_folder_grant_nothing_and_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        std::fs::create_dir_all(bundle.join("deep/er")).unwrap();
        let secret = dir.path().join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        // Links inside the folder and into system folders are fine.
        std::os::unix::fs::symlink(bundle.join("deep"), bundle.join("inside")).unwrap();
        std::os::unix::fs::symlink("/usr/bin", bundle.join("system")).unwrap();
        let (data, tmp) = (dir.path().join("d"), dir.path().join("t"));
        let t = target(Some(&bundle), "/bin/sh");
        let g = grants(&settings(), &[], &t, &data, &tmp).unwrap();
        assert!(!g.read.iter().any(|p| p.starts_with(&secret)));
        // One deep down pointing at `/` is refused, with the link named.
        std::os::unix::fs::symlink("/", bundle.join("deep/er/escape")).unwrap();
        let err = grants(&settings(), &[], &t, &data, &tmp).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, SandboxError::LinksOutside { .. }), "{text}");
        assert!(text.contains("escape -> /"), "{text}");
        // ... and so is one at a neighbour's secret, unless the operator grants it.
        std::fs::remove_file(bundle.join("deep/er/escape")).unwrap();
        std::os::unix::fs::symlink(&secret, bundle.join("s")).unwrap();
        assert!(grants(&settings(), &[], &t, &data, &tmp).is_err());
        let mut granted = settings();
        granted.read_only_paths = vec![secret.clone()];
        let g = grants(&granted, &[], &t, &data, &tmp).unwrap();
        assert!(g.read.contains(&secret.canonicalize().unwrap()));
    }

    #[test]
    fn a_bare_manifest_grants_no_folder_and_no_grant_covers_the_daemon_files() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let (data, tmp) = (state.join("d"), state.join("t"));
        let bare = target(None, "/bin/sh");
        let g = grants(
            &settings(),
            std::slice::from_ref(&state),
            &bare,
            &data,
            &tmp,
        )
        .unwrap();
        assert!(!g.read.iter().any(|p| p.starts_with(dir.path())), "{g:?}");
        // A bundle folder holding the state dir is refused.
        let t = target(Some(dir.path()), "/bin/sh");
        let err = grants(&settings(), std::slice::from_ref(&state), &t, &data, &tmp).unwrap_err();
        assert!(
            matches!(err, SandboxError::CoversDaemonFiles { .. }),
            "{err}"
        );
        // So is a command whose installation holds it (PREFIX of PREFIX/bin/x).
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::copy("/bin/sh", bin.join("x")).unwrap();
        let cmd = bin.join("x");
        let t = target(None, cmd.to_str().unwrap());
        let err = grants(&settings(), std::slice::from_ref(&state), &t, &data, &tmp).unwrap_err();
        assert!(err.to_string().contains("installation"), "{err}");
        // And a read_only_paths entry inside the state dir.
        let mut inside = settings();
        inside.read_only_paths = vec![state.join("sandboxes")];
        assert!(grants(&inside, std::slice::from_ref(&state), &bare, &data, &tmp).is_err());
    }

    #[test]
    fn the_interpreter_prefix_is_found_through_links() {
        let prefix = install_prefix("/bin/sh", Path::new("/")).unwrap();
        assert!(prefix.is_dir());
        assert!(install_prefix("no-such-binary-here", Path::new("/")).is_none());
    }
}
