//! Side by side with supervisord (PyPI `supervisor`, pinned by
//! tests/supervisor/requirements.lock; `make bench-peers`), same machine,
//! same run, same demo binary (issue 22): the time from SIGKILL to the
//! process running again, and from start to 200 programs running.
//!
//! "Running" is measured the same way for both: a child of the supervisor
//! whose command line is the program's binary (it has exec'd), seen in
//! `/proc`. supervisord does no MCP handshake and knows nothing of one;
//! bundlevisor's own figures (crash → ready, boot → ready) add the
//! handshake and sit beside these in the table.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{summarize, Summary, DEMO};

pub const SUPERVISORD: &str = "target/supervisor/venv/bin/supervisord";

/// Children of `parent` that have exec'd the demo binary: (pid, program).
pub fn demo_children(parent: u32) -> Vec<(u32, PathBuf)> {
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in procs.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The parent pid is the second field after the command in parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let program = PathBuf::from(String::from_utf8_lossy(program).into_owned());
        if program.file_name().is_some_and(|n| n == "bundlevisor-demo") {
            found.push((pid, program));
        }
    }
    found
}

/// The program `pid` (a child of `parent`) runs.
pub fn program_of(parent: u32, pid: u32) -> PathBuf {
    demo_children(parent)
        .into_iter()
        .find(|(p, _)| *p == pid)
        .map(|(_, program)| program)
        .expect("the process runs the demo binary")
}

/// Polls until `count` demo processes run as children of `parent`.
pub fn wait_running(parent: u32, count: usize) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if demo_children(parent).len() >= count {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{count} programs never ran");
        // Coarse: a scan of /proc every 200 µs took a core from the boot
        // it measured (the daemon's boot of 200 read 2× slower).
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls until `program` runs under `parent` with a pid other than `old`.
pub fn wait_replaced(parent: u32, program: &Path, old: u32) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if demo_children(parent)
            .iter()
            .any(|(pid, p)| *pid != old && p == program)
        {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "{} was never restarted",
            program.display()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

struct Supervisord {
    child: Child,
}

impl Drop for Supervisord {
    fn drop(&mut self) {
        // SIGTERM: supervisord stops its programs, then exits.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// supervisord's config for `count` copies of the demo binary, each in a
/// folder of its own under `dir/programs` (a hard link, like the bundles):
/// started at once (`startsecs=0`: running as soon as spawned), restarted
/// whenever they exit.
fn configure(dir: &Path, count: usize) -> PathBuf {
    let programs = dir.join("programs");
    let mut conf = format!(
        "[unix_http_server]\nfile={d}/supervisor.sock\n\
         [supervisord]\nlogfile={d}/supervisord.log\npidfile={d}/supervisord.pid\n\
         nodaemon=true\nminfds=4096\nchildlogdir={d}\n\
         [rpcinterface:supervisor]\n\
         supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
        d = dir.display()
    );
    for i in 0..count {
        let name = format!("p{i:03}");
        let folder = programs.join(&name);
        std::fs::create_dir_all(&folder).unwrap();
        let binary = folder.join("bundlevisor-demo");
        std::fs::hard_link(DEMO, &binary)
            .or_else(|_| std::fs::copy(DEMO, &binary).map(|_| ()))
            .unwrap();
        conf.push_str(&format!(
            "[program:{name}]\ncommand={}\nstartsecs=0\nautorestart=true\n\
             stdout_logfile=NONE\nstderr_logfile=NONE\n",
            binary.display()
        ));
    }
    let path = dir.join("supervisord.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

fn start(conf: &Path) -> Supervisord {
    let child = Command::new(SUPERVISORD)
        .arg("-c")
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{SUPERVISORD}: {e} (run `make bench-peers`)"));
    Supervisord { child }
}

pub struct Figures {
    pub start: Summary,
    pub programs: usize,
    pub crash: Summary,
}

/// Start → `count` programs running, `rounds` times; then SIGKILL of one
/// program → running again, `kills` times.
pub fn measure(dir: &Path, count: usize, rounds: usize, kills: usize) -> Figures {
    std::fs::create_dir_all(dir).unwrap();
    let conf = configure(dir, count);
    let mut starts = Vec::new();
    for _ in 0..rounds {
        let begun = Instant::now();
        let sv = start(&conf);
        starts.push(wait_running(sv.child.id(), count) - begun);
        drop(sv);
    }
    let sv = start(&conf);
    wait_running(sv.child.id(), count);
    let program = dir.join("programs/p000/bundlevisor-demo");
    let mut crashes = Vec::new();
    for _ in 0..kills {
        let old = demo_children(sv.child.id())
            .into_iter()
            .find(|(_, p)| *p == program)
            .map(|(pid, _)| pid)
            .expect("p000 runs");
        let begun = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(old as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        crashes.push(wait_replaced(sv.child.id(), &program, old) - begun);
    }
    drop(sv);
    Figures {
        start: summarize(starts),
        programs: count,
        crash: summarize(crashes),
    }
}
