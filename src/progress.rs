//! Progress on a terminal: spinners for CLI commands that wait (install,
//! restart, configure, auth) and the daemon's boot-reload bar. When stderr
//! is not a terminal every bar is hidden, so piped output and log files get
//! nothing from here.
//!
//! The daemon's log lines go to the same stderr: [`LogWriter`] writes them
//! above the active bar (suspending it) instead of through it.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// The bar log lines must not cut through, if one is shown.
static ACTIVE: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn on_terminal(bar: ProgressBar) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    bar.enable_steady_tick(Duration::from_millis(100));
    *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
    bar
}

/// A spinner with a message and the time spent so far.
pub fn spinner(message: impl Into<String>) -> Shown {
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    bar.set_message(message.into());
    Shown(on_terminal(bar))
}

/// A bar of `len` steps.
pub fn bar(len: u64, message: impl Into<String>) -> Shown {
    let bar = ProgressBar::new(len).with_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(message.into());
    Shown(on_terminal(bar))
}

/// A shown (or hidden) progress indicator; cleared from the terminal when
/// dropped.
pub struct Shown(ProgressBar);

impl Shown {
    pub fn set_message(&self, message: impl Into<String>) {
        self.0.set_message(message.into());
    }

    pub fn set_position(&self, position: u64) {
        self.0.set_position(position);
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        self.0.finish_and_clear();
        // One indicator is shown at a time; a hidden one was never active.
        if !self.0.is_hidden() {
            *ACTIVE.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// stderr for `tracing`: a line is written above the active bar, if any.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let active = ACTIVE.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match active {
            Some(bar) => bar.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}
