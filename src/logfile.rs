//! A bundle's stderr log file with size-based rotation: when `NAME.log`
//! would grow past `max_bytes` it becomes `NAME.log.1` (older files shift
//! up to `NAME.log.KEEP`, the oldest is dropped) and a new file is started.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast;

use crate::protocol::LogLine;

/// Where a bundle's stderr goes.
#[derive(Clone)]
pub struct LogTarget {
    pub path: PathBuf,
    pub max_bytes: u64,
    pub keep: u32,
    /// Followers (`bundlevisor logs -f`).
    pub bus: Option<broadcast::Sender<LogLine>>,
}

pub struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<tokio::fs::File>,
    size: u64,
}

impl RotatingLog {
    pub async fn open(path: &Path, max_bytes: u64, keep: u32) -> std::io::Result<RotatingLog> {
        let mut log = RotatingLog {
            path: path.to_path_buf(),
            max_bytes,
            keep,
            file: None,
            size: 0,
        };
        log.reopen().await?;
        Ok(log)
    }

    /// Opens (or creates) the file `0600` in a `0700` folder; a file or
    /// folder left open to other users by an older version is tightened.
    async fn reopen(&mut self) -> std::io::Result<()> {
        if let Some(parent) = self.path.parent() {
            tokio::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .await?;
            private(parent, 0o700).await?;
        }
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)
            .await?;
        private(&self.path, 0o600).await?;
        self.size = file.metadata().await?.len();
        self.file = Some(file);
        Ok(())
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    async fn rotate(&mut self) -> std::io::Result<()> {
        if let Some(mut f) = self.file.take() {
            f.flush().await?;
        }
        if self.keep == 0 {
            tokio::fs::remove_file(&self.path).await?;
        } else {
            for n in (1..self.keep).rev() {
                let from = self.rotated(n);
                if tokio::fs::try_exists(&from).await.unwrap_or(false) {
                    tokio::fs::rename(&from, self.rotated(n + 1)).await?;
                }
            }
            tokio::fs::rename(&self.path, self.rotated(1)).await?;
        }
        self.reopen().await
    }

    /// Appends one line, or several separated by newlines (a newline is
    /// added), rotating first if needed.
    pub async fn append(&mut self, line: &str) -> std::io::Result<()> {
        let len = line.len() as u64 + 1;
        if self.size > 0 && self.size + len > self.max_bytes {
            self.rotate().await?;
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        file.write_all(&buf).await?;
        self.size += len;
        Ok(())
    }

    pub async fn flush(&mut self) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush().await,
            None => Ok(()),
        }
    }
}

/// Sets `mode` on `path` if group or other users have any access to it.
async fn private(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let now = tokio::fs::metadata(path).await?.permissions().mode();
    if now & 0o077 != 0 {
        tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotates_by_size_and_keeps_the_configured_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.log");
        let mut log = RotatingLog::open(&path, 100, 2).await.unwrap();
        for i in 0..40 {
            log.append(&format!("line {i:03} of the log"))
                .await
                .unwrap(); // 20 bytes each
        }
        log.flush().await.unwrap();
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        // 5 lines per file: the newest file holds the last ones.
        assert_eq!(read(path.clone()).lines().count(), 5);
        assert!(read(path.clone()).ends_with("line 039 of the log\n"));
        assert!(read(dir.path().join("b.log.1")).starts_with("line 030"));
        assert!(read(dir.path().join("b.log.2")).starts_with("line 025"));
        assert!(!dir.path().join("b.log.3").exists());
        for p in [
            path.clone(),
            dir.path().join("b.log.1"),
            dir.path().join("b.log.2"),
        ] {
            assert!(std::fs::metadata(&p).unwrap().len() <= 100);
        }
        // Reopening continues the current file's size.
        let mut again = RotatingLog::open(&path, 100, 2).await.unwrap();
        again.append("x").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("b.log.1"))
                .unwrap()
                .lines()
                .count(),
            5
        );
    }

    #[tokio::test]
    async fn logs_are_private_and_an_open_one_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("audit/w.jsonl");
        let mut log = RotatingLog::open(&new, 100, 1).await.unwrap();
        assert_eq!((mode(new.parent().unwrap()), mode(&new)), (0o700, 0o600));
        for _ in 0..20 {
            log.append("a line long enough to rotate").await.unwrap();
        }
        assert_eq!(mode(&dir.path().join("audit/w.jsonl.1")), 0o600);
        assert_eq!(mode(&new), 0o600, "the file after a rotation");

        // Left 0644 in a 0755 folder by an older version.
        let old = dir.path().join("old/w.jsonl");
        std::fs::create_dir(old.parent().unwrap()).unwrap();
        std::fs::write(&old, "earlier\n").unwrap();
        let open = std::fs::Permissions::from_mode;
        std::fs::set_permissions(old.parent().unwrap(), open(0o755)).unwrap();
        std::fs::set_permissions(&old, open(0o644)).unwrap();
        RotatingLog::open(&old, 100, 1).await.unwrap();
        assert_eq!((mode(old.parent().unwrap()), mode(&old)), (0o700, 0o600));
    }
}
