//! Can a bundle's user reach a path? A root daemon runs each bundle under a
//! uid of its own; before it starts one, it checks, with the permission
//! bits the kernel will use, that this uid can pass through every folder
//! down to what it must run or read (symbolic links followed, each folder
//! on either side of a link included). A refusal names the folder, its
//! owner and mode, and the fix, instead of an `EACCES` at exec that would
//! look like a crash.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Who a bundle runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// How refusals name it: `the bundle's uid 2000000001`.
    pub name: String,
}

impl Identity {
    /// The bundle running as `uid`/`gid` (no supplementary groups, as the
    /// spawn leaves it).
    pub fn bundle(uid: u32, gid: u32) -> Identity {
        Identity {
            uid,
            gid,
            groups: Vec::new(),
            name: format!("the bundle's uid {uid}"),
        }
    }
}

/// What the bundle must be able to do with the path itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Enter a folder, or read a file.
    Read,
    /// Run a file (read and execute it), or enter a folder.
    Run,
}

/// Why a path is out of a bundle's reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    /// The path that was asked for.
    pub path: PathBuf,
    /// The folder or file that stops the bundle's user.
    pub at: PathBuf,
    pub owner: String,
    pub group: u32,
    pub mode: u32,
    /// What it lacks: "enter", "read", "run", "exist", or "find" (a bare
    /// command on no folder of the bundle's `PATH`).
    pub lacks: &'static str,
    /// Who could not: `the bundle's uid N`.
    pub who: String,
}

impl std::error::Error for Unreachable {}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.lacks {
            "exist" => return write!(f, "{} does not exist", self.at.display()),
            "find" => {
                return write!(
                    f,
                    "the command {:?} is in no folder of the bundle's PATH ({}); install it, or name it by its full path in the manifest",
                    self.path.display(),
                    self.at.display()
                )
            }
            _ => {}
        }
        let what = if self.at == self.path {
            String::new()
        } else {
            format!(" on the way to {}", self.path.display())
        };
        write!(
            f,
            "{} cannot {} {}{what} (owner {}, group {}, mode {:o}); {}",
            self.who,
            self.lacks,
            self.at.display(),
            self.owner,
            self.group,
            self.mode,
            match self.lacks {
                "enter" => format!(
                    "let other users enter it (`chmod o+x {}`), or move what the bundle needs to a folder every user can enter",
                    self.at.display()
                ),
                "run" => format!("make it readable and executable (`chmod o+rx {}`)", self.at.display()),
                _ => format!("make it readable (`chmod o+r {}`)", self.at.display()),
            }
        )
    }
}

/// The user's name for a uid (`root`, `nobody`), or `uid N`.
pub fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// Checks that `who` can reach `path` and `need` it: every folder on the
/// way entered (`x`), links followed (at most 40), the path itself read (a
/// file), run (`r` and `x`) or entered (a folder).
pub fn check(who: &Identity, path: &Path, need: Need) -> Result<(), Unreachable> {
    let wanted = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut pending: Vec<PathBuf> = Vec::new();
    push_components(&mut pending, &wanted);
    let mut at = PathBuf::from("/");
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        let next = match part.as_os_str().to_str() {
            Some("..") => {
                at.pop();
                continue;
            }
            _ => at.join(&part),
        };
        // The folder holding `next` must be entered.
        allowed(who, &at, &wanted, 0o1, "enter")?;
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(_) => return Err(missing(who, &wanted, &next)),
        };
        if meta.file_type().is_symlink() {
            hops += 1;
            let target = std::fs::read_link(&next).map_err(|_| missing(who, &wanted, &next))?;
            if hops > 40 {
                return Err(missing(who, &wanted, &next));
            }
            if target.is_absolute() {
                at = PathBuf::from("/");
            }
            push_components(&mut pending, &target);
            continue;
        }
        at = next;
    }
    let meta = std::fs::metadata(&at).map_err(|_| missing(who, &wanted, &at))?;
    if meta.is_dir() {
        return allowed(who, &at, &wanted, 0o1, "enter");
    }
    match need {
        Need::Read => allowed(who, &at, &wanted, 0o4, "read"),
        Need::Run => allowed(who, &at, &wanted, 0o5, "run"),
    }
}

/// Pushes `path`'s components so that the first is popped first.
fn push_components(pending: &mut Vec<PathBuf>, path: &Path) {
    let parts: Vec<PathBuf> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(PathBuf::from(p)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    pending.extend(parts.into_iter().rev());
}

fn missing(who: &Identity, wanted: &Path, at: &Path) -> Unreachable {
    Unreachable {
        path: wanted.to_path_buf(),
        at: at.to_path_buf(),
        owner: String::new(),
        group: 0,
        mode: 0,
        lacks: "exist",
        who: who.name.clone(),
    }
}

/// Whether the permission bits of `at` give `who` every bit of `bits`
/// (`r` = 4, `x` = 1), as the kernel decides: the owner's bits for its
/// owner, the group's for a member, the others' for everyone else. Root
/// reads anything and runs what anyone may run.
fn allowed(
    who: &Identity,
    at: &Path,
    wanted: &Path,
    bits: u32,
    lacks: &'static str,
) -> Result<(), Unreachable> {
    let meta = std::fs::metadata(at).map_err(|_| missing(who, wanted, at))?;
    let mode = meta.mode() & 0o7777;
    let granted = if who.uid == 0 {
        if meta.is_dir() || bits & 0o1 == 0 || mode & 0o111 != 0 {
            bits
        } else {
            0
        }
    } else if meta.uid() == who.uid {
        (mode >> 6) & 0o7
    } else if meta.gid() == who.gid || who.groups.contains(&meta.gid()) {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    };
    if granted & bits == bits {
        return Ok(());
    }
    Err(Unreachable {
        path: wanted.to_path_buf(),
        at: at.to_path_buf(),
        owner: user_name(meta.uid()),
        group: meta.gid(),
        mode,
        lacks,
        who: who.name.clone(),
    })
}

/// The program a bundle's `command` runs, as `execvp` finds it for `who`:
/// a path (relative to `cwd`) as it is, a bare name in the first folder of
/// `path` where it can be run (a folder where it exists but cannot be run
/// is the reason when no other has it). The interpreter a script names
/// (`#!`, `/usr/bin/env NAME` looked up the same way) and the installation
/// a virtual environment's `pyvenv.cfg` points to must be reachable too.
pub fn resolve(
    who: &Identity,
    command: &str,
    cwd: &Path,
    path: &std::ffi::OsStr,
) -> Result<PathBuf, Unreachable> {
    let program = find(who, command, cwd, path)?;
    interpreter(who, &program, path, 0)?;
    Ok(program)
}

fn find(
    who: &Identity,
    command: &str,
    cwd: &Path,
    path: &std::ffi::OsStr,
) -> Result<PathBuf, Unreachable> {
    if command.contains('/') {
        let program = cwd.join(command);
        check(who, &program, Need::Run)?;
        return Ok(program);
    }
    let mut refused = None;
    for dir in std::env::split_paths(path) {
        let candidate = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else {
            dir
        }
        .join(command);
        if std::fs::metadata(&candidate).is_err() {
            continue;
        }
        match check(who, &candidate, Need::Run) {
            Ok(()) => return Ok(candidate),
            Err(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    Err(refused.unwrap_or_else(|| Unreachable {
        path: PathBuf::from(command),
        at: PathBuf::from(path),
        owner: String::new(),
        group: 0,
        mode: 0,
        lacks: "find",
        who: who.name.clone(),
    }))
}

/// Checks what `program` needs besides itself: a script's interpreter, a
/// virtual environment's base installation.
fn interpreter(
    who: &Identity,
    program: &Path,
    path: &std::ffi::OsStr,
    depth: u32,
) -> Result<(), Unreachable> {
    let real = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    // PREFIX/bin/python of a venv: PREFIX/pyvenv.cfg says where its
    // interpreter's installation (standard library) is.
    for link in [program, real.as_path()] {
        let cfg = link
            .parent()
            .and_then(Path::parent)
            .map(|p| p.join("pyvenv.cfg"));
        if let Some(home) = cfg
            .and_then(|c| std::fs::read_to_string(c).ok())
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let (key, value) = l.split_once('=')?;
                    (key.trim() == "home").then(|| PathBuf::from(value.trim()))
                })
            })
        {
            check(who, &home, Need::Read)?;
        }
    }
    if depth >= 4 {
        return Ok(());
    }
    let mut head = [0u8; 256];
    let n = std::fs::File::open(&real)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let line =
        String::from_utf8_lossy(line.split(|b| *b == b'\n').next().unwrap_or_default()).to_string();
    let mut words = line.split_whitespace();
    let Some(first) = words.next() else {
        return Ok(());
    };
    check(who, Path::new(first), Need::Run)?;
    let named = if Path::new(first).file_name().is_some_and(|n| n == "env") {
        words.find(|w| !w.starts_with('-'))
    } else {
        None
    };
    let next = match named {
        Some(name) => find(who, name, Path::new("/"), path)?,
        None => PathBuf::from(first),
    };
    interpreter(who, &next, path, depth + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn stranger() -> Identity {
        Identity::bundle(2_000_012_345, 2_000_012_345)
    }

    #[test]
    fn every_folder_on_the_way_must_be_entered() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let closed = dir.path().join("closed");
        std::fs::create_dir_all(closed.join("bin")).unwrap();
        let tool = closed.join("bin/tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        chmod(&tool, 0o755);
        chmod(&closed.join("bin"), 0o755);
        chmod(&closed, 0o700);
        let refused = check(&stranger(), &tool, Need::Run).unwrap_err();
        assert_eq!(refused.at, closed);
        assert_eq!(refused.lacks, "enter");
        assert_eq!(refused.mode, 0o700);
        let text = refused.to_string();
        assert!(
            text.contains("the bundle's uid 2000012345 cannot enter"),
            "{text}"
        );
        assert!(
            text.contains(&format!("chmod o+x {}", closed.display())),
            "{text}"
        );
        chmod(&closed, 0o711);
        check(&stranger(), &tool, Need::Run).unwrap();
        // A file that is not executable cannot be run, but it can be read.
        chmod(&tool, 0o644);
        assert_eq!(
            check(&stranger(), &tool, Need::Run).unwrap_err().lacks,
            "run"
        );
        check(&stranger(), &tool, Need::Read).unwrap();
    }

    #[test]
    fn links_are_followed_and_both_sides_checked() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        // A venv's python links into an installation the bundle cannot enter.
        let install = dir.path().join("home/.pyenv/bin");
        std::fs::create_dir_all(&install).unwrap();
        let python = install.join("python3");
        std::fs::write(&python, "").unwrap();
        chmod(&python, 0o755);
        chmod(&dir.path().join("home/.pyenv"), 0o755);
        chmod(&install, 0o755);
        chmod(&dir.path().join("home"), 0o700);
        let venv = dir.path().join("venv/bin");
        std::fs::create_dir_all(&venv).unwrap();
        chmod(&dir.path().join("venv"), 0o755);
        chmod(&venv, 0o755);
        std::os::unix::fs::symlink(&python, venv.join("python")).unwrap();
        std::os::unix::fs::symlink("python", venv.join("python3")).unwrap();
        let refused = check(&stranger(), &venv.join("python3"), Need::Run).unwrap_err();
        assert_eq!(refused.at, dir.path().join("home"), "{refused}");
        chmod(&dir.path().join("home"), 0o711);
        check(&stranger(), &venv.join("python3"), Need::Run).unwrap();
        // The group's bits count for a member.
        chmod(&venv, 0o750);
        let member = Identity {
            groups: vec![std::fs::metadata(&venv).unwrap().gid()],
            ..stranger()
        };
        assert_eq!(
            check(&stranger(), &venv.join("python"), Need::Run)
                .unwrap_err()
                .at,
            venv
        );
        check(&member, &venv.join("python"), Need::Run).unwrap();
        let gone = check(&stranger(), &dir.path().join("nothing"), Need::Read).unwrap_err();
        assert_eq!(gone.lacks, "exist");
    }

    #[test]
    fn a_command_is_found_as_execvp_would_and_its_interpreter_checked() {
        let dir = tempfile::tempdir().unwrap();
        chmod(dir.path(), 0o755);
        let (closed, open) = (dir.path().join("closed"), dir.path().join("open"));
        for d in [&closed, &open] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("tool"), "#!/bin/sh\n").unwrap();
            chmod(&d.join("tool"), 0o755);
        }
        chmod(&closed, 0o700);
        let path = std::env::join_paths([&closed, &open]).unwrap();
        // The first folder holds it but cannot be entered: the next one's.
        let found = resolve(&stranger(), "tool", dir.path(), &path).unwrap();
        assert_eq!(found, open.join("tool"));
        // Only there: the refusal says why.
        let only = std::env::join_paths([&closed]).unwrap();
        let refused = resolve(&stranger(), "tool", dir.path(), &only).unwrap_err();
        assert_eq!(
            (refused.at.as_path(), refused.lacks),
            (closed.as_path(), "enter")
        );
        let nowhere = resolve(&stranger(), "no-such-tool", dir.path(), &path).unwrap_err();
        assert!(
            nowhere
                .to_string()
                .contains("is in no folder of the bundle's PATH"),
            "{nowhere}"
        );
        // A script whose interpreter is out of reach.
        std::fs::write(closed.join("interp"), "").unwrap();
        chmod(&closed.join("interp"), 0o755);
        std::fs::write(
            open.join("script"),
            format!("#!{} -u\n", closed.join("interp").display()),
        )
        .unwrap();
        chmod(&open.join("script"), 0o755);
        let refused = resolve(&stranger(), "script", dir.path(), &path).unwrap_err();
        assert_eq!(refused.at, closed, "{refused}");
        // A venv whose base installation is out of reach.
        std::fs::create_dir_all(open.join("venv/bin")).unwrap();
        std::fs::write(
            open.join("venv/pyvenv.cfg"),
            format!("home = {}\n", closed.display()),
        )
        .unwrap();
        std::os::unix::fs::symlink("/bin/sh", open.join("venv/bin/python")).unwrap();
        let refused = resolve(&stranger(), "venv/bin/python", &open, &path).unwrap_err();
        assert_eq!(refused.at, closed, "{refused}");
        chmod(&closed, 0o711);
        resolve(&stranger(), "venv/bin/python", &open, &path).unwrap();
    }
}
