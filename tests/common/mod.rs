//! Test harness: runs the real `bundlevisor` binary as a daemon in a temp
//! dir of its own (state, socket, bundles), drives it with the real CLI, and
//! finds bundle processes through /proc.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_bundlevisor");
pub const DEMO_BIN: &str = env!("CARGO_BIN_EXE_bundlevisor-demo");
pub const DEMO_MANIFEST: &str = include_str!("../../bundles/demo/manifest.json");
/// How many tools the demo bundle lists (bundles/demo/src/main.rs).
pub const DEMO_TOOLS: usize = 13;

/// A loopback port the kernel picked, then freed for a daemon to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on a loopback port with `Connection: close`: the whole answer.
pub fn http_get(port: u16, path: &str) -> String {
    http_get_at(("127.0.0.1", port), path)
}

/// `GET path` from `addr`: the whole response, head and body.
pub fn http_get_at(addr: impl std::net::ToSocketAddrs, path: &str) -> String {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

/// Gives the daemon's folder to `uid`, as an operator gives a service user
/// its state.
pub fn chown_tree(path: &Path, uid: u32) {
    use std::os::unix::fs::MetadataExt;
    let id = Some(nix::unistd::Uid::from_raw(uid));
    let gid = Some(nix::unistd::Gid::from_raw(uid));
    // A hard link (the demo server placed in a bundle) shares its inode,
    // owner included, with the build's binary every other test links in:
    // it becomes a copy of its own first.
    let meta = std::fs::symlink_metadata(path).unwrap();
    if meta.is_file() && meta.nlink() > 1 {
        let copy = path.with_extension("copy");
        std::fs::copy(path, &copy).unwrap();
        std::fs::rename(&copy, path).unwrap();
    }
    nix::unistd::chown(path, id, gid).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for e in std::fs::read_dir(path).unwrap() {
            chown_tree(&e.unwrap().path(), uid);
        }
    }
}

/// Polls `check` every 10 ms until it returns Some, or panics after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    /// Extra environment of the daemon process.
    pub env: Vec<(String, String)>,
    /// Run the daemon and the CLI under this uid (and gid) instead of the
    /// test's own (needs root; the test chowns the folder).
    pub uid: Option<u32>,
    /// Start the daemon in this cgroup (v2 folder) instead of the test's.
    pub cgroup: Option<PathBuf>,
    /// The open-files limit (soft, hard) the daemon starts with.
    pub nofile: Option<(u64, u64)>,
    /// Start the daemon in a mount namespace of its own without this
    /// mount, as a container does not see the node's side of its volumes
    /// (needs root).
    pub unmounted: Option<PathBuf>,
    /// The `[sandbox] uid_range` written into its config: one of its own
    /// (see [`UidSlot`]), as each daemon on a host needs.
    pub uid_range: String,
    _uid_slot: UidSlot,
    child: Option<Child>,
}

/// A uid range no other test daemon on this host uses while this is held:
/// slot N (an `flock`ed file under the temp folder, held by this test
/// process) is uids `2100000000 + N·65536` and the 65,535 after. Test
/// daemons run in parallel (and in several test processes at once), and
/// a root daemon refuses a range another live daemon claimed.
pub struct UidSlot {
    _lock: nix::fcntl::Flock<std::fs::File>,
    pub range: String,
}

impl UidSlot {
    pub fn take() -> UidSlot {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join("bundlevisor-test-uid-slots");
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
        for slot in 0u32..30_000 {
            let Ok(file) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(slot.to_string()))
            else {
                continue;
            };
            if let Ok(lock) =
                nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            {
                let first = 2_100_000_000 + slot * 65_536;
                return UidSlot {
                    _lock: lock,
                    range: format!("{first}-{}", first + 65_535),
                };
            }
        }
        panic!("no free test uid slot in {}", dir.display());
    }
}

impl Daemon {
    /// A daemon with the given extra config (TOML placed before the
    /// harness's own `[bundles]` table), started and answering.
    pub fn start_with(extra: &str) -> Daemon {
        let mut d = Daemon::unlaunched(extra);
        d.launch();
        d
    }

    /// The same daemon's folder and config, not started yet (set `env`,
    /// then `launch`).
    pub fn unlaunched(extra: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        // Bundles run under uids of their own (root daemon): they must reach
        // their folders below this one, as under /opt or /srv.
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let config = root.join("bundlevisor.toml");
        // The test defaults of [bundles], in the caller's own table if it
        // has one (a table may be written once).
        let defaults = "stop_grace = \"2s\"\nstart_timeout = \"20s\"\n";
        let text = if extra.contains("[bundles]\n") {
            let extra = extra.replacen("[bundles]\n", &format!("[bundles]\n{defaults}"), 1);
            format!("state_dir = \"state\"\nsocket = \"run/bv.sock\"\n{extra}\n")
        } else {
            format!(
                "state_dir = \"state\"\nsocket = \"run/bv.sock\"\n{extra}\n[bundles]\n{defaults}"
            )
        };
        // Each daemon's own uid range, in the caller's [sandbox] table if it
        // has one.
        let slot = UidSlot::take();
        let line = format!("uid_range = \"{}\"\n", slot.range);
        let text = if text.contains("uid_range") {
            text
        } else if text.contains("[sandbox]\n") {
            text.replacen("[sandbox]\n", &format!("[sandbox]\n{line}"), 1)
        } else {
            format!("{text}\n[sandbox]\n{line}")
        };
        std::fs::write(&config, text).unwrap();
        std::fs::create_dir_all(root.join("bundles")).unwrap();
        Daemon {
            socket: root.join("run/bv.sock"),
            state: root.join("state"),
            config,
            dir,
            env: Vec::new(),
            uid: None,
            cgroup: None,
            nofile: None,
            unmounted: None,
            uid_range: slot.range.clone(),
            _uid_slot: slot,
            child: None,
        }
    }

    pub fn start() -> Daemon {
        Daemon::start_with("")
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    /// Starts the daemon process and waits until it answers `status`.
    pub fn launch(&mut self) {
        self.spawn_daemon();
        wait_for(Duration::from_secs(20), "the daemon to answer", || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited early ({status}):\n{}", self.log());
            }
            self.cli(&["status", "--json"])
                .status
                .success()
                .then_some(())
        });
    }

    /// Starts the daemon process and asks for `status` the moment its
    /// socket accepts a connection; returns that first answer.
    pub fn launch_first_status(&mut self) -> Value {
        self.spawn_daemon();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < deadline, "the daemon did not answer");
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("daemon exited early ({status}):\n{}", self.log());
            }
            if UnixStream::connect(&self.socket).is_ok() {
                let mut raw = self.raw();
                raw.hello();
                let r = raw.request(1, "status", json!({}));
                return r["result"].clone();
            }
            std::thread::yield_now();
        }
    }

    fn spawn_daemon(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root().join("daemon.log"))
            .unwrap();
        let mut cmd = Command::new(BIN);
        if let Some(uid) = self.uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        if let Some(cgroup) = &self.cgroup {
            // The daemon starts in this cgroup, as systemd starts a unit in its own.
            use std::os::unix::process::CommandExt;
            let procs =
                std::ffi::CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes())
                    .unwrap();
            // SAFETY: open, write and close are async-signal-safe; the
            // path was allocated before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let fd = nix::libc::open(procs.as_ptr(), nix::libc::O_WRONLY);
                    if fd < 0 || nix::libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    nix::libc::close(fd);
                    Ok(())
                });
            }
        }
        if let Some((soft, hard)) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = nix::libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: setrlimit is async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    if nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(path) = &self.unmounted {
            use std::os::unix::process::CommandExt;
            let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: unshare, mount and umount2 are system calls; the path
            // was allocated before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    use nix::libc;
                    let root = c"/";
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(
                            std::ptr::null(),
                            root.as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_SLAVE,
                            std::ptr::null(),
                        ) != 0
                        || libc::umount2(path.as_ptr(), libc::MNT_DETACH) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .args(["daemon", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "info,rmcp=warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root().join("daemon.log")).unwrap_or_default()
    }

    /// The CLI run as `uid` (its own gid, in `/`): an admitted user other
    /// than the daemon's (needs root).
    pub fn cli_as(&self, uid: u32, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        Command::new(BIN)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .uid(uid)
            .gid(uid)
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(BIN);
        if let Some(uid) = self.uid {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let out = cmd
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        // A tool's own result may carry what the bundle chose to return;
        // everything else the daemon says must never hold a secret.
        if args.first() != Some(&"call") {
            assert_no_canary(&format!("bundlevisor {args:?}"), &out.stdout);
            assert_no_canary(&format!("bundlevisor {args:?}"), &out.stderr);
        }
        out
    }

    /// Writes `bytes` as `NAME` in the test folder and puts it into the
    /// default workspace; returns the file id.
    pub fn put_file(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.root().join(name);
        std::fs::write(&path, bytes).unwrap();
        self.ok(&["files", "put", path.to_str().unwrap()])
            .trim()
            .to_string()
    }

    /// Runs the CLI with `input` on its stdin.
    pub fn cli_with_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = Command::new(BIN)
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_no_canary(&format!("bundlevisor {args:?}"), &out.stdout);
        assert_no_canary(&format!("bundlevisor {args:?}"), &out.stderr);
        out
    }

    /// Runs the CLI, asserts success, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "bundlevisor {args:?} failed ({}):\nstdout: {}\nstderr: {}\ndaemon log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn status(&self) -> Value {
        serde_json::from_str(&self.ok(&["status", "--json"])).unwrap()
    }

    /// The status entry of one bundle.
    pub fn bundle(&self, workspace: &str, name: &str) -> Option<Value> {
        self.status()["bundles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["workspace"] == workspace && b["name"] == name)
            .cloned()
    }

    pub fn wait_state(&self, workspace: &str, name: &str, state: &str) -> Value {
        wait_for(
            Duration::from_secs(20),
            &format!("{workspace}/{name} to be {state}"),
            || self.bundle(workspace, name).filter(|b| b["state"] == state),
        )
    }

    /// Sends a signal and waits for the daemon to exit.
    pub fn signal(&mut self, signal: nix::sys::signal::Signal) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit after {signal}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A copy of the demo bundle named `name` under `bundles/`.
    pub fn demo_bundle(&self, name: &str) -> PathBuf {
        demo_bundle_at(&self.root().join("bundles"), name)
    }

    /// Live processes whose working folder is inside this test's temp dir:
    /// bundle processes (their cwd is their bundle folder) and their children.
    pub fn bundle_processes(&self) -> Vec<u32> {
        processes_with_cwd_under(&self.root())
    }

    /// A raw connection to the control socket (no hello sent).
    /// `bundlevisor mcp ARGS` on this daemon, its stdin and stdout piped
    /// (an agent's end of the stdio gateway), killed when dropped. Call it
    /// inside a tokio runtime.
    pub fn spawn_mcp(&self, args: &[&str]) -> tokio::process::Child {
        self.mcp_command(args)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    /// The same, its debug log written to `log`.
    pub fn spawn_mcp_logged(&self, args: &[&str], log: &Path) -> tokio::process::Child {
        self.mcp_command(args)
            .env("RUST_LOG", "bundlevisor=debug")
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    }

    /// The same, with `env` added to its environment.
    pub fn spawn_mcp_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Child {
        let mut command = self.mcp_command(args);
        command.stderr(Stdio::piped());
        for (key, value) in env {
            command.env(key, value);
        }
        command.spawn().unwrap()
    }

    fn mcp_command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(BIN);
        command
            .arg("--socket")
            .arg(&self.socket)
            .arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    pub fn raw(&self) -> Raw {
        let stream = UnixStream::connect(&self.socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        Raw {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Every test run ends with a scan of everything the daemon wrote.
        if !std::thread::panicking() {
            assert_no_canary("the daemon log", self.log().as_bytes());
            let mut stack = vec![self.state.join("logs"), self.state.join("audit")];
            while let Some(dir) = stack.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        stack.push(path);
                    } else {
                        let bytes = std::fs::read(&path).unwrap_or_default();
                        assert_no_canary(&path.display().to_string(), &bytes);
                    }
                }
            }
        }
    }
}

/// A [`Stream::until`] condition: the `n`th line that matches `matches`.
pub fn nth(n: usize, matches: impl Fn(&str) -> bool) -> impl Fn(&str) -> bool {
    let seen = std::cell::Cell::new(0);
    move |line| {
        if matches(line) {
            seen.set(seen.get() + 1);
        }
        seen.get() >= n
    }
}

/// Every secret a test configures contains this marker (`sk-CANARY-…`).
pub const CANARY_MARK: &str = "CANARY";

/// Fails if `bytes` hold a test secret.
pub fn assert_no_canary(what: &str, bytes: &[u8]) {
    let mark = CANARY_MARK.as_bytes();
    if let Some(at) = bytes.windows(mark.len()).position(|w| w == mark) {
        let start = at.saturating_sub(60);
        let end = (at + 60).min(bytes.len());
        panic!(
            "a test secret leaked into {what}: …{}…",
            String::from_utf8_lossy(&bytes[start..end])
        );
    }
}

/// Writes a copy of the demo bundle as `dir/name` (manifest renamed, the
/// server binary linked in).
pub fn demo_bundle_at(dir: &Path, name: &str) -> PathBuf {
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!(name);
    write_bundle(dir, name, &manifest)
}

/// The demo bundle started through `/bin/sh -c "PREFIX exec demo"`: the
/// shell runs `prefix` (fork a grandchild, ignore SIGTERM, write to stderr...)
/// and then becomes the demo server.
pub fn shell_wrapped_demo(dir: &Path, name: &str, prefix: &str) -> PathBuf {
    let mut manifest: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    manifest["name"] = json!(name);
    manifest["server"]["mcp_config"]["command"] = json!("/bin/sh");
    manifest["server"]["mcp_config"]["args"] = json!([
        "-c",
        format!("{prefix} exec \"$0\""),
        "${__dirname}/server/bundlevisor-demo"
    ]);
    write_bundle(dir, name, &manifest)
}

/// Runs `openssl ARGS` in `dir` (the CLI: test certificates).
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throw-away self-signed CA in `dir` (`ca.key`, `ca.pem`); returns the
/// certificate's path.
pub fn test_ca(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=Test CA",
        ],
    );
    dir.join("ca.pem")
}

/// A stripped copy of the demo server at `path` (a plain copy where
/// `strip` is missing): small enough to pack into an archive.
pub fn stripped_demo_server(path: &Path) {
    stripped(Path::new(DEMO_BIN), path);
}

/// A stripped copy of the binary `bin` at `path` (a plain copy where
/// `strip` is missing).
pub fn stripped(bin: &Path, path: &Path) {
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(path)
        .arg(bin)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(bin, path).unwrap();
    }
}

/// Puts the demo server binary at `path`, inside a bundle folder: a hard
/// link (a copy across filesystems). A symlink out of the bundle folder
/// would be refused at install, as it grants the bundle nothing.
pub fn place_demo_server(path: &Path) {
    if !path.exists() {
        std::fs::hard_link(DEMO_BIN, path)
            .or_else(|_| std::fs::copy(DEMO_BIN, path).map(|_| ()))
            .unwrap();
    }
}

/// Writes `dir/name/manifest.json` and puts the demo server binary in.
pub fn write_bundle(dir: &Path, name: &str, manifest: &Value) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(folder.join("server")).unwrap();
    place_demo_server(&folder.join("server/bundlevisor-demo"));
    std::fs::write(
        folder.join("manifest.json"),
        serde_json::to_string_pretty(manifest).unwrap(),
    )
    .unwrap();
    folder
}

pub fn processes_with_cwd_under(root: &Path) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) {
            if cwd.starts_with(root) && !is_zombie(pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

pub fn is_zombie(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty()
        || stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
}

pub struct Raw {
    pub stream: UnixStream,
    pub reader: BufReader<UnixStream>,
}

impl Raw {
    pub fn send_line(&mut self, line: &str) {
        self.stream.write_all(line.as_bytes()).unwrap();
        self.stream.write_all(b"\n").unwrap();
    }

    pub fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).unwrap();
        assert!(n > 0, "daemon closed the connection");
        serde_json::from_str(&line).unwrap()
    }

    /// Sends a request and returns the response (skipping notifications).
    pub fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_line(
            &json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}).to_string(),
        );
        loop {
            let v = self.read();
            if v.get("id").is_some() {
                return v;
            }
        }
    }

    pub fn hello(&mut self) {
        let r = self.request(0, "daemon.hello", json!({"protocol": 1}));
        assert!(r.get("result").is_some(), "{r}");
    }

    /// The socket, for a writer of its own.
    pub fn stream(&self) -> UnixStream {
        self.stream.try_clone().unwrap()
    }
}

/// The daemon's resident memory (`VmRSS`) in bytes.
pub fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A CLI process whose stdout lines arrive on a channel.
pub struct Stream {
    child: Child,
    pub lines: mpsc::Receiver<String>,
}

impl Stream {
    pub fn start(d: &Daemon, args: &[&str]) -> Stream {
        let mut child = Command::new(BIN)
            .arg("--socket")
            .arg(&d.socket)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Stream { child, lines }
    }

    /// Lines until `done` matches one (inclusive), or panics at the deadline.
    pub fn until(&self, what: &str, done: impl Fn(&str) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    assert_no_canary("an event or log stream", line.as_bytes());
                    let stop = done(&line);
                    seen.push(line);
                    if stop {
                        return seen;
                    }
                }
                Err(_) => panic!("timed out waiting for {what}; saw:\n{}", seen.join("\n")),
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Subscribes and proves the subscription is live before returning: a probe
/// bundle is restarted until the stream reports one of its events (the CLI
/// process may connect after the first ones).
pub fn events(d: &Daemon, args: &[&str]) -> Stream {
    let s = Stream::start(d, args);
    let probe = d.demo_bundle("probe");
    d.ok(&["install", probe.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        d.ok(&["restart", "probe"]);
        while let Ok(line) = s.lines.recv_timeout(Duration::from_millis(200)) {
            if line.contains("\"probe\"") || line.contains("default/probe ") {
                // Drain what the restart still sends, so tests see only their own events.
                while s.lines.recv_timeout(Duration::from_millis(100)).is_ok() {}
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the event subscription never became live"
        );
    }
}

/// Bytes read from a stream by a thread, as they come.
#[derive(Clone)]
pub struct Seen(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Seen {
    pub fn collect(mut from: impl std::io::Read + Send + 'static) -> Seen {
        let seen = Seen(Default::default());
        let sink = seen.0.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // A terminal's master reads EIO once its last user has gone.
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        seen
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Runs `cmd` in a new pseudo-terminal as the session leader (so that ^C
/// written to the terminal reaches it as SIGINT, as a shell's job gets it).
/// Returns the child, the terminal's input and what it has printed.
pub fn in_terminal(cmd: &mut Command) -> (Child, std::fs::File, Seen) {
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = pty.slave;
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY as _, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    // The parent's copies of the slave are closed with `cmd`'s Stdio.
    let input = std::fs::File::from(pty.master.try_clone().unwrap());
    let seen = Seen::collect(std::fs::File::from(pty.master));
    (child, input, seen)
}

/// Waits (bounded) for a child to exit.
pub fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    wait_for(limit, what, || child.try_wait().unwrap())
}

/// Runs `mount` with `args` (needs root).
pub fn mount(args: &[&str]) {
    let out = Command::new("mount").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "mount {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unmounts its folders (lazily) when dropped, the last mounted first.
pub struct Unmount(pub Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
    }
}

/// `path` under the crate, which `make TARGET` installs.
pub fn installed(path: &str, target: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    assert!(
        path.exists(),
        "{} is not installed; run `make {target}` (make test does)",
        path.display()
    );
    path
}

/// An agent of MCP 2025-11-25 on the HTTP gateway at `url` (rmcp's
/// streamable HTTP client), admitted by `token`.
pub async fn http_agent(
    url: &str,
    token: &str,
) -> Result<rmcp::service::RunningService<rmcp::RoleClient, ()>, String> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token);
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(transport).await.map_err(|e| e.to_string())
}

/// A stateless MCP 2026-07-28 request as the revision's clients send it
/// (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, and in `_meta` the
/// version, `capabilities` and client info, beside any `_meta` of
/// `params`): the HTTP status and every JSON-RPC message of the answer (a
/// JSON body, or the data lines of its server-sent events).
pub async fn post_2026(
    url: &str,
    token: &str,
    method: &str,
    name: &str,
    params: Value,
    capabilities: Value,
) -> (u16, Vec<Value>) {
    post_2026_with(url, token, (method, name), params, capabilities, &[]).await
}

/// The JSON-RPC messages of an answer's body: one JSON body, or the data
/// of its SSE events.
fn messages_of(text: &str) -> Vec<Value> {
    match serde_json::from_str(text) {
        Ok(v) => vec![v],
        Err(_) => text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect(),
    }
}

/// [`post_2026`] with more HTTP headers (a `traceparent`, say).
pub async fn post_2026_with(
    url: &str,
    token: &str,
    (method, name): (&str, &str),
    mut params: Value,
    capabilities: Value,
    headers: &[(&str, &str)],
) -> (u16, Vec<Value>) {
    let meta = params
        .as_object_mut()
        .expect("params are an object")
        .entry("_meta")
        .or_insert_with(|| json!({}));
    meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
    meta["io.modelcontextprotocol/clientCapabilities"] = capabilities;
    meta["io.modelcontextprotocol/clientInfo"] = json!({"name": "wire-check", "version": "1"});
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name);
    for (header, value) in headers {
        request = request.header(*header, *value);
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let messages = messages_of(&text);
    (status, messages)
}

/// Runs `script` (under the crate) with the pinned Python SDK 2.3 venv
/// (`make mcp-py2`) and `args`; the lines it printed, once it succeeded.
pub fn mcp_py2(script: &str, args: &[&str]) -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{root}/target/mcp-py2/venv/bin/python"))
        .arg(format!("{root}/{script}"))
        .args(args)
        .output()
        .expect("run `make mcp-py2` first");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script}: {stdout}\n{stderr}");
    stdout.lines().map(str::to_string).collect()
}

/// The daemon's `[uv]` table: the pinned uv, the system's Python (readable
/// by the bundles' uids), and one download cache for the whole test run.
pub fn uv_config() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let uv = repo.join("target/uv/venv/bin/uv");
    assert!(
        uv.is_file(),
        "uv is not installed at {}; run `make uv` (make test does)",
        uv.display()
    );
    format!(
        "[uv]\ncommand = \"{}\"\npython = \"/usr/bin/python3\"\ncache_dir = \"{}\"\n",
        uv.display(),
        repo.join("target/uv-cache").display()
    )
}

/// `mcpb pack FOLDER OUT` with the official CLI `make mcpb` pins.
pub fn mcpb_pack(folder: &Path, out: &Path) {
    let mcpb = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mcpb/node_modules/.bin/mcpb");
    let packed = Command::new(&mcpb)
        .arg("pack")
        .arg(folder)
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; run `make mcpb` (make test does)", mcpb.display()));
    assert!(
        packed.status.success() && out.is_file(),
        "mcpb pack failed: {}{}",
        String::from_utf8_lossy(&packed.stdout),
        String::from_utf8_lossy(&packed.stderr)
    );
}

/// A demo bundle with a required sensitive `api_key` and a `region` with a
/// default, both passed in its environment. Its shell wrapper prints the key
/// to stderr (a careless bundle), and exits with it in the message when
/// `mode` is `crash`.
pub fn keyed_bundle(dir: &Path, name: &str) -> std::path::PathBuf {
    let mut m: Value = serde_json::from_str(DEMO_MANIFEST).unwrap();
    m["name"] = json!(name);
    m["user_config"] = json!({
        "api_key": {"type": "string", "title": "API key", "description": "API key", "required": true, "sensitive": true},
        "region": {"type": "string", "title": "Region", "description": "Region", "default": "eu"},
        "mode": {"type": "string", "title": "Mode", "description": "Mode", "default": "serve"}
    });
    m["server"]["mcp_config"]["command"] = json!("/bin/sh");
    m["server"]["mcp_config"]["args"] = json!([
        "-c",
        "echo \"using key $DEMO_API_KEY\" >&2; if [ \"$DEMO_MODE\" = crash ]; then echo \"fatal: key $DEMO_API_KEY was rejected\" >&2; exit 3; fi; exec \"$0\"",
        "${__dirname}/server/bundlevisor-demo"
    ]);
    m["server"]["mcp_config"]["env"] = json!({
        "DEMO_API_KEY": "${user_config.api_key}",
        "DEMO_REGION": "${user_config.region}",
        "DEMO_MODE": "${user_config.mode}"
    });
    write_bundle(dir, name, &m)
}

pub fn keyed_ready(line: &str) -> bool {
    line.contains("\"keyed\"") && line.contains("\"kind\":\"ready\"")
}

pub fn env_of(d: &Daemon, bundle: &str, var: &str) -> String {
    let out = d.ok(&["call", bundle, "env", &json!({ "name": var }).to_string()]);
    out.trim().to_string()
}

pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every file under `dir`, as lossy text.
pub fn all_files(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    out
}

pub fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// A raw 2025-11-25 session of `token` at `url`, its agent declaring
/// `capabilities`: initialized, and its id.
pub async fn raw_session(url: &str, token: &str, capabilities: Value) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": capabilities,
        "clientInfo": {"name": "raw-session", "version": "1"}}});
    let (status, headers, _) = posted(url, token, None, &init).await;
    assert_eq!(status, 200);
    let id = headers["mcp-session-id"].to_str().unwrap().to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, _) = posted(url, token, Some(&id), &initialized).await;
    assert!(status < 300, "{status}");
    id
}

/// One POST on session `id` (none: opening one): the status, the headers,
/// and the JSON-RPC messages of the answer (a JSON body or SSE events).
pub async fn posted(
    url: &str,
    token: &str,
    id: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Vec<Value>) {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json");
    if let Some(id) = id {
        request = request
            .header("Mcp-Session-Id", id)
            .header("MCP-Protocol-Version", "2025-11-25");
    }
    let response = request.body(body.to_string()).send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap_or_default();
    let messages = messages_of(&text);
    (status, headers, messages)
}

/// The HTTP gateway's requests answered below rmcp, and by rmcp, as
/// `/metrics` counts them.
pub fn answered_by(d: &Daemon) -> (u64, u64) {
    let count = |path: &str| {
        metric(
            d,
            &format!("bundlevisor_http_gateway_requests_total{{path=\"{path}\"}}"),
        )
    };
    (count("direct"), count("rmcp"))
}

/// The value of one `series` (its name and labels, as `/metrics` writes
/// them) of the daemon's metrics.
pub fn metric(d: &Daemon, series: &str) -> u64 {
    let text = d.ok(&["metrics"]);
    let line = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .and_then(|n| n.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}")) as u64
}

/// [`raw_session`] of an agent declaring nothing a bundle could ask, its
/// first plain call (`demo__echo`) answered below rmcp: its id.
pub async fn session_below_rmcp(d: &Daemon, url: &str, token: &str) -> String {
    let id = raw_session(url, token, json!({})).await;
    let echo = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "demo__echo", "arguments": {"text": "ready"}}});
    let before = tokio::task::block_in_place(|| answered_by(d)).0;
    let (status, _, answer) = posted(url, token, Some(&id), &echo).await;
    assert_eq!(status, 200, "{answer:?}");
    let after = tokio::task::block_in_place(|| answered_by(d)).0;
    assert_eq!(
        after,
        before + 1,
        "the first call was not answered below rmcp"
    );
    id
}
