//! Who is on the other end of a control connection. Besides the uid rule
//! (the daemon's uid, `allowed_uids`, `allowed_gids`), a peer that is a
//! bundle is refused whatever its uid: one whose uid is a bundle uid (the
//! `[sandbox] uid_range`, or the shared `[sandbox] user`), or whose process
//! descends from the daemon (every bundle process does, unless it
//! double-forked away — which is why a daemon without uid separation needs
//! the operator's opt-in; docs/security.md).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{ControlSettings, SandboxSettings};

/// Bounds the blocking file-system work done on paths a peer names
/// (`files put` opens and reads them): at most [`PathWork::PER_UID`]
/// operations of one uid at once, over all its connections. A path on a
/// file system that never answers (a FUSE mount its owner controls, a hung
/// NFS server) then holds a few of the blocking pool's threads, never all
/// of them, and other peers' requests (the operator's `status`) go on.
#[derive(Default)]
pub struct PathWork {
    per_uid: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

impl PathWork {
    pub const PER_UID: usize = 8;

    /// Waits (without holding a thread) for one of the uid's slots.
    pub async fn permit(&self, uid: u32) -> OwnedSemaphorePermit {
        let slots = self
            .per_uid
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(uid)
            .or_insert_with(|| Arc::new(Semaphore::new(Self::PER_UID)))
            .clone();
        slots
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }
}

/// An admitted peer. The daemon acts on paths for it only as far as it
/// could itself: an admitted user other than the daemon's may name only
/// files and folders it owns (`files put`, `install`, `configure` of a
/// `file`/`directory` value), and the answer for one it does not own is the
/// same whether the path exists or not.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub uid: u32,
}

impl Peer {
    /// The daemon itself (tests and in-process callers), or its own uid.
    pub fn daemon() -> Peer {
        Peer {
            uid: nix::unistd::geteuid().as_raw(),
        }
    }

    /// Whether the peer runs under the daemon's uid (and so may name any
    /// path the daemon can read).
    pub fn is_daemon_uid(&self) -> bool {
        self.uid == nix::unistd::geteuid().as_raw()
    }

    /// Whether the peer may have the daemon act on `path`: always for the
    /// daemon's uid, else only when the file (links followed) is the peer's.
    /// The path is looked up with the peer's own rights, so a path through
    /// a folder only root may enter is as missing as a path that is.
    pub fn may_use(&self, path: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.is_daemon_uid()
            || crate::bundle::sandbox::as_user(self.uid, || {
                std::fs::metadata(path).is_ok_and(|m| m.uid() == self.uid)
            })
            .unwrap_or(false)
    }

    /// The same check on an opened file (no race with a path swapped after
    /// the check).
    pub fn may_read(&self, file: &std::fs::File) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.is_daemon_uid() || file.metadata().is_ok_and(|m| m.uid() == self.uid)
    }

    /// The refusal for a path the peer may not use (says nothing about
    /// whether it exists).
    pub fn not_theirs(&self, what: &str, path: &str) -> String {
        format!(
            "{path:?} is not a {what} owned by uid {}: an admitted user other than the daemon's may name only its own files and folders (docs/security.md)",
            self.uid
        )
    }
}

/// The peer's parent, from `/proc/PID/stat` (field 4, after the command
/// name in parentheses, which may itself hold spaces and parentheses).
fn parent_of(proc_root: &Path, pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a descendant of `ancestor` (bounded walk up the tree).
pub fn descends_from(proc_root: &Path, pid: i32, ancestor: i32) -> bool {
    let mut current = pid;
    for _ in 0..4096 {
        match parent_of(proc_root, current) {
            Some(parent) if parent == ancestor => return true,
            Some(parent) if parent > 1 => current = parent,
            _ => return false,
        }
    }
    false
}

/// Why the peer `(uid, gid, pid)` must be refused, or None to admit it.
pub fn refusal(
    uid: u32,
    gid: u32,
    pid: Option<i32>,
    control: &ControlSettings,
    sandbox: &SandboxSettings,
) -> Option<String> {
    let who = format!(
        "uid {uid} (gid {gid}, pid {})",
        pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
    );
    if sandbox.uid_range.contains(uid) || sandbox.uid_range.contains(gid) {
        return Some(format!(
            "{who} is a bundle's ([sandbox] uid_range {}); bundles may not control the daemon",
            sandbox.uid_range
        ));
    }
    if let Some(name) = &sandbox.user {
        let shared = nix::unistd::User::from_name(name).ok().flatten();
        if shared.is_some_and(|u| u.uid.as_raw() == uid) {
            return Some(format!(
                "{who} is [sandbox] user {name:?}, which bundles run as; bundles may not control the daemon"
            ));
        }
    }
    let me = std::process::id() as i32;
    match pid {
        Some(pid) if descends_from(Path::new("/proc"), pid, me) => {
            return Some(format!(
                "{who} is a process of a bundle (it descends from the daemon); bundles may not control the daemon"
            ));
        }
        Some(_) => {}
        None => {
            return Some(format!(
                "{who}: the peer's process is unknown, so it cannot be told apart from a bundle"
            ))
        }
    }
    let daemon_uid = nix::unistd::geteuid().as_raw();
    if uid == daemon_uid
        || control.allowed_uids.contains(&uid)
        || control.allowed_gids.contains(&gid)
    {
        return None;
    }
    Some(format!(
        "{who} is not allowed to control this daemon; it admits uid {daemon_uid}{}",
        if control.allowed_uids.is_empty() && control.allowed_gids.is_empty() {
            " only (add the uid to [control] allowed_uids to admit it)".to_string()
        } else {
            format!(
                ", uids {:?} and gids {:?} ([control])",
                control.allowed_uids, control.allowed_gids
            )
        }
    ))
}

/// `/proc/net/tcp{,6}`'s spelling of an address: the IP as the kernel's
/// 32-bit words in host order, then the port, in upper-case hex.
fn proc_net_address(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(v4) => format!("{:08X}", u32::from_ne_bytes(v4.octets())),
        std::net::IpAddr::V6(v6) => v6
            .octets()
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect(),
    };
    format!("{ip}:{:04X}", addr.port())
}

/// The uid and inode of the TCP socket whose local end is `peer` and whose
/// remote end is `ours`: the client's side of a connection to the daemon.
fn tcp_owner(
    proc_root: &Path,
    peer: std::net::SocketAddr,
    ours: std::net::SocketAddr,
) -> Option<(u32, u64)> {
    let (local, remote) = (proc_net_address(peer), proc_net_address(ours));
    let table = if peer.is_ipv4() {
        "net/tcp"
    } else {
        "net/tcp6"
    };
    let text = std::fs::read_to_string(proc_root.join("self").join(table)).ok()?;
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == local && f[2] == remote)
            .then(|| Some((f[7].parse().ok()?, f[9].parse().ok()?)))
            .flatten()
    })
}

/// The daemon's descendants (its children, theirs, ...).
fn descendants(proc_root: &Path) -> Vec<i32> {
    let children = |pid: &str| -> Vec<i32> {
        let tasks = proc_root.join(pid).join("task");
        std::fs::read_dir(tasks)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    };
    let mut found = children("self");
    let mut i = 0;
    while i < found.len() && found.len() < 1_000_000 {
        let next = children(&found[i].to_string());
        found.extend(next);
        i += 1;
    }
    found
}

/// Whether one of `pids` has the socket `inode` open.
fn held_by(proc_root: &Path, pids: &[i32], inode: u64) -> bool {
    let wanted = format!("socket:[{inode}]");
    pids.iter().any(|pid| {
        std::fs::read_dir(proc_root.join(pid.to_string()).join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == wanted.as_str()))
    })
}

/// Why a TCP client of a daemon listener (`ours`) at `peer` must be
/// refused: its socket belongs to a bundle uid, or a process that descends
/// from the daemon holds it. None to serve it.
pub fn tcp_refusal(
    peer: std::net::SocketAddr,
    ours: std::net::SocketAddr,
    sandbox: &SandboxSettings,
) -> Option<String> {
    let proc_root = Path::new("/proc");
    let (uid, inode) = tcp_owner(proc_root, peer, ours)?;
    if sandbox.uid_range.contains(uid) {
        return Some(format!(
            "{peer} is a bundle's socket (uid {uid}, [sandbox] uid_range); bundles may not use the daemon's listeners"
        ));
    }
    if let Some(name) = &sandbox.user {
        if nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .is_some_and(|u| u.uid.as_raw() == uid)
        {
            return Some(format!(
                "{peer} belongs to [sandbox] user {name:?}, which bundles run as"
            ));
        }
    }
    held_by(proc_root, &descendants(proc_root), inode)
        .then(|| format!("{peer} is held by a process of a bundle (it descends from the daemon)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `program` and returns it with the first line it prints.
    fn first_line(program: &str, args: &[&str]) -> (std::process::Child, String) {
        let mut child = std::process::Command::new(program)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        (child, line.trim().to_string())
    }

    #[test]
    fn a_child_and_a_grandchild_descend_from_this_process_and_init_does_not() {
        let me = std::process::id() as i32;
        let (mut child, line) = first_line("sh", &["-c", "sleep 30 & echo $!; wait"]);
        let grandchild: i32 = line.parse().unwrap();
        let proc_root = Path::new("/proc");
        assert!(descends_from(proc_root, child.id() as i32, me));
        assert!(descends_from(proc_root, grandchild, me));
        assert!(!descends_from(proc_root, 1, me));
        assert!(!descends_from(proc_root, me, grandchild));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn bundle_uids_are_refused_even_when_listed() {
        let sandbox = SandboxSettings::default();
        let control: ControlSettings = toml::from_str("").unwrap();
        let first = sandbox.uid_range.first;
        let why = refusal(first, first, Some(1), &control, &sandbox).unwrap();
        assert!(why.contains("uid_range"), "{why}");
        // The test process itself is no bundle: its own uid is admitted.
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(refusal(me, me, Some(1), &control, &sandbox), None);
        // ... but a descendant of the daemon (here: of this process) is not.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let why = refusal(me, me, Some(child.id() as i32), &control, &sandbox).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(why.contains("descends from the daemon"), "{why}");
    }

    #[test]
    fn a_tcp_client_is_found_in_proc_net_tcp_and_a_child_holding_it_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = listener.local_addr().unwrap();
        let sandbox = SandboxSettings::default();
        // This process's own client socket: its uid, not a descendant's.
        let client = std::net::TcpStream::connect(ours).unwrap();
        let peer = client.local_addr().unwrap();
        let (uid, inode) = tcp_owner(Path::new("/proc"), peer, ours).unwrap();
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
        assert!(inode > 0);
        assert_eq!(tcp_refusal(peer, ours, &sandbox), None);
        // A child that connects: refused as a descendant.
        let script = format!(
            "import socket,sys,time\ns=socket.create_connection(('127.0.0.1',{}))\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)",
            ours.port()
        );
        let (mut child, line) = first_line("/usr/bin/python3", &["-c", &script]);
        let port: u16 = line.parse().unwrap();
        let child_peer = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let why = tcp_refusal(child_peer, ours, &sandbox);
        let _ = child.kill();
        let _ = child.wait();
        assert!(why.is_some_and(|w| w.contains("descends from the daemon")));
    }
}
