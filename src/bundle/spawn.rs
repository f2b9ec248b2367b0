//! Starting a bundle's process without copying the daemon (issue 22).
//!
//! A `fork` copies the forking process's page tables and makes every page
//! of it copy-on-write, and the child's `exec` then tears that copy down:
//! the cost of a start grew with the daemon's memory, so with the number of
//! bundles — a boot of 2,000 took 25 times a boot of 200, and a crash
//! restart with 2,000 running was six times slower than with 50
//! (docs/scaling.md).
//!
//! So the daemon starts a bundle the way `posix_spawn` does:
//! `clone(CLONE_VM | CLONE_VFORK)`. The child shares the daemon's memory
//! (nothing is copied) while the spawning thread waits, confines itself
//! exactly as the old `pre_exec` did — session, cgroup, stdio, uid and
//! gid, parent-death signal, rlimits, `no_new_privs`, Landlock — and execs
//! the bundle. Everything it uses is prepared before the clone: the child
//! allocates nothing and calls nothing but system calls, which is what
//! makes running in the daemon's memory sound (other daemon threads go
//! on, and may hold the allocator's locks). The uid and gid change with the
//! raw system calls: glibc's wrappers would broadcast the change to the
//! daemon's other threads.
//!
//! Every descriptor of the daemon is close-on-exec; the child gets its
//! stdio with `dup2`, and a failed step writes its errno and name to a
//! close-on-exec report pipe before `_exit(127)`, so `spawn` fails as it
//! did with `fork`.
//!
//! Nor does the child copy the daemon's descriptor table: with 2,000
//! bundles the daemon holds 12,000 descriptors, and a child that copied
//! them and closed each one (the kernel flushes every file it closes)
//! spent 1.5 ms of every restart on it. The daemon reserves a block of
//! low descriptor numbers at start ([`reserve_slots`]); a start puts what
//! its child keeps there, the child shares the daemon's table
//! (`CLONE_FILES`) and takes a table of its own holding only the numbers
//! below the block's end (`close_range` with `CLOSE_RANGE_UNSHARE`, which
//! copies no more than that). Without the block (a process that did not
//! reserve it, valgrind, a `close_range` filtered or its unsharing
//! refused, a start already using it) the child copies the table and
//! closes what it does not keep, as before.

use std::ffi::{CString, OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use tokio::io::unix::AsyncFd;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use super::sandbox::Rlimits;

/// What a bundle process is started with.
pub struct Launch<'a> {
    pub program: &'a OsStr,
    pub args: &'a [String],
    pub env: &'a [(OsString, OsString)],
    pub cwd: &'a Path,
    /// (uid, gid) to run as; None: the daemon's own.
    pub user: Option<(u32, u32)>,
    pub limits: Rlimits,
    pub ruleset: Option<&'a OwnedFd>,
    /// cgroup.procs files to join (opened by the daemon, which may write them).
    pub cgroups: &'a [OwnedFd],
    /// Given to the bundle as its descriptor 3 (the host-resources channel).
    pub fd3: Option<&'a OwnedFd>,
}

/// The descriptor number a bundle gets [`Launch::fd3`] as.
pub const CHANNEL_FD: RawFd = 3;

/// The first of the reserved descriptor numbers (above the bundle's own
/// 0 to 3, and above what a process inherits and opens before it
/// reserves them).
const SLOTS_FROM: RawFd = 64;

/// How many: more than a start ever keeps (stdio, the report pipe, the
/// host channel, four cgroups, the Landlock ruleset).
const SLOTS: usize = 16;

/// The reserved block: `/dev/null` in each slot while no start uses it.
struct Slots {
    null: OwnedFd,
    in_use: std::sync::Mutex<()>,
}

static RESERVED: std::sync::OnceLock<Slots> = std::sync::OnceLock::new();

/// Set when a child could not take a table of its own (a system-call
/// filter that allows `close_range` but not its unsharing, say): starts
/// copy the table from then on.
static UNSHARE_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What the child reports when it could not take a table of its own.
const OWN_TABLE: &str = "a descriptor table of its own";

/// Reserves the block of low descriptor numbers a start hands its child
/// (see the module's doc). Call it first thing, before the process opens
/// many files; a number already taken leaves the block unreserved, and
/// starts copy the table as before. Whether the block is reserved.
pub fn reserve_slots() -> bool {
    use nix::libc;
    if RESERVED.get().is_some() {
        return true;
    }
    // Valgrind (make bench-callgrind) ends a program that clones with a
    // shared table; it preloads its own library into the one it runs.
    let valgrind = std::env::var_os("LD_PRELOAD")
        .is_some_and(|p| p.as_encoded_bytes().windows(9).any(|w| w == b"vgpreload"));
    // A process whose `close_range` is filtered (an old container
    // profile) starts the old way.
    // SAFETY: closes nothing (no descriptor has that number).
    let closes = unsafe { libc::syscall(libc::SYS_close_range, u32::MAX, u32::MAX, 0) } == 0;
    if valgrind || !closes {
        return false;
    }
    let Ok(null) = std::fs::File::open("/dev/null").map(OwnedFd::from) else {
        return false;
    };
    let mut made = Vec::new();
    for slot in SLOTS_FROM..SLOTS_FROM + SLOTS as RawFd {
        // SAFETY: fcntl on a number (is it open?), dup3 onto one that is
        // not: no descriptor of anyone else's is touched.
        let free = unsafe { libc::fcntl(slot, libc::F_GETFD) } < 0;
        if !free || unsafe { libc::dup3(null.as_raw_fd(), slot, libc::O_CLOEXEC) } != slot {
            for fd in made {
                // SAFETY: a placeholder made just now.
                unsafe { libc::close(fd) };
            }
            return false;
        }
        made.push(slot);
    }
    let _ = RESERVED.set(Slots {
        null,
        in_use: std::sync::Mutex::new(()),
    });
    true
}

/// What a start keeps, in the reserved block for the time of the clone:
/// placeholders again when dropped.
struct Borrowed<'a> {
    slots: &'a Slots,
    _held: std::sync::MutexGuard<'a, ()>,
    used: usize,
}

impl Borrowed<'_> {
    /// `keep` (sorted) into the block, in order: None when the block is
    /// not reserved or in use, or a copy fails.
    fn take(keep: &[RawFd]) -> Option<Borrowed<'static>> {
        let slots = RESERVED.get()?;
        let refused = UNSHARE_REFUSED.load(std::sync::atomic::Ordering::Relaxed);
        if keep.len() > SLOTS || refused {
            return None;
        }
        let held = slots.in_use.try_lock().ok()?;
        let mut borrowed = Borrowed {
            slots,
            _held: held,
            used: 0,
        };
        for fd in keep {
            let slot = SLOTS_FROM + borrowed.used as RawFd;
            // SAFETY: a copy of the start's own descriptor onto a slot of
            // the block this start holds.
            if unsafe { nix::libc::dup3(*fd, slot, nix::libc::O_CLOEXEC) } != slot {
                return None;
            }
            borrowed.used += 1;
        }
        Some(borrowed)
    }

    /// Where descriptor `fd` (one of those kept, or 0 to 2) is in the block.
    fn slot_of(keep: &[RawFd], fd: RawFd) -> RawFd {
        keep.iter()
            .position(|k| *k == fd)
            .map_or(fd, |i| SLOTS_FROM + i as RawFd)
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        for slot in SLOTS_FROM..SLOTS_FROM + self.used as RawFd {
            // SAFETY: the placeholder back in a slot of the block this
            // start holds (the copy there is dropped).
            unsafe { nix::libc::dup3(self.slots.null.as_raw_fd(), slot, nix::libc::O_CLOEXEC) };
        }
    }
}

/// A spawned bundle process: its pid and a way to wait for its exit.
pub struct Process {
    pub pid: u32,
    exit: Exit,
    status: Option<std::process::ExitStatus>,
}

enum Exit {
    /// Readable once the process has exited (Linux 5.3 and later).
    Pidfd(AsyncFd<OwnedFd>),
    /// Where pidfds are unknown (an older kernel, valgrind): a thread
    /// blocked in `waitpid` sends the raw status.
    Thread(tokio::sync::oneshot::Receiver<i32>),
}

impl Process {
    fn new(pid: u32) -> std::io::Result<Process> {
        let exit = match pidfd_open(pid) {
            // SAFETY: the pidfd is owned by the AsyncFd, which keeps it
            // open for as long as it is registered.
            Ok(fd) => Exit::Pidfd(unsafe {
                AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)?
            }),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSYS) => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                std::thread::Builder::new()
                    .name("bundle-wait".into())
                    .spawn(move || {
                        let _ = tx.send(reap(pid));
                    })?;
                Exit::Thread(rx)
            }
            Err(e) => return Err(e),
        };
        Ok(Process {
            pid,
            exit,
            status: None,
        })
    }

    /// Waits for the process to exit and reaps it (again: its status).
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let raw = match &mut self.exit {
            Exit::Pidfd(pidfd) => loop {
                let mut ready = pidfd.readable().await?;
                let mut raw = 0;
                // SAFETY: waitpid writes the status into `raw`.
                match unsafe { nix::libc::waitpid(self.pid as i32, &mut raw, nix::libc::WNOHANG) } {
                    0 => ready.clear_ready(),
                    r if r > 0 => break raw,
                    _ => return Err(std::io::Error::last_os_error()),
                }
            },
            // Polled in place: a wait dropped half-way (a stop) loses nothing.
            Exit::Thread(rx) => rx
                .await
                .map_err(|_| std::io::Error::other("the waiting thread ended"))?,
        };
        let status = std::process::ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(status)
    }
}

fn cstring(bytes: &[u8]) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a command, argument or variable contains a NUL byte",
        )
    })
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// What the child needs, all of it ready before the clone.
struct ChildPlan {
    stdio: [RawFd; 3],
    fd3: Option<RawFd>,
    report: RawFd,
    cgroups: Vec<RawFd>,
    ruleset: Option<RawFd>,
    cwd: CString,
    user: Option<(u32, u32)>,
    limits: Rlimits,
    daemon: nix::libc::pid_t,
    /// The descriptors above 2 the child keeps until its exec, sorted; it
    /// closes every other one first thing.
    keep: Vec<RawFd>,
    /// Kept in the reserved block, below this: the child shares the
    /// daemon's table and takes its own of the numbers below it.
    shared_below: Option<RawFd>,
    /// Without `close_range` (kernels before 5.9): closed one by one up to
    /// this (the open-files limit).
    fd_ceiling: RawFd,
    /// fault-injection `stall_start`: the child stops itself before it
    /// joins its cgroup (as a slow join would hold it there).
    stall: bool,
    /// Where to exec: the program, or each `PATH` candidate for a bare name.
    candidates: Vec<CString>,
    argv: Vec<*const nix::libc::c_char>,
    envp: Vec<*const nix::libc::c_char>,
}

/// The `PATH` candidates of a bare program name, from the bundle's own
/// environment (what `execvp` would try).
fn candidates(program: &OsStr, env: &[(OsString, OsString)]) -> std::io::Result<Vec<CString>> {
    if program.as_bytes().contains(&b'/') {
        return Ok(vec![cstring(program.as_bytes())?]);
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or_else(
        || OsString::from("/usr/local/bin:/usr/bin:/bin"),
        |(_, v)| v.clone(),
    );
    std::env::split_paths(&path)
        .map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                ".".into()
            } else {
                dir
            };
            cstring(dir.join(program).as_os_str().as_bytes())
        })
        .collect()
}

/// Starts the bundle. Must be called from a long-lived runtime thread (the
/// parent-death signal follows the thread that spawned).
pub fn spawn(launch: &Launch) -> std::io::Result<(Process, ChildStdin, ChildStdout, ChildStderr)> {
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (report_r, report_w) = pipe()?;
    if let Some((uid, gid)) = launch.user {
        // Its stdin and stdout pipes become the bundle user's: a pipe made
        // by the daemon is the daemon's, and the bundle could not reopen
        // its own stdio through /proc/self/fd to poll it.
        for fd in [&stdin_r, &stdout_w] {
            nix::unistd::fchown(fd, Some(uid.into()), Some(gid.into()))?;
        }
    }
    let mut argv_c = vec![cstring(launch.program.as_bytes())?];
    for arg in launch.args {
        argv_c.push(cstring(arg.as_bytes())?);
    }
    let envp_c: Vec<CString> = launch
        .env
        .iter()
        .map(|(k, v)| {
            let mut pair = k.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(v.as_bytes());
            cstring(&pair)
        })
        .collect::<Result<_, _>>()?;
    let null_terminated = |strings: &[CString]| {
        let mut v: Vec<*const nix::libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        v.push(std::ptr::null());
        v
    };
    // The child's dup2 onto 3 would close whatever else it had there (the
    // daemon opens its own long-lived files at start, so pipes made now do
    // not get 3; said, should that change).
    let in_use = [report_w.as_raw_fd()]
        .into_iter()
        .chain(launch.cgroups.iter().map(AsRawFd::as_raw_fd))
        .chain(launch.ruleset.map(AsRawFd::as_raw_fd));
    if launch.fd3.is_some() && in_use.into_iter().any(|fd| fd == CHANNEL_FD) {
        return Err(std::io::Error::other(
            "descriptor 3, which the bundle gets its host channel as, is one the start needs",
        ));
    }
    let mut keep: Vec<RawFd> = [
        stdin_r.as_raw_fd(),
        stdout_w.as_raw_fd(),
        stderr_w.as_raw_fd(),
        report_w.as_raw_fd(),
    ]
    .into_iter()
    .chain(launch.fd3.map(AsRawFd::as_raw_fd))
    .chain(launch.cgroups.iter().map(AsRawFd::as_raw_fd))
    .chain(launch.ruleset.map(AsRawFd::as_raw_fd))
    .filter(|fd| *fd > 2)
    .collect();
    keep.sort_unstable();
    keep.dedup();
    // In the reserved block if it is free: the child then copies no more
    // of the daemon's table than the block's numbers.
    let borrowed = Borrowed::take(&keep);
    let at = |fd: RawFd| match &borrowed {
        Some(_) => Borrowed::slot_of(&keep, fd),
        None => fd,
    };
    let shared_below = borrowed.as_ref().map(|b| SLOTS_FROM + b.used as RawFd);
    let fd_ceiling = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1 << 20, |(soft, _)| soft.min(1 << 20) as RawFd);
    let plan = ChildPlan {
        keep: keep.iter().map(|fd| at(*fd)).collect(),
        shared_below,
        fd_ceiling,
        stall: cfg!(feature = "fault-injection")
            && std::env::var_os("BUNDLEVISOR_FAULT").is_some_and(|v| v == "stall_start"),
        stdio: [
            at(stdin_r.as_raw_fd()),
            at(stdout_w.as_raw_fd()),
            at(stderr_w.as_raw_fd()),
        ],
        fd3: launch.fd3.map(|fd| at(fd.as_raw_fd())),
        report: at(report_w.as_raw_fd()),
        cgroups: launch.cgroups.iter().map(|fd| at(fd.as_raw_fd())).collect(),
        ruleset: launch.ruleset.map(|fd| at(fd.as_raw_fd())),
        cwd: cstring(launch.cwd.as_os_str().as_bytes())?,
        user: launch.user,
        limits: launch.limits,
        daemon: std::process::id() as nix::libc::pid_t,
        candidates: candidates(launch.program, launch.env)?,
        argv: null_terminated(&argv_c),
        envp: null_terminated(&envp_c),
    };
    // The daemon's ends, ready before there is a process to leak.
    let stdin = ChildStdin::from_std(std::process::ChildStdin::from(stdin_w))?;
    let stdout = ChildStdout::from_std(std::process::ChildStdout::from(stdout_r))?;
    let stderr = ChildStderr::from_std(std::process::ChildStderr::from(stderr_r))?;
    let mut stack = vec![0u8; CHILD_STACK];
    let pid = clone_child(&plan, &mut stack);
    // The child has its own table now (it exec'd, or ended): the block's
    // copies go, then the daemon's ends of the child's.
    drop(borrowed);
    let pid = pid?;
    drop(stack);
    drop((stdin_r, stdout_w, stderr_w, report_w));
    // The child's report: nothing (it exec'd the bundle), or why not.
    let mut report = Vec::new();
    let read = std::fs::File::from(report_r).read_to_end(&mut report);
    if read.is_err() || !report.is_empty() {
        // Reaped here: nothing else waits for a process that never ran.
        reap(pid as u32);
        let own_table = report.get(4..) == Some(OWN_TABLE.as_bytes());
        if shared_below.is_some() && own_table {
            tracing::warn!("a bundle's start could not take a descriptor table of its own; starts copy the daemon's from now on");
            UNSHARE_REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
            return spawn(launch);
        }
        return Err(match read {
            Err(e) => e,
            Ok(_) => failure(&report),
        });
    }
    match Process::new(pid as u32) {
        Ok(process) => Ok((process, stdin, stdout, stderr)),
        Err(e) => {
            // Nothing could wait for it: it does not run on.
            // SAFETY: a signal to the child just spawned.
            unsafe { nix::libc::kill(pid, nix::libc::SIGKILL) };
            reap(pid as u32);
            Err(e)
        }
    }
}

/// The child's stack (it calls nothing deep: system calls and `execve`).
const CHILD_STACK: usize = 64 << 10;

/// Clones the child with every signal blocked (so that none of the
/// daemon's handlers runs in it), then restores this thread's mask.
fn clone_child(plan: &ChildPlan, stack: &mut [u8]) -> std::io::Result<nix::libc::pid_t> {
    use nix::libc;
    // SAFETY: sigset and mask calls on this thread's own state; `clone`
    // with CLONE_VFORK returns once the child has exec'd or exited, so the
    // plan and the stack it uses outlive it.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        // The stack grows down; its top, 16-byte aligned.
        let top = (stack.as_mut_ptr().add(stack.len()) as usize) & !15;
        let shared = match plan.shared_below {
            Some(_) => libc::CLONE_FILES,
            None => 0,
        };
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | shared | libc::SIGCHLD,
            plan as *const ChildPlan as *mut libc::c_void,
        );
        let mut cloned = std::io::Error::last_os_error();
        // Valgrind (make bench-callgrind) knows no such clone: a fork,
        // whose child runs the same steps on its own copy.
        let pid = match cloned.raw_os_error() {
            Some(libc::ENOSYS | libc::EINVAL) if pid < 0 => {
                let forked = libc::fork();
                if forked == 0 {
                    child_main(plan as *const ChildPlan as *mut libc::c_void);
                }
                cloned = std::io::Error::last_os_error();
                forked
            }
            _ => pid,
        };
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(cloned);
        }
        Ok(pid)
    }
}

/// The child, in the daemon's memory: system calls only, then exec.
extern "C" fn child_main(arg: *mut nix::libc::c_void) -> nix::libc::c_int {
    // SAFETY: `arg` is the plan `clone_child` passed, alive until the exec.
    let plan = unsafe { &*(arg as *const ChildPlan) };
    let Err((step, errno)) = confine_and_exec(plan);
    let bytes = errno.to_ne_bytes();
    // SAFETY: writes to the report pipe and exits; a lost report leaves
    // the exit code.
    unsafe {
        nix::libc::write(plan.report, bytes.as_ptr().cast(), bytes.len());
        nix::libc::write(plan.report, step.as_ptr().cast(), step.len());
        nix::libc::_exit(127)
    }
}

type Step = (&'static str, i32);

fn errno(step: &'static str) -> Step {
    // Read from the thread's errno (which the child shares): no allocation.
    (step, nix::errno::Errno::last_raw())
}

fn confine_and_exec(plan: &ChildPlan) -> Result<std::convert::Infallible, Step> {
    use nix::libc;
    // SAFETY: plain system calls on this (child) process's own state, in
    // the order the old pre_exec made them.
    unsafe {
        // A table of its own first, when it shares the daemon's: only the
        // numbers below the reserved block's end are copied into it.
        if let Some(end) = plan.shared_below {
            const CLOSE_RANGE_UNSHARE: libc::c_uint = 1 << 1;
            let own = libc::syscall(
                libc::SYS_close_range,
                end as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_UNSHARE,
            );
            // Before Linux 5.9: a copy of the whole table.
            if own != 0 && libc::unshare(libc::CLONE_FILES) != 0 {
                return Err(errno(OWN_TABLE));
            }
        }
        // Every daemon descriptor the bundle does not need goes now, not at
        // the exec: the state dir's lock, the listeners and the reaper's
        // pipe would otherwise outlive a daemon killed while this child
        // joins its cgroup, and refuse the daemon started next.
        let mut first: libc::c_uint = 3;
        for next in plan
            .keep
            .iter()
            .map(|fd| *fd as libc::c_uint)
            .chain([libc::c_uint::MAX])
        {
            if next > first {
                let last = next - 1;
                if libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) != 0 {
                    for fd in first..=last.min(plan.fd_ceiling as libc::c_uint) {
                        libc::close(fd as RawFd);
                    }
                }
            }
            first = next.saturating_add(1);
        }
        // Dies with the daemon from here (armed again after the uid change,
        // which clears it).
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != plan.daemon {
            libc::_exit(1);
        }
        // The daemon's handlers are not this process's: default for all
        // (this also undoes the daemon's ignored SIGPIPE), then unblocked.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..65 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        // The clone blocked them all: the bundle starts with none blocked.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            return Err(("signal mask", libc::EINVAL));
        }
        for (i, fd) in plan.stdio.iter().enumerate() {
            let target = i as RawFd;
            // dup2 onto itself would leave it close-on-exec.
            let done = if *fd == target {
                libc::fcntl(target, libc::F_SETFD, 0)
            } else {
                libc::dup2(*fd, target)
            };
            if done < 0 {
                return Err(errno("stdio"));
            }
        }
        if let Some(fd) = plan.fd3 {
            let done = if fd == CHANNEL_FD {
                libc::fcntl(CHANNEL_FD, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, CHANNEL_FD)
            };
            if done < 0 {
                return Err(errno("host channel"));
            }
        }
        if libc::setsid() < 0 {
            return Err(errno("setsid"));
        }
        if plan.stall {
            libc::kill(libc::getpid(), libc::SIGSTOP);
        }
        // Into the bundle's cgroup before anything of it runs: every
        // descendant, setsid or not, is in it from here on.
        for fd in &plan.cgroups {
            if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(errno("join the cgroup"));
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            return Err(errno("chdir"));
        }
        if let Some((uid, gid)) = plan.user {
            // The raw calls: this process only, not the daemon's threads.
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, gid) != 0
                || libc::syscall(libc::SYS_setuid, uid) != 0
            {
                return Err(errno("drop to the bundle's user"));
            }
        }
        // After the uid change, which would clear it.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(errno("parent-death signal"));
        }
        // The daemon may have died before the signal was set.
        if libc::getppid() != plan.daemon {
            libc::_exit(1);
        }
    }
    let ruleset = plan.ruleset.map(|fd| {
        // SAFETY: the daemon's ruleset descriptor, borrowed for the call;
        // never closed here (ManuallyDrop).
        std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) })
    });
    super::sandbox::apply_in_child(&plan.limits, ruleset.as_deref()).map_err(|e| {
        (
            "confine (rlimits, no_new_privs, Landlock)",
            e.raw_os_error().unwrap_or(0),
        )
    })?;
    // As execvp: the first candidate that runs; a refusal other than
    // "not there" is the one reported.
    let mut reported: Step = ("exec", libc::ENOENT);
    for candidate in &plan.candidates {
        // SAFETY: NUL-terminated arrays of C strings that outlive the call.
        unsafe { libc::execve(candidate.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr()) };
        let failed = errno("exec");
        if failed.1 != libc::ENOENT && failed.1 != libc::ENOTDIR {
            reported = failed;
        }
    }
    Err(reported)
}

/// Waits for `pid` to exit (blocking) and returns its raw status.
fn reap(pid: u32) -> i32 {
    let mut raw = 0;
    // SAFETY: waitpid writes the status into `raw`.
    while unsafe { nix::libc::waitpid(pid as i32, &mut raw, 0) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
    raw
}

pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, returns a new descriptor.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as i32, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor pidfd_open just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The error the child reported: 4 bytes of errno, then the step.
fn failure(report: &[u8]) -> std::io::Error {
    let Some((errno, step)) = report.split_first_chunk::<4>() else {
        return std::io::Error::other("the bundle's process ended before it started");
    };
    let source = std::io::Error::from_raw_os_error(i32::from_ne_bytes(*errno));
    let step = String::from_utf8_lossy(step);
    if step == "exec" {
        source
    } else {
        std::io::Error::new(source.kind(), format!("{step}: {source}"))
    }
}
