//! The Python environments of uv bundles (MCPB 0.4 `server.type = "uv"`).
//!
//! A uv bundle ships `pyproject.toml` (and perhaps `uv.lock`), not its
//! dependencies. The daemon builds its environment with uv, once per
//! version: in `STATE_DIR/sandboxes/WS/NAME/env/KEY`, where `KEY` is a
//! digest of the project files and the Python it is made with. A start
//! finds the environment by its key and builds nothing; a changed
//! `pyproject.toml` or `uv.lock` (an upgrade) or another Python gets a new
//! one, and the old ones are removed by the first start that runs in it.
//!
//! - uv runs as the daemon, so it never opens a file of the bundle: the
//!   daemon reads and checks `pyproject.toml` and `uv.lock` (see
//!   [`super::pyproject`]: no links, no build backend of the project, no
//!   direct references) and hands uv a copy in a folder of its own.
//! - The bundle folder is never written. Into a `uv venv`, a locked
//!   project gets what `uv export --frozen` makes of its lock (pinned,
//!   hashed requirements, installed with `uv pip sync` from the configured
//!   index: the lock's own download URLs are never fetched); an unlocked
//!   one `uv pip install -r pyproject.toml` (static dependencies only, so
//!   uv never runs the project's build backend).
//! - Only wheels are installed unless `[uv] build_from_source`: no code of
//!   the bundle's dependencies runs with the daemon's privileges.
//! - uv sees a scrubbed environment: `PATH`, its own settings, and the
//!   `[sandbox] pass_env` variables (proxy, index and CA variables).
//! - An environment is complete when its stamp file is there (written
//!   last); an unfinished one is removed and built again.
//! - Its files are made readable (not writable) by the bundle's uid;
//!   Landlock grants the bundle read access to it, nothing more.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::pyproject::{self, ProjectError, ProjectFiles};
use crate::config::UvSettings;

/// The file that marks a complete environment (written last).
const STAMP: &str = ".bundlevisor-env";
/// uv output lines kept while it runs, and shown in an error message.
const KEPT: usize = 64;
const TAIL: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum UvError {
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error("cannot prepare the environment folder {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot run uv ({program}): {source}; install uv, or set [uv] command to its path")]
    NoUv {
        program: String,
        source: std::io::Error,
    },
    #[error("the Python for uv environments ([uv] python = {python:?}) is not there: {reason}")]
    NoPython { python: String, reason: String },
    #[error("building the Python environment failed (`{step}`): {detail}; once the bundle's pyproject.toml, the index or the network is fixed, `bundlevisor restart` builds it again")]
    Failed { step: String, detail: String },
    #[error(
        "building the Python environment took longer than {limit}; it was stopped ([uv] timeout)"
    )]
    TimedOut { limit: String },
}

/// Where a bundle's environments live: `STATE_DIR/sandboxes/WS/NAME/env`.
pub fn env_root(state_dir: &Path, workspace: &str, bundle: &str) -> PathBuf {
    crate::bundle::sandbox::data_dir(state_dir, workspace, bundle).with_file_name("env")
}

/// A program given as a bare name, found on the daemon's `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The uv program `[uv] command` names, resolved (for a bundle whose
/// `mcp_config` runs `uv`).
pub fn uv_program(settings: &UvSettings) -> Option<PathBuf> {
    find_program(&settings.command)
}

/// The environment's key: the project files, the Python (resolved) and
/// whether sources may be built.
fn key(files: &ProjectFiles, python: &Path, settings: &UvSettings) -> String {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    for part in [Some(&files.pyproject), files.lock.as_ref()] {
        let part = part.map(Vec::as_slice).unwrap_or_default();
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    digest.update(python.as_os_str().as_encoded_bytes());
    digest.update([u8::from(settings.build_from_source)]);
    digest
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What [`ensure`] needs to know about the bundle.
pub struct Project<'a> {
    pub state_dir: &'a Path,
    pub workspace: &'a str,
    pub bundle: &'a str,
    /// The bundle folder (holds `pyproject.toml`, perhaps `uv.lock`).
    pub folder: &'a Path,
    /// Daemon variables uv may see (`[sandbox] pass_env`, global and the bundle's).
    pub pass_env: &'a [String],
}

/// A ready environment.
#[derive(Debug, Clone)]
pub struct Environment {
    /// `…/env/KEY`: `bin/python` runs the bundle.
    pub dir: PathBuf,
    /// Built by this call (false: an existing one was found).
    pub built: bool,
}

/// Finds the bundle's environment, or builds it, telling `progress` what
/// uv says on the way.
pub async fn ensure(
    settings: &UvSettings,
    cache: &Path,
    project: &Project<'_>,
    mut progress: impl FnMut(&str),
) -> Result<Environment, UvError> {
    let uv = find_program(&settings.command).ok_or_else(|| UvError::NoUv {
        program: settings.command.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "not found"),
    })?;
    let python = find_program(&settings.python)
        .and_then(|p| p.canonicalize().ok())
        .ok_or_else(|| UvError::NoPython {
            python: settings.python.display().to_string(),
            reason: "not found (a path, or a name on the daemon's PATH)".into(),
        })?;
    // The daemon reads and checks the project files itself, before uv runs.
    let files = {
        let folder = project.folder.to_path_buf();
        let allow = settings.allow_direct_references;
        tokio::task::spawn_blocking(move || {
            let files = pyproject::read(&folder)?;
            pyproject::check(&folder, &files, allow)?;
            Ok::<_, ProjectError>(files)
        })
        .await
        .map_err(|e| UvError::Io {
            path: project.folder.to_path_buf(),
            source: std::io::Error::other(e),
        })??
    };
    let root = env_root(project.state_dir, project.workspace, project.bundle);
    let key = key(&files, &python, settings);
    let dir = root.join(&key);
    if dir.join(STAMP).is_file() {
        return Ok(Environment { dir, built: false });
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UvError::Io { path, source }
    };
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        // The sandbox folder stays private; `env/` only lets the bundle's
        // uid pass through to its environment.
        let parent = root.parent().unwrap_or(&root);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(io(parent))?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&root)
            .map_err(io(&root))?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
            .map_err(io(&root))?;
        if dir.exists() {
            // An unfinished build (the daemon stopped during it).
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
    }
    progress(&format!(
        "building the Python environment with uv (once per version) in {}",
        dir.display()
    ));
    let run = Runner {
        redactor: &credentials(project.pass_env),
        uv: &uv,
        settings,
        cache,
        project,
        cwd: &root,
    };
    // uv reads the checked bytes, never the bundle's files.
    let copy = ProjectCopy::write(root.parent().unwrap_or(&root), &key, &files)?;
    let build = async {
        let target = dir.to_string_lossy().into_owned();
        let python = python.to_string_lossy().into_owned();
        let env_python = dir.join("bin/python").to_string_lossy().into_owned();
        run.step(&["venv", "--python", &python, &target], &mut progress)
            .await?;
        if files.lock.is_some() {
            // The lock's versions and hashes, from the configured index.
            let exported = copy.dir.join("requirements.txt");
            let project_dir = copy.dir.to_string_lossy().into_owned();
            let out = exported.to_string_lossy().into_owned();
            run.step(
                &[
                    "export",
                    "--frozen",
                    "--no-dev",
                    "--no-emit-project",
                    "--no-header",
                    "--quiet",
                    "--project",
                    &project_dir,
                    "--output-file",
                    &out,
                ],
                &mut progress,
            )
            .await?;
            let text = std::fs::read_to_string(&exported).map_err(|source| UvError::Io {
                path: exported.clone(),
                source,
            })?;
            pyproject::check_exported(project.folder, &text, settings.allow_direct_references)?;
            let mut args = vec!["pip", "sync", "--python", &env_python];
            if !settings.allow_direct_references {
                // Direct references (opted in) may have no hash.
                args.push("--require-hashes");
            }
            args.push(&out);
            run.step(&args, &mut progress).await
        } else {
            let requirements = copy.path("pyproject.toml");
            run.step(
                &[
                    "pip",
                    "install",
                    "--python",
                    &env_python,
                    "-r",
                    &requirements,
                ],
                &mut progress,
            )
            .await
        }
    };
    match tokio::time::timeout(settings.timeout, build).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(UvError::TimedOut {
                limit: humantime::format_duration(settings.timeout).to_string(),
            })
        }
    }
    let finished = dir.clone();
    tokio::task::spawn_blocking(move || finish(&finished, &key))
        .await
        .map_err(|e| UvError::Io {
            path: dir.clone(),
            source: std::io::Error::other(e),
        })??;
    progress("the Python environment is ready");
    Ok(Environment { dir, built: true })
}

/// Makes the environment readable by the bundle's uid and writes the stamp.
fn finish(dir: &Path, key: &str) -> Result<(), UvError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UvError::Io { path, source }
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).map_err(io(&d))?;
        for entry in std::fs::read_dir(&d).map_err(io(&d))?.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                use std::os::unix::fs::MetadataExt;
                let mode = entry.metadata().map_err(io(&path))?.mode();
                // Readable by all; executable where it was; never writable
                // but by the daemon.
                let readable = (mode & 0o755) | 0o444 | if mode & 0o100 != 0 { 0o111 } else { 0 };
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(readable))
                    .map_err(io(&path))?;
            }
        }
    }
    std::fs::write(dir.join(STAMP), format!("{key}\n")).map_err(io(dir))
}

/// The checked project files, copied into a folder of the daemon's (`0700`,
/// beside the environments) for uv to read; removed when dropped.
struct ProjectCopy {
    dir: PathBuf,
}

impl ProjectCopy {
    fn write(parent: &Path, key: &str, files: &ProjectFiles) -> Result<ProjectCopy, UvError> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("uv-project-{key}-{}-{n}", std::process::id()));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| UvError::Io { path, source }
        };
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io(&dir))?;
        let copy = ProjectCopy { dir };
        for (name, bytes) in [
            ("pyproject.toml", Some(&files.pyproject)),
            ("uv.lock", files.lock.as_ref()),
        ] {
            if let Some(bytes) = bytes {
                let path = copy.dir.join(name);
                std::fs::write(&path, bytes).map_err(io(&path))?;
            }
        }
        Ok(copy)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for ProjectCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Environment {
    /// Removes the bundle's other environments (earlier versions'), once
    /// nothing runs in them: called by a start, after the old process stopped.
    pub fn remove_others(&self) {
        let Some(root) = self.dir.parent() else {
            return;
        };
        for old in std::fs::read_dir(root).into_iter().flatten().flatten() {
            if old.path() != self.dir {
                if let Err(e) = std::fs::remove_dir_all(old.path()) {
                    tracing::warn!(path = %old.path().display(), "cannot remove an earlier environment: {e}");
                }
            }
        }
    }
}

/// Runs uv steps for one build.
/// The credentials in the passed variables (`UV_INDEX_URL=https://user:
/// token@…`, `HTTPS_PROXY=http://user:pw@…`): masked in what uv prints
/// before it becomes an event or a failure reason.
fn credentials(pass_env: &[String]) -> crate::secret::Redactor {
    let secrets = pass_env
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .flat_map(|value| {
            value
                .split_whitespace()
                .filter_map(|word| url::Url::parse(word).ok())
                .flat_map(|url| {
                    let user = url.username().to_string();
                    let password = url.password().map(str::to_string);
                    [Some(user), password]
                })
                .flatten()
                .filter(|part| part.len() >= 3)
                .collect::<Vec<_>>()
        })
        .map(crate::secret::Secret::new);
    crate::secret::Redactor::new(secrets)
}

struct Runner<'a> {
    redactor: &'a crate::secret::Redactor,
    uv: &'a Path,
    settings: &'a UvSettings,
    cache: &'a Path,
    project: &'a Project<'a>,
    cwd: &'a Path,
}

impl Runner<'_> {
    /// One uv command; every line it prints goes to `progress`, the last
    /// ones (from its `error:` line on) into the failure.
    async fn step(&self, args: &[&str], progress: &mut impl FnMut(&str)) -> Result<(), UvError> {
        let mut cmd = super::helper::command(self.uv);
        cmd.args(args)
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            .env("UV_CACHE_DIR", self.cache)
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("UV_NO_CONFIG", "1")
            .env("UV_NO_PROGRESS", "1")
            .env("NO_COLOR", "1")
            .current_dir(self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.settings.build_from_source {
            cmd.env("UV_NO_BUILD", "1");
        }
        if self.settings.system_certs {
            cmd.env("UV_SYSTEM_CERTS", "1").env("UV_NATIVE_TLS", "1");
        }
        for name in self.project.pass_env {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        let shown = match args {
            ["pip", sub, ..] => format!("uv pip {sub}"),
            [first, ..] => format!("uv {first}"),
            [] => "uv".into(),
        };
        // Its whole group dies with this step if the start is abandoned.
        let mut helper = super::helper::spawn(&mut cmd).map_err(|source| UvError::NoUv {
            program: self.uv.display().to_string(),
            source,
        })?;
        let child = &mut helper.child;
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            unreachable!("both pipes were requested");
        };
        let mut out = BufReader::new(out).lines();
        let mut err = BufReader::new(err).lines();
        let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            let line = tokio::select! {
                l = out.next_line(), if out_open => l.ok().flatten().or_else(|| { out_open = false; None }),
                l = err.next_line(), if err_open => l.ok().flatten().or_else(|| { err_open = false; None }),
            };
            let Some(line) = line else { continue };
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let line = self.redactor.redact(line);
            let line = line.as_ref();
            progress(line);
            if tail.len() == KEPT {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
        let status = helper.wait().await.map_err(|source| UvError::NoUv {
            program: self.uv.display().to_string(),
            source,
        })?;
        if status.success() {
            return Ok(());
        }
        // What uv said from its last `error:` line on, else its last lines.
        let lines: Vec<String> = tail.into();
        let from = lines
            .iter()
            .rposition(|l| l.starts_with("error:"))
            .unwrap_or(lines.len().saturating_sub(TAIL));
        let detail = match &lines[from..] {
            [] => format!("uv {}", super::process::ExitInfo::from(status)),
            said => said
                .iter()
                .take(TAIL)
                .cloned()
                .collect::<Vec<_>>()
                .join(" / "),
        };
        Err(UvError::Failed {
            step: shown,
            detail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_proxy_credentials_are_masked() {
        std::env::set_var(
            "BV_TEST_UV_INDEX",
            "https://robot:s3cr3t-t0ken@pypi.internal.example/simple",
        );
        let redactor = credentials(&["BV_TEST_UV_INDEX".into(), "BV_TEST_UNSET".into()]);
        let said = "error: Failed to fetch: `https://robot:s3cr3t-t0ken@pypi.internal.example/simple/mcp/`";
        let shown = redactor.redact(said);
        assert!(
            !shown.contains("s3cr3t-t0ken") && !shown.contains("robot"),
            "{shown}"
        );
        assert!(shown.contains("pypi.internal.example"), "{shown}");
    }

    #[test]
    fn the_key_changes_with_the_project_files_and_the_python() {
        let settings = UvSettings::default();
        let mut files = ProjectFiles {
            pyproject: b"[project]\nname='a'\n".to_vec(),
            lock: None,
        };
        let python = Path::new("/usr/bin/python3");
        let first = key(&files, python, &settings);
        assert_eq!(first, key(&files, python, &settings));
        files.lock = Some(b"version = 1\n".to_vec());
        let locked = key(&files, python, &settings);
        assert_ne!(first, locked);
        assert_ne!(locked, key(&files, Path::new("/opt/python3"), &settings));
        let building = UvSettings {
            build_from_source: true,
            ..UvSettings::default()
        };
        assert_ne!(locked, key(&files, python, &building));
    }
}
