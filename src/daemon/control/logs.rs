//! `bundle.logs`: the tail of a bundle's stderr log, and its new lines as
//! notifications with `follow`.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::wire::not_found;
use super::{Ctx, Outbox};
use crate::protocol::{method, ErrorKind, LogsParams, LogsResult, RpcError};

pub(super) async fn logs(p: LogsParams, ctx: &Ctx, out: &Outbox) -> Result<LogsResult, RpcError> {
    let path = ctx.shared.config.log_path(&p.workspace, &p.name);
    let exists = tokio::fs::try_exists(&path).await.unwrap_or(false);
    if !exists && ctx.api.bundle_status(&p.workspace, &p.name).is_none() {
        return Err(not_found(&p.workspace, &p.name));
    }
    if p.follow {
        // Subscribed before the tail is read: a line may show twice, none is lost.
        let (ws, name) = (p.workspace.clone(), p.name.clone());
        out.stream(
            method::LOG,
            ctx.shared.log_lines.subscribe(),
            move |l: &crate::protocol::LogLine| l.workspace == ws && l.name == name,
        );
    }
    let (file, n) = (path.clone(), p.lines);
    let lines = tokio::task::spawn_blocking(move || tail_lines(&file, n))
        .await
        .map_err(|e| RpcError::new(ErrorKind::Internal, e.to_string()))?
        .map_err(|e| {
            RpcError::new(
                ErrorKind::Internal,
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
    Ok(LogsResult {
        path: path.display().to_string(),
        lines,
    })
}

/// The last `n` lines of a file, read backwards in chunks.
pub(crate) fn tail_lines(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.seek(SeekFrom::End(0))?;
    let mut pos = len;
    let mut buf: Vec<u8> = Vec::new();
    const CHUNK: u64 = 64 * 1024;
    while pos > 0 && buf.iter().filter(|&&b| b == b'\n').count() <= n {
        let step = CHUNK.min(pos);
        pos -= step;
        file.seek(SeekFrom::Start(pos))?;
        let mut chunk = vec![0; step as usize];
        file.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    Ok(lines[start..].iter().map(|s| s.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::tail_lines;

    #[test]
    fn tail_reads_the_last_lines_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.log");
        let text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            tail_lines(&path, 3).unwrap(),
            vec!["line 19997", "line 19998", "line 19999"]
        );
        assert_eq!(tail_lines(&path, 0).unwrap(), Vec::<String>::new());
        assert_eq!(
            tail_lines(&dir.path().join("none"), 5).unwrap(),
            Vec::<String>::new()
        );
    }
}
