//! `bundlevisor install URL --sha256 HEX`: the archive is downloaded by the
//! CLI (never by the daemon: the daemon makes no request on a client's
//! behalf), with a progress bar on a terminal, into a private file checked
//! against the expected SHA-256; a mismatch is refused and nothing is kept.
//! The daemon then installs that file like any local archive (and runs it
//! from its unpacked copy, so the download is deleted afterwards).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::ClientError;

/// The largest archive downloaded (the daemon's default `[archives]
/// max_archive_bytes`).
const MAX_DOWNLOAD: u64 = 512 * 1024 * 1024;

/// Whether the install argument is a URL rather than a path.
pub fn is_url(arg: &str) -> bool {
    arg.starts_with("https://") || arg.starts_with("http://")
}

/// A downloaded archive, deleted when dropped.
pub struct Downloaded {
    pub path: PathBuf,
}

impl Drop for Downloaded {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn usage(message: String) -> ClientError {
    ClientError::Usage(message)
}

/// Downloads `url` (https, or http to a loopback address) and checks it
/// against `sha256` (lowercase or uppercase hex).
pub async fn fetch(url: &str, sha256: Option<&str>) -> Result<Downloaded, ClientError> {
    // A URL may carry a token (user info, a signed query): messages and the
    // progress bar show it without them.
    let shown = url::Url::parse(url)
        .map(|u| without_secrets(&u))
        .unwrap_or_else(|_| "the URL given".to_string());
    let Some(expected) = sha256.map(str::to_ascii_lowercase) else {
        return Err(usage(format!(
            "installing from {shown} needs --sha256 HEX: the archive's SHA-256, as the registry lists it (a download is installed only if it matches)"
        )));
    };
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(usage(format!(
            "--sha256 {expected:?} is not a SHA-256 (64 hex digits)"
        )));
    }
    let url = crate::remote_http::check_url(url).map_err(|e| usage(e.to_string()))?;
    let client = reqwest::Client::builder()
        .build()
        .map_err(|e| ClientError::Protocol(format!("cannot start an HTTP client: {e}")))?;
    let mut response = client
        .get(url.clone())
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| usage(format!("cannot download {shown}: {}", e.without_url())))?;
    if response.content_length().is_some_and(|n| n > MAX_DOWNLOAD) {
        return Err(usage(format!(
            "{shown} is larger than {MAX_DOWNLOAD} bytes; download it yourself and install the file"
        )));
    }
    let dir = private_dir()
        .map_err(|e| ClientError::Protocol(format!("cannot make a download folder: {e}")))?;
    let name = url
        .path_segments()
        .and_then(|mut s| s.next_back())
        .filter(|n| crate::archive::is_archive(Path::new(n)) && !n.starts_with('.'))
        .unwrap_or("download.mcpb")
        .to_string();
    let downloaded = Downloaded {
        path: dir.join(name),
    };
    let mut file = std::fs::File::create(&downloaded.path).map_err(|e| {
        ClientError::Protocol(format!("cannot write {}: {e}", downloaded.path.display()))
    })?;
    let bar = match response.content_length() {
        Some(len) => crate::progress::bar(len, format!("downloading {shown}")),
        None => crate::progress::spinner(format!("downloading {shown}")),
    };
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        usage(format!(
            "download of {shown} broke off: {}",
            e.without_url()
        ))
    })? {
        total += chunk.len() as u64;
        if total > MAX_DOWNLOAD {
            return Err(usage(format!(
                "{shown} is larger than {MAX_DOWNLOAD} bytes"
            )));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).map_err(|e| {
            ClientError::Protocol(format!("cannot write {}: {e}", downloaded.path.display()))
        })?;
        bar.set_position(total);
    }
    drop(bar);
    file.sync_all().map_err(|e| {
        ClientError::Protocol(format!("cannot write {}: {e}", downloaded.path.display()))
    })?;
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != expected {
        return Err(usage(format!(
            "the archive downloaded from {shown} has SHA-256 {got}, not the expected {expected}; nothing was installed"
        )));
    }
    Ok(downloaded)
}

/// `url` without user info and query, for messages.
fn without_secrets(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// A folder of its own for one download (the daemon reads the file from it).
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "bundlevisor-download-{}-{nanos}",
        std::process::id()
    ));
    std::fs::DirBuilder::new().mode(0o711).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_is_shown_without_its_credentials() {
        let url = url::Url::parse("https://user:tok3n@reg.example/b/x.mcpb?sig=s3cret#f").unwrap();
        assert_eq!(super::without_secrets(&url), "https://reg.example/b/x.mcpb");
    }
}
