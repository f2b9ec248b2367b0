//! The sandbox of a stdio bundle (docs/security.md):
//!
//! - a private folder per (workspace, bundle): `STATE_DIR/sandboxes/WS/NAME`
//!   with `data/` (the bundle's `HOME` and `BUNDLEVISOR_DATA_DIR`) and
//!   `tmp/` (its `TMPDIR`);
//! - `no_new_privs`, always;
//! - resource limits (open files, processes, address space, CPU time);
//! - when the daemon runs as root and `[sandbox] user` is set, the bundle
//!   runs as that user;
//! - Landlock, where the kernel has it: read (and execute) only system
//!   folders, the bundle's folder and what it links to, the interpreter it
//!   runs, and `[sandbox] read_only_paths`; write only its `data/` and
//!   `tmp/`. No access to the state dir, other bundles or other workspaces.
//!
//! [`prepare`] is idempotent: the same bundle always gets the same folder.
//! What was actually applied is reported in `status` ([`SandboxRecord`]),
//! including "Landlock unavailable" — never a silent downgrade.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, ABI,
};

use crate::config::{LandlockMode, SandboxSettings};
use crate::protocol::SandboxRecord;

/// The Landlock ABI this build asks for (best effort below it).
const WANTED_ABI: ABI = ABI::V5;

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

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot prepare the sandbox folder {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("[sandbox] user {0:?} does not exist on this machine")]
    NoSuchUser(String),
    #[error("Landlock is required by [sandbox] landlock = \"required\", but {0}")]
    LandlockRequired(String),
}

/// Resource limits applied before exec (`None`: not limited).
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
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
    /// (uid, gid) to run as.
    pub user: Option<(u32, u32)>,
    pub limits: Limits,
    /// Landlock rules, when enforced.
    pub landlock: Option<Rules>,
}

#[derive(Debug, Clone)]
pub struct Rules {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
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

fn private_dir(path: &Path, owner: Option<(u32, u32)>) -> Result<bool, SandboxError> {
    let io = |source| SandboxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let existed = path.is_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io)?;
    if let Some((uid, gid)) = owner {
        nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .map_err(|e| io(std::io::Error::from(e)))?;
    }
    Ok(!existed)
}

/// Canonical targets of the symlinks in `dir` (a few levels down, not
/// following linked folders): what the bundle's own files point at.
fn link_targets(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_symlink() {
            if let Ok(target) = path.canonicalize() {
                out.push(target);
            }
        } else if kind.is_dir() && depth > 0 {
            link_targets(&path, depth - 1, out);
        }
    }
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

/// Creates (or finds) the bundle's sandbox folder and decides what applies.
pub fn prepare(
    settings: &SandboxSettings,
    state_dir: &Path,
    workspace: &str,
    bundle: &str,
    bundle_dir: &Path,
    command: &str,
) -> Result<Sandbox, SandboxError> {
    let root_daemon = nix::unistd::geteuid().is_root();
    let user = match (&settings.user, root_daemon) {
        (Some(name), true) => {
            let u = nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .ok_or_else(|| SandboxError::NoSuchUser(name.clone()))?;
            Some((u.uid.as_raw(), u.gid.as_raw(), name.clone()))
        }
        _ => None,
    };
    let owner = user.as_ref().map(|(u, g, _)| (*u, *g));
    let path = state_dir.join("sandboxes").join(workspace).join(bundle);
    // The parents stay the daemon's (0700); only the bundle's own folders
    // belong to the bundle's user, who reaches them by full path (the
    // parents are made traversable below when a user is set).
    let created = private_dir(&path, None)?;
    let data = path.join("data");
    let tmp = path.join("tmp");
    private_dir(&data, owner)?;
    private_dir(&tmp, owner)?;
    if owner.is_some() {
        // The bundle's user must traverse (not list) down to its folders;
        // everything else in the state dir is 0700/0600.
        use std::os::unix::fs::PermissionsExt;
        let sandboxes = state_dir.join("sandboxes");
        for p in [state_dir, &sandboxes, &sandboxes.join(workspace), &path] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711)).map_err(
                |source| SandboxError::Io {
                    path: p.to_path_buf(),
                    source,
                },
            )?;
        }
    }

    let mut parts = vec!["private data dir".to_string(), "no_new_privs".to_string()];
    let limits = Limits {
        open_files: Some(settings.max_open_files).filter(|n| *n > 0),
        processes: Some(settings.max_processes).filter(|n| *n > 0),
        address_space: Some(settings.max_address_space).filter(|n| *n > 0),
        cpu_seconds: Some(settings.max_cpu_seconds).filter(|n| *n > 0),
    };
    parts.push("rlimits".into());
    if let Some((_, _, name)) = &user {
        parts.push(format!("user {name}"));
    }
    let (landlock, landlock_state) = match settings.landlock {
        LandlockMode::Off => (None, "off ([sandbox] landlock = \"off\")".to_string()),
        mode => match landlock_abi() {
            Ok(abi) => {
                let mut read: Vec<PathBuf> = SYSTEM_READABLE
                    .iter()
                    .chain(ETC_READABLE)
                    .map(PathBuf::from)
                    .collect();
                read.push(bundle_dir.to_path_buf());
                // Links that stay inside the bundle folder need no rule of their own.
                let mut targets = Vec::new();
                link_targets(bundle_dir, 3, &mut targets);
                let canonical_dir = bundle_dir
                    .canonicalize()
                    .unwrap_or(bundle_dir.to_path_buf());
                targets.retain(|t| !t.starts_with(&canonical_dir));
                read.extend(targets);
                read.extend(install_prefix(command, bundle_dir));
                read.extend(settings.read_only_paths.iter().cloned());
                read.sort();
                read.dedup();
                let mut write: Vec<PathBuf> = DEVICES_WRITABLE.iter().map(PathBuf::from).collect();
                write.push(data.clone());
                write.push(tmp.clone());
                parts.push(format!("landlock ABI {abi}"));
                (Some(Rules { read, write }), format!("enforced (ABI {abi})"))
            }
            Err(why) if mode == LandlockMode::Required => {
                return Err(SandboxError::LandlockRequired(why))
            }
            Err(why) => (None, format!("unavailable: {why}")),
        },
    };
    Ok(Sandbox {
        record: SandboxRecord {
            sandbox_id: format!("{workspace}/{bundle}"),
            sandbox_path: path.display().to_string(),
            strategy: parts.join(" + "),
            landlock: landlock_state,
            created,
        },
        data,
        tmp,
        user: owner,
        limits,
        landlock,
    })
}

impl Rules {
    /// The Landlock ruleset as a file descriptor, to be applied in the child
    /// (`landlock_restrict_self`) right before exec.
    pub fn ruleset_fd(&self) -> Result<Option<OwnedFd>, String> {
        let created = Ruleset::default()
            .handle_access(AccessFs::from_all(WANTED_ABI))
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
                    AccessFs::from_all(WANTED_ABI),
                ))
            })
            .map_err(|e| format!("cannot build the Landlock ruleset: {e}"))?;
        Ok(created.into())
    }
}

/// In the forked child, before exec: `no_new_privs`, the limits, then
/// Landlock. Only async-signal-safe system calls.
pub fn apply_in_child(limits: &Limits, ruleset: Option<&OwnedFd>) -> std::io::Result<()> {
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

    #[test]
    fn the_sandbox_folder_is_created_once_and_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let settings = SandboxSettings::default();
        let bundle = dir.path().join("b");
        std::fs::create_dir_all(&bundle).unwrap();
        let a = prepare(&settings, dir.path(), "ws", "b", &bundle, "/bin/sh").unwrap();
        assert!(a.record.created);
        assert_eq!(a.record.sandbox_id, "ws/b");
        assert!(a.data.is_dir() && a.tmp.is_dir());
        let b = prepare(&settings, dir.path(), "ws", "b", &bundle, "/bin/sh").unwrap();
        assert!(!b.record.created);
        assert_eq!(a.record.sandbox_path, b.record.sandbox_path);
        assert!(a.record.strategy.contains("no_new_privs"));
        match landlock_abi() {
            Ok(_) => {
                let rules = a.landlock.unwrap();
                assert!(rules.read.contains(&bundle));
                assert!(rules.write.contains(&a.data));
                assert!(!rules
                    .read
                    .iter()
                    .any(|p| p == Path::new("/etc") || p == dir.path()));
                assert!(a.record.landlock.starts_with("enforced"));
            }
            Err(_) => assert!(a.record.landlock.starts_with("unavailable")),
        }
    }

    #[test]
    fn the_interpreter_prefix_is_found_through_links() {
        let prefix = install_prefix("/bin/sh", Path::new("/")).unwrap();
        assert!(prefix.is_dir());
        assert!(install_prefix("no-such-binary-here", Path::new("/")).is_none());
    }
}
