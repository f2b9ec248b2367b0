//! Admission: who may use the daemon's listeners — the control socket and
//! the TCP listeners (the HTTP gateway, the ops endpoints) — in one module
//! both use. Every check here fails closed: a peer the daemon cannot
//! identify is refused.
//!
//! On the control socket, besides the uid rule (the daemon's uid,
//! `allowed_uids`, `allowed_gids`), a peer that is a bundle is refused
//! whatever its uid: one whose uid is a bundle uid (the `[sandbox]
//! uid_range`, or the shared `[sandbox] user`), or whose process descends
//! from the daemon (every bundle process does, unless it double-forked
//! away — which is why a daemon without uid separation needs the
//! operator's opt-in; docs/security.md). On a TCP listener, a client that
//! is a local bundle ([`tcp_refusal`]).

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

/// The process at the other end of a unix socket, pinned by a pidfd: the
/// kernel's `SO_PEERPIDFD` (Linux 6.5+), taken at `connect()`, so it names
/// the connecting process even after it exited and its pid was reused. Its
/// `/proc` entries are believed only while the pidfd says it has not been
/// reaped (a reaped pid may already be another process's).
pub struct PeerProcess {
    pid: i32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

/// `SO_PEERPIDFD` of `<asm-generic/socket.h>` (x86-64, arm64, riscv).
const SO_PEERPIDFD: nix::libc::c_int = 77;

impl PeerProcess {
    /// The peer of the connected unix socket `socket`, whose SO_PEERCRED
    /// pid is `pid`. Where the kernel has no `SO_PEERPIDFD` (before 6.5),
    /// a pidfd opened now stands in: it cannot tell a pid reused between
    /// `connect()` and now (docs/security.md says so).
    pub fn of(socket: std::os::fd::BorrowedFd<'_>, pid: i32) -> PeerProcess {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fd: nix::libc::c_int = -1;
        let mut len = std::mem::size_of::<nix::libc::c_int>() as nix::libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `fd`.
        let got = unsafe {
            nix::libc::getsockopt(
                socket.as_raw_fd(),
                nix::libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut nix::libc::c_int).cast(),
                &mut len,
            )
        };
        let unknown_option =
            std::io::Error::last_os_error().raw_os_error() == Some(nix::libc::ENOPROTOOPT);
        let pidfd = if got == 0 && fd >= 0 {
            // SAFETY: a descriptor the kernel just made for us, owned by no one else.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        } else if got != 0 && unknown_option {
            u32::try_from(pid)
                .ok()
                .and_then(|p| crate::bundle::spawn::pidfd_open(p).ok())
        } else {
            // Any other failure (before 6.16: the peer is already reaped) leaves
            // the peer unidentified, so refused: a pidfd opened now could
            // name another process that took its pid.
            None
        };
        PeerProcess { pid, pidfd }
    }

    /// Whether the process is still there (running, or a zombie not yet
    /// reaped): its pid is still its own. The pidfd's `fdinfo` says `Pid: -1`
    /// once it is reaped.
    fn unreaped(&self) -> bool {
        use std::os::fd::AsRawFd;
        let Some(pidfd) = &self.pidfd else {
            return false;
        };
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()));
        info.ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("Pid:"))
                    .and_then(|v| v.trim().parse::<i32>().ok())
            })
            .is_some_and(|p| p == self.pid)
    }
}

/// The parent of `pid`, from `/proc/PID/stat` (field 4, after the command
/// name in parentheses, which may itself hold spaces and parentheses).
fn parent_of(proc_root: &Path, pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Where a process stands to the daemon.
#[derive(Debug, PartialEq, Eq)]
pub enum Lineage {
    /// It descends from the ancestor.
    Descends,
    /// It does not (its line reaches init, or a process outside the
    /// daemon's pid namespace).
    Apart,
    /// Its line could not be read to the end: a process on the way exited
    /// while it was read. Whoever asks must refuse (fail closed).
    Unknown,
}

/// Whether `pid` descends from `ancestor`, walking `/proc` upwards. Each
/// step is confirmed: after a parent's entry is read, the child's is read
/// again, and the step counts only if the child's parent is unchanged. A
/// parent that exited meanwhile has re-parented its child (to the daemon,
/// its children's subreaper, or to init), so a pid reused by another
/// process is never taken for the parent. `pid`'s own entry is the caller's
/// to vouch for ([`PeerProcess`]'s pidfd).
pub fn lineage(proc_root: &Path, pid: i32, ancestor: i32) -> Lineage {
    let mut child = pid;
    let Some(mut parent) = parent_of(proc_root, child) else {
        return Lineage::Unknown;
    };
    for _ in 0..4096 {
        if parent == ancestor {
            return Lineage::Descends;
        }
        if parent <= 1 {
            return Lineage::Apart;
        }
        let grandparent = parent_of(proc_root, parent);
        match parent_of(proc_root, child) {
            None => return Lineage::Unknown,
            // Re-parented while we read: this step again, from its new parent.
            Some(now) if now != parent => parent = now,
            Some(_) => match grandparent {
                None => return Lineage::Unknown,
                Some(next) => (child, parent) = (parent, next),
            },
        }
    }
    Lineage::Unknown
}

/// What makes `(uid, gid)` a bundle's identity, if it is one: a uid or
/// gid of `[sandbox] uid_range`, the shared `[sandbox] user`, or a
/// bundle's own `[[sandbox.bundle]] user`.
fn bundle_identity(uid: u32, gid: u32, sandbox: &SandboxSettings) -> Option<String> {
    if sandbox.uid_range.contains(uid) || sandbox.uid_range.contains(gid) {
        return Some(format!(
            "a bundle's ([sandbox] uid_range {})",
            sandbox.uid_range
        ));
    }
    // The users bundles run as by name: `[sandbox] user`, and each
    // bundle's own `[[sandbox.bundle]] user`.
    let named = sandbox.user.iter().map(|n| (n, "[sandbox] user")).chain(
        sandbox
            .bundles
            .iter()
            .filter_map(|o| o.user.as_ref().map(|n| (n, "[[sandbox.bundle]] user"))),
    );
    for (name, key) in named {
        let user = nix::unistd::User::from_name(name).ok().flatten();
        if user.is_some_and(|u| u.uid.as_raw() == uid) {
            return Some(format!("{key} {name:?}, which a bundle runs as"));
        }
    }
    None
}

/// Why the peer `(uid, gid, process)` must be refused, or None to admit it.
/// A peer whose process cannot be identified (none given, or it exited
/// before its line was read) is refused: it cannot be told apart from a
/// bundle.
pub fn refusal(
    uid: u32,
    gid: u32,
    process: Option<&PeerProcess>,
    control: &ControlSettings,
    sandbox: &SandboxSettings,
) -> Option<String> {
    let who = format!(
        "uid {uid} (gid {gid}, pid {})",
        process
            .map(|p| p.pid.to_string())
            .unwrap_or_else(|| "?".into())
    );
    if let Some(why) = bundle_identity(uid, gid, sandbox) {
        return Some(format!(
            "{who} is {why}; bundles may not control the daemon"
        ));
    }
    let me = std::process::id() as i32;
    let Some(process) = process else {
        return Some(format!(
            "{who}: the peer's process is unknown, so it cannot be told apart from a bundle"
        ));
    };
    match lineage(Path::new("/proc"), process.pid, me) {
        Lineage::Descends => {
            return Some(format!(
                "{who} is a process of a bundle (it descends from the daemon); bundles may not control the daemon"
            ));
        }
        // Read after the walk: the entries walked were the peer's own.
        Lineage::Apart if process.unreaped() => {}
        Lineage::Apart | Lineage::Unknown => {
            return Some(format!(
                "{who}: the process that connected exited before it could be identified, so it cannot be told apart from a bundle"
            ));
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
    if proc_root == Path::new("/proc") {
        if let Some(found) = sock_diag::owner(peer, ours) {
            return found;
        }
    }
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

/// The kernel's socket diagnostics (`NETLINK_SOCK_DIAG`): one TCP socket
/// looked up by its four addresses, where `/proc/net/tcp` lists them all —
/// 10 ms a read with 1,000 connections open, so a burst of N new clients
/// cost N² (1,000 agents connecting at once spent their first seconds
/// being admitted; docs/performance.md, "Throughput").
mod sock_diag {
    use std::net::{IpAddr, SocketAddr};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use nix::libc;

    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const TCP_LISTEN: u8 = 10;
    /// nlmsghdr (16 bytes) + inet_diag_req_v2 (56 bytes).
    const REQUEST: usize = 16 + 56;

    /// The four addresses as `struct inet_diag_sockid` holds them (ports
    /// and addresses in network order, no interface, no cookie).
    fn sockid(local: SocketAddr, remote: SocketAddr) -> [u8; 48] {
        let mut id = [0u8; 48];
        id[0..2].copy_from_slice(&local.port().to_be_bytes());
        id[2..4].copy_from_slice(&remote.port().to_be_bytes());
        let put = |out: &mut [u8], ip: IpAddr| match ip {
            IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
        };
        put(&mut id[4..20], local.ip());
        put(&mut id[20..36], remote.ip());
        // idiag_if = 0, then the cookie: INET_DIAG_NOCOOKIE twice.
        id[40..48].fill(0xff);
        id
    }

    /// The uid and inode of the TCP socket whose local end is `local` and
    /// remote end `remote`: `Some(None)` for a listening socket or other
    /// families, `None` when the kernel does not name it (the caller reads
    /// /proc).
    pub fn owner(local: SocketAddr, remote: SocketAddr) -> Option<Option<(u32, u64)>> {
        if local.is_ipv4() != remote.is_ipv4() {
            return Some(None);
        }
        // SAFETY: socket() takes three integers and returns a new
        // descriptor or -1.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: a descriptor socket() just returned, owned by no one else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let id = sockid(local, remote);
        let mut request = [0u8; REQUEST];
        request[0..4].copy_from_slice(&(REQUEST as u32).to_ne_bytes());
        request[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        request[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
        request[8..12].copy_from_slice(&1u32.to_ne_bytes());
        let family = if local.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        request[16] = family as u8;
        request[17] = libc::IPPROTO_TCP as u8;
        // idiag_states: every state.
        request[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        request[24..72].copy_from_slice(&id);
        // SAFETY: the request is REQUEST bytes, all of which are sent.
        let sent = unsafe { libc::send(socket.as_raw_fd(), request.as_ptr().cast(), REQUEST, 0) };
        if sent != REQUEST as isize {
            return None;
        }
        let mut answer = [0u8; 8192];
        // The kernel answers within send(): nothing queued by now is no
        // answer (never a wait on the blocking pool).
        // SAFETY: at most answer.len() bytes are written into it.
        let got = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                answer.as_mut_ptr().cast(),
                answer.len(),
                libc::MSG_DONTWAIT,
            )
        };
        let answer = &answer[..usize::try_from(got).ok()?];
        if answer.len() < 16 {
            return None;
        }
        let kind = u16::from_ne_bytes([answer[4], answer[5]]);
        if kind == libc::NLMSG_ERROR as u16 {
            // Even ENOENT says too little (no such socket, but also no
            // tcp_diag module, or a socket bound to a device, which an
            // interface-less request does not find): /proc decides.
            return None;
        }
        // inet_diag_msg: family, state, timer, retrans, the sockid (48),
        // expires, rqueue, wqueue, uid, inode. The socket found must be
        // the one asked for (its ports and addresses; the kernel fills in
        // its own cookie).
        let msg = answer.get(16..16 + 72)?;
        if kind != SOCK_DIAG_BY_FAMILY || msg[4..40] != id[..36] {
            return None;
        }
        if msg[1] == TCP_LISTEN {
            return Some(None);
        }
        let uid = u32::from_ne_bytes(msg[64..68].try_into().ok()?);
        let inode = u32::from_ne_bytes(msg[68..72].try_into().ok()?);
        Some(Some((uid, u64::from(inode))))
    }
}

/// Whether `ip` is an address of this host's network namespace: only such
/// a client can be a process here (a bundle among them). Read from the
/// interfaces; an error counts as local (fail closed).
fn is_local(ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        return true;
    };
    interfaces.into_iter().any(|i| {
        i.address.is_some_and(|a| {
            a.as_sockaddr_in().map(|v4| std::net::IpAddr::V4(v4.ip())) == Some(ip)
                || a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())) == Some(ip)
        })
    })
}

/// The processes of uid `uid` that hold the socket `inode` open.
fn holders(proc_root: &Path, uid: u32, inode: u64) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir(proc_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            (e.metadata().ok()?.uid() == uid).then_some(pid)
        })
        .filter(|pid| holds(proc_root, *pid, &wanted))
        .collect()
}

/// Whether process `pid` has the descriptor `wanted` (`socket:[INODE]`).
fn holds(proc_root: &Path, pid: i32, wanted: &str) -> bool {
    std::fs::read_dir(proc_root.join(pid.to_string()).join("fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == wanted))
}

/// Why a TCP client of a daemon listener must be refused, or None to serve
/// it. `peer` is the client's address and `local` the connection's own
/// (the accepted socket's, never a wildcard listening address). Decided,
/// failing closed:
/// - a client from another host is no bundle of this one: served;
/// - a local client whose socket is not in the daemon's `/proc/net/tcp`
///   cannot be identified: refused;
/// - a socket of a bundle uid (`uid_range`, `[sandbox] user`): refused;
/// - a socket of the uid bundles share with a daemon that is not root
///   (`allow_same_uid`): served only if every process holding it is found,
///   none descends from the daemon, and each still holds it after its line
///   was read (so a pid reused meanwhile is not taken for it).
pub fn tcp_refusal(
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
    sandbox: &SandboxSettings,
) -> Option<String> {
    let euid = nix::unistd::geteuid().as_raw();
    // A root daemon's bundles never run as root (own uids, no_new_privs).
    let shared_uid = (euid != 0).then_some(euid);
    tcp_refusal_in(Path::new("/proc"), peer, local, sandbox, shared_uid)
}

fn tcp_refusal_in(
    proc_root: &Path,
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
    sandbox: &SandboxSettings,
    shared_uid: Option<u32>,
) -> Option<String> {
    // A dual-stack listener sees IPv4 clients as mapped IPv6 addresses; their
    // sockets are in /proc/net/tcp under the IPv4 ones.
    let canonical =
        |a: std::net::SocketAddr| std::net::SocketAddr::new(a.ip().to_canonical(), a.port());
    let (peer, local) = (canonical(peer), canonical(local));
    if !is_local(peer.ip()) {
        return None;
    }
    let Some((uid, inode)) = tcp_owner(proc_root, peer, local) else {
        return Some(format!(
            "{peer} is a local client whose socket is not in the daemon's /proc/net/tcp, so it cannot be told apart from a bundle"
        ));
    };
    // A socket its process closed and the daemon's side too (TIME_WAIT)
    // is no one's: the kernel names it uid 0, inode 0, which would pass
    // for root's.
    if inode == 0 {
        return Some(format!(
            "{peer} was closed by its process before it could be identified, so it cannot be told apart from a bundle"
        ));
    }
    if let Some(why) = bundle_identity(uid, uid, sandbox) {
        return Some(format!(
            "{peer} (uid {uid}) is {why}; bundles may not use the daemon's listeners"
        ));
    }
    if shared_uid != Some(uid) {
        return None;
    }
    let me = std::process::id() as i32;
    let wanted = format!("socket:[{inode}]");
    let found = holders(proc_root, uid, inode);
    if found.is_empty() {
        return Some(format!(
            "{peer} (uid {uid}, which bundles run as) is held by no process the daemon can see, so it cannot be told apart from a bundle"
        ));
    }
    for pid in found {
        match lineage(proc_root, pid, me) {
            Lineage::Apart if holds(proc_root, pid, &wanted) => {}
            Lineage::Descends => {
                return Some(format!(
                    "{peer} is held by a process of a bundle (it descends from the daemon)"
                ))
            }
            Lineage::Apart | Lineage::Unknown => {
                return Some(format!(
                    "{peer} (uid {uid}, which bundles run as): a process holding it exited before it could be identified"
                ))
            }
        }
    }
    None
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

    /// The peer of a unix connection from a `python3` child that runs
    /// `then` after connecting, as the daemon sees it on accept.
    fn peer_of_child(then: &str) -> (std::process::Child, PeerProcess, u32) {
        use std::os::fd::AsFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let script = format!(
            "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.connect({path:?})\n{then}"
        );
        let child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let (stream, _) = listener.accept().unwrap();
        let cred =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .unwrap();
        let uid = cred.uid();
        (child, PeerProcess::of(stream.as_fd(), cred.pid()), uid)
    }

    #[test]
    fn a_child_and_a_grandchild_descend_from_this_process_and_init_does_not() {
        let me = std::process::id() as i32;
        let (mut child, line) = first_line("sh", &["-c", "sleep 30 & echo $!; wait"]);
        let grandchild: i32 = line.parse().unwrap();
        let proc_root = Path::new("/proc");
        assert_eq!(lineage(proc_root, child.id() as i32, me), Lineage::Descends);
        assert_eq!(lineage(proc_root, grandchild, me), Lineage::Descends);
        assert_eq!(lineage(proc_root, 1, me), Lineage::Apart);
        assert_eq!(lineage(proc_root, me, grandchild), Lineage::Apart);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.kill();
        let _ = child.wait();
        // A process that is gone cannot be placed.
        assert_eq!(lineage(proc_root, child.id() as i32, me), Lineage::Unknown);
    }

    #[test]
    fn bundle_uids_are_refused_even_when_listed() {
        use std::os::fd::AsFd;
        let sandbox = SandboxSettings::default();
        let control: ControlSettings = toml::from_str("").unwrap();
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let this = PeerProcess::of(ours.as_fd(), std::process::id() as i32);
        let first = sandbox.uid_range.first;
        let why = refusal(first, first, Some(&this), &control, &sandbox).unwrap();
        assert!(why.contains("uid_range"), "{why}");
        // The test process itself is no bundle: its own uid is admitted.
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(refusal(me, me, Some(&this), &control, &sandbox), None);
        // ... but a descendant of the daemon (here: of this process) is not.
        let (mut child, process, uid) = peer_of_child("time.sleep(30)");
        let why = refusal(uid, uid, Some(&process), &control, &sandbox).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(why.contains("descends from the daemon"), "{why}");
    }

    /// Issue 30, finding 2: a bundle's child connects and exits at once,
    /// and is reaped before the daemon looks; its `/proc` entry is gone. It
    /// used to be admitted (nothing said it descends from the daemon).
    #[test]
    fn a_peer_that_connected_and_was_reaped_before_the_check_is_refused() {
        let control: ControlSettings = toml::from_str("").unwrap();
        let sandbox = SandboxSettings::default();
        let (mut child, process, uid) = peer_of_child("");
        assert!(child.wait().unwrap().success());
        let why = refusal(uid, uid, Some(&process), &control, &sandbox)
            .expect("a peer that cannot be identified is refused");
        assert!(
            why.contains("exited before it could be identified"),
            "{why}"
        );
        assert!(refusal(uid, uid, None, &control, &sandbox).is_some());
    }

    #[test]
    fn only_local_addresses_can_be_bundles() {
        assert!(is_local("127.0.0.1".parse().unwrap()));
        assert!(is_local("::1".parse().unwrap()));
        assert!(is_local("::ffff:127.0.0.5".parse().unwrap()));
        assert!(!is_local("192.0.2.7".parse().unwrap()));
        assert!(!is_local("2001:db8::7".parse().unwrap()));
    }

    #[test]
    fn the_kernels_socket_lookup_agrees_with_proc_net_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(ours).unwrap();
        let peer = client.local_addr().unwrap();
        let found = sock_diag::owner(peer, ours).expect("sock_diag answers");
        // The same socket /proc/net/tcp names (read through another root
        // path, so tcp_owner does not ask the kernel).
        let by_proc = tcp_owner(Path::new("/proc/self/.."), peer, ours);
        assert_eq!(found, by_proc);
        let (uid, inode) = found.unwrap();
        assert_eq!(uid, nix::unistd::geteuid().as_raw());
        assert!(inode > 0);
        // The listener's side and the wildcard are not the client's socket.
        let wildcard = std::net::SocketAddr::from(([0, 0, 0, 0], ours.port()));
        assert_eq!(sock_diag::owner(peer, wildcard), None);
        assert_eq!(tcp_owner(Path::new("/proc"), peer, wildcard), None);
        // No such socket: the kernel's ENOENT leaves it to /proc.
        let gone = std::net::SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(sock_diag::owner(gone, ours), None);
        assert_eq!(tcp_owner(Path::new("/proc"), gone, ours), None);
        let v6 = std::net::SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], 1));
        assert_eq!(sock_diag::owner(v6, ours), Some(None));
    }

    /// A client that closes first, once the daemon's side closes too, is
    /// left in TIME_WAIT: a socket of no process, which the kernel and
    /// /proc both call uid 0, inode 0. It was served as root's, so a
    /// bundle could send a request and close at once.
    #[test]
    fn a_client_closed_before_it_is_identified_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(ours).unwrap();
        let peer = client.local_addr().unwrap();
        let (accepted, _) = listener.accept().unwrap();
        drop(client);
        // The daemon's side reads the client's end, then closes.
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut &accepted, &mut rest).unwrap();
        drop(accepted);
        let sandbox = SandboxSettings::default();
        for proc_root in [Path::new("/proc"), Path::new("/proc/self/..")] {
            let why = tcp_refusal_in(proc_root, peer, ours, &sandbox, None)
                .expect("a closed client is refused");
            assert!(
                why.contains("closed by its process") || why.contains("not in the daemon's"),
                "{why}"
            );
        }
    }

    #[test]
    fn a_tcp_client_is_found_in_proc_net_tcp_and_a_child_holding_it_is_refused() {
        let proc_root = Path::new("/proc");
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let ours = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let sandbox = SandboxSettings::default();
        let me = Some(nix::unistd::geteuid().as_raw());
        // This process's own client socket: its uid, not a descendant's.
        let client = std::net::TcpStream::connect(ours).unwrap();
        let peer = client.local_addr().unwrap();
        let (uid, inode) = tcp_owner(proc_root, peer, ours).unwrap();
        assert_eq!(Some(uid), me);
        assert!(inode > 0);
        assert_eq!(tcp_refusal_in(proc_root, peer, ours, &sandbox, me), None);
        // Finding 5: looked up against the wildcard it listens on, the
        // client is not found, and is refused (it used to be served).
        let wildcard = listener.local_addr().unwrap();
        let why = tcp_refusal_in(proc_root, peer, wildcard, &sandbox, me).unwrap();
        assert!(why.contains("cannot be told apart"), "{why}");
        // A client from another host is no process here.
        let remote = std::net::SocketAddr::from(([192, 0, 2, 7], 40000));
        assert_eq!(tcp_refusal_in(proc_root, remote, ours, &sandbox, me), None);
        // A child that connects: refused as a descendant.
        let script = format!(
            "import socket,sys,time\ns=socket.create_connection(('127.0.0.1',{port}))\nprint(s.getsockname()[1],flush=True)\ntime.sleep(30)"
        );
        let (mut child, line) = first_line("/usr/bin/python3", &["-c", &script]);
        let child_peer = std::net::SocketAddr::from(([127, 0, 0, 1], line.parse().unwrap()));
        let why = tcp_refusal_in(proc_root, child_peer, ours, &sandbox, me);
        let _ = child.kill();
        let _ = child.wait();
        assert!(why.is_some_and(|w| w.contains("descends from the daemon")));
        // Finding 2's race over TCP: the child that connected is gone (its
        // socket held by nobody): refused, not served.
        let why = tcp_refusal_in(proc_root, child_peer, ours, &sandbox, me).unwrap();
        assert!(
            why.contains("cannot be told apart") || why.contains("no process"),
            "{why}"
        );
    }

    /// A dual-stack listener sees an IPv4 client as a mapped IPv6 address;
    /// its socket is found under the IPv4 ones (it used to be refused).
    #[test]
    fn an_ipv4_client_of_a_dual_stack_listener_is_found() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        assert!(peer.is_ipv6() && local.is_ipv6(), "{peer} {local}");
        let me = Some(nix::unistd::geteuid().as_raw());
        let sandbox = SandboxSettings::default();
        assert_eq!(
            tcp_refusal_in(Path::new("/proc"), peer, local, &sandbox, me),
            None
        );
    }
}
