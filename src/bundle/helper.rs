//! Short-lived helper programs the daemon runs itself — uv's environment
//! builds (bundle/uv.rs), `pass` for a secret reference (secret_ref) —
//! spawned the one way that keeps them the daemon's: registered with the
//! orphan reaper (bundle/orphans.rs) from the moment they exist, so their
//! exit status is their owner's; in a process group of their own, killed
//! as a group when the owner gives up on them (a timeout, an abandoned
//! start), so nothing they started keeps running.

use std::process::{ExitStatus, Output};

/// A command for `program`, to be started with [`spawn`] (and only so).
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    tokio::process::Command::new(program)
}

/// A running helper; dropping it SIGKILLs its group.
pub struct Helper {
    pub child: tokio::process::Child,
    pid: u32,
    /// Waited for: its pid may be another process's by now.
    reaped: bool,
}

/// Spawns `command` as a helper (its own process group, killed on drop).
pub fn spawn(command: &mut tokio::process::Command) -> std::io::Result<Helper> {
    command.process_group(0).kill_on_drop(true);
    let spawning = super::orphans::spawning();
    let child = command.spawn()?;
    let pid = child.id().unwrap_or(0);
    super::orphans::own(pid);
    drop(spawning);
    Ok(Helper {
        child,
        pid,
        reaped: false,
    })
}

impl Helper {
    /// Waits for it to exit.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        super::orphans::release(self.pid);
        self.reaped = status.is_ok();
        status
    }

    /// Its exit status and what it wrote on its piped outputs, at most
    /// `max` bytes of each (the rest is left unread).
    pub async fn output(mut self, max: u64) -> std::io::Result<Output> {
        use tokio::io::AsyncReadExt;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (out, err) = (self.child.stdout.take(), self.child.stderr.take());
        let read_out = async {
            match out {
                Some(o) => o.take(max).read_to_end(&mut stdout).await.map(|_| ()),
                None => Ok(()),
            }
        };
        let read_err = async {
            match err {
                Some(e) => e.take(max).read_to_end(&mut stderr).await.map(|_| ()),
                None => Ok(()),
            }
        };
        let (a, b) = tokio::join!(read_out, read_err);
        a?;
        b?;
        let status = self.wait().await?;
        Ok(Output {
            status,
            stdout,
            stderr,
        })
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.pid > 0 && !self.reaped {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            // Not waited for by its owner (tokio reaps a child killed on
            // drop; so may the orphan reaper now).
            super::orphans::release(self.pid);
        }
    }
}
