//! systemd integration without libsystemd: `sd_notify` datagrams to
//! `$NOTIFY_SOCKET` (path or `@abstract`), and the watchdog interval from
//! `$WATCHDOG_USEC` (honoured only when `$WATCHDOG_PID` is unset or ours).

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// Sends one notification (`READY=1`, `WATCHDOG=1`, `STOPPING=1`,
/// `STATUS=...`). Returns Ok(false) when not run under systemd.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let addr = match path.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(&path)?,
    };
    let socket = UnixDatagram::unbound()?;
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(true)
}

/// How often to send `WATCHDOG=1`: half the interval systemd asked for.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var_os("WATCHDOG_PID") {
        if pid.to_string_lossy().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Logs a failed notification; systemd being absent is not an error.
pub fn notify_or_warn(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!(
            "sd_notify({}) failed: {e}",
            state.lines().next().unwrap_or("")
        );
    }
}
