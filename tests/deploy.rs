//! The Kubernetes deployment (deploy/base, a Kustomize base): rendered with
//! `kubectl kustomize`, validated against the Kubernetes schemas with the
//! pinned kubernetes-validate (`make k8s-validate`), and checked for what
//! docs/scaling.md promises: a StatefulSet with a volume per pod, non-root,
//! liveness and readiness on the ops endpoints, each workspace's watched
//! folder from a ConfigMap, and each workspace's Ingress path sent to the
//! pod whose config serves it. The daemon configs and bundle files in it are
//! the daemon's own: they load. And the pod itself runs for real, in podman
//! (`make container-base`): the image built from the Dockerfile's runtime
//! stage, started as the StatefulSet says, attacked from a bundle inside.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

const BASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/base");
const VENV: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/k8s-validate/venv/bin");

/// `kubectl kustomize deploy/base`: the rendered YAML.
fn rendered() -> String {
    let out = Command::new("kubectl")
        .args(["kustomize", BASE])
        .output()
        .expect("kubectl is needed to render deploy/base");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rendered documents as JSON (through the venv's PyYAML).
fn documents(yaml: &str) -> Vec<Value> {
    use std::io::Write;
    let mut python = Command::new(format!("{VENV}/python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(sys.stdin))))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run `make k8s-validate` first");
    python
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn kind<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_rendered_manifests_pass_the_kubernetes_schemas() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), rendered()).unwrap();
    let out = Command::new(format!("{VENV}/kubernetes-validate"))
        .arg("--strict")
        .arg(file.path())
        .output()
        .expect("run `make k8s-validate` first");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for resource in [
        "statefulset/bundlevisor",
        "ingress/bundlevisor",
        "service/bundlevisor-0",
    ] {
        assert!(
            text.contains(&format!("passed for resource {resource}")),
            "{text}"
        );
    }
}

#[test]
fn each_workspace_path_reaches_the_pod_whose_config_serves_it() {
    let docs = documents(&rendered());
    let set = kind(&docs, "StatefulSet", "bundlevisor");
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(
        set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "state"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let replicas = set["spec"]["replicas"].as_u64().unwrap();
    let paths = kind(&docs, "Ingress", "bundlevisor")["spec"]["rules"][0]["http"]["paths"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!paths.is_empty());
    for path in paths {
        let workspace = path["path"]
            .as_str()
            .unwrap()
            .strip_prefix("/mcp/")
            .unwrap();
        let service = path["backend"]["service"]["name"].as_str().unwrap();
        // The Service selects one pod of the set...
        let selector = &kind(&docs, "Service", service)["spec"]["selector"];
        let pod_name = selector["statefulset.kubernetes.io/pod-name"]
            .as_str()
            .unwrap();
        let ordinal: u64 = pod_name.rsplit('-').next().unwrap().parse().unwrap();
        assert!(ordinal < replicas, "{pod_name} is not in the set");
        // ...whose own config watches that workspace's folder, and stops
        // within the grace period.
        let config = bundlevisor::config::Config::load(
            &Path::new(BASE).join(format!("config/{pod_name}.toml")),
        )
        .unwrap_or_else(|e| panic!("{pod_name}: {e}"));
        let watch = config
            .watch
            .iter()
            .find(|w| w.workspace == workspace)
            .unwrap_or_else(|| panic!("{pod_name} does not serve {workspace}"));
        assert!(config.bundles.stop_grace.as_secs() < grace);
        // kubelet makes a ConfigMap volume 0777: without this the daemon
        // would refuse the folder.
        assert!(watch.read_only_volume, "{pod_name}: read_only_volume");
        // The folder is a ConfigMap volume of that workspace's bundles.
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == watch.dir)
            .unwrap_or_else(|| panic!("{} is not mounted", watch.dir.display()));
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        let map = volume["configMap"]["name"].as_str().unwrap();
        let data = &kind(&docs, "ConfigMap", map)["data"];
        // Each bundle file in it is a manifest the daemon takes.
        for (file, text) in data.as_object().unwrap() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(file);
            std::fs::write(&path, text.as_str().unwrap()).unwrap();
            bundlevisor::manifest::load(&path).unwrap_or_else(|e| panic!("{map}/{file}: {e}"));
        }
    }
}

/// The pod runs as root with exactly the capabilities a root daemon
/// checks for at start, and each pod's config has a uid range of its own
/// (two pods on one node never run bundles under the same uid).
#[test]
fn the_pod_is_root_with_the_daemons_capabilities_and_each_pod_has_its_own_uid_range() {
    let docs = documents(&rendered());
    let pod = &kind(&docs, "StatefulSet", "bundlevisor")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(pod["automountServiceAccountToken"], false);
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let needed: Vec<&str> = bundlevisor::daemon::privileges::NEEDED
        .iter()
        .map(|(_, name, _)| *name)
        .collect();
    assert_eq!(security["capabilities"]["add"], serde_json::json!(needed));
    let replicas = kind(&docs, "StatefulSet", "bundlevisor")["spec"]["replicas"]
        .as_u64()
        .unwrap();
    let ranges: Vec<_> = (0..replicas)
        .map(|i| {
            let path = Path::new(BASE).join(format!("config/bundlevisor-{i}.toml"));
            let config = bundlevisor::config::Config::load(&path).unwrap();
            assert!(!config.sandbox.allow_same_uid, "{}", path.display());
            config.sandbox.uid_range
        })
        .collect();
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            assert!(a.last < b.first || b.last < a.first, "{a} overlaps {b}");
        }
    }
}

/// A root daemon without a capability it needs refuses to start, naming
/// what is missing and the line to add (before, bundles crash-looped on
/// "drop to the bundle's user: Operation not permitted", or could not be
/// stopped without KILL).
#[test]
fn a_root_daemon_without_its_capabilities_refuses_to_start_and_says_which() {
    if !nix::unistd::geteuid().is_root() {
        return; // only root needs them
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bundlevisor.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{0}/state\"\nsocket = \"{0}/run/bundlevisor.sock\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    // Out of the bounding set, so out of what root gets at exec.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-kill,-setuid",
            common::BIN,
            "daemon",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("without the capabilities KILL, SETUID (KILL: stop bundles"),
        "{stderr}"
    );
    assert!(
        stderr.contains("capabilities.add: [KILL, SETUID]"),
        "{stderr}"
    );
    assert!(!dir.path().join("run/bundlevisor.sock").exists());
}

/// The image: the Dockerfile's runtime stage as written, its build stage
/// replaced by this build's binaries (stripped), on the base image
/// `make container-base` made. Built once per test run.
fn image() -> &'static str {
    static IMAGE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    const NAME: &str = "localhost/bundlevisor:pod-test";
    IMAGE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let context = tempfile::tempdir().unwrap();
        let dir = context.path();
        std::fs::create_dir_all(dir.join("target/release")).unwrap();
        std::fs::create_dir_all(dir.join("bundles/demo")).unwrap();
        std::fs::create_dir_all(dir.join("deploy")).unwrap();
        common::stripped(
            Path::new(common::BIN),
            &dir.join("target/release/bundlevisor"),
        );
        common::stripped(
            Path::new(common::DEMO_BIN),
            &dir.join("target/release/bundlevisor-demo"),
        );
        for file in ["bundles/demo/manifest.json", "deploy/bundlevisor.toml"] {
            std::fs::copy(root.join(file), dir.join(file)).unwrap();
        }
        let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
        let runtime = dockerfile
            .find("# --- runtime ---")
            .expect("the Dockerfile marks its runtime stage");
        std::fs::write(
            dir.join("Containerfile"),
            format!(
                "FROM scratch AS build\nCOPY target/release/ /src/target/release/\n{}",
                &dockerfile[runtime..]
            ),
        )
        .unwrap();
        let out = podman()
            .args(["build", "--quiet", "--network=host", "-t", NAME])
            .arg(dir)
            .output()
            .expect("podman is needed: run `make container-base`");
        assert!(
            out.status.success(),
            "podman build (run `make container-base` first): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    NAME
}

/// podman with runc (crun refuses a host with hybrid cgroups).
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]);
    c
}

/// A container, removed with its volumes when dropped.
struct Container(String);

impl Container {
    /// `podman exec NAME ARGS…`: (success, stdout, stderr).
    fn exec(&self, args: &[&str]) -> (bool, String, String) {
        let out = podman()
            .args(["exec", &self.0])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `bundlevisor ARGS…` inside, as root (kubectl exec).
    fn cli(&self, args: &[&str]) -> String {
        let mut all = vec!["bundlevisor"];
        all.extend_from_slice(args);
        let (ok, out, err) = self.exec(&all);
        assert!(ok, "bundlevisor {args:?}: {err}\n{}", self.logs());
        out
    }

    fn logs(&self) -> String {
        let out = podman().args(["logs", &self.0]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    fn inspect(&self, format: &str) -> String {
        let out = podman()
            .args(["inspect", "-f", format, &self.0])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-v", &self.0]).output();
    }
}

/// Issue 30, finding 2 (its second half): deploy/base's pod, run for real.
/// The image is built from the Dockerfile; podman starts it the way the
/// StatefulSet says (its user, capabilities, read-only root, no privilege
/// escalation, its volumes: the emptyDir, the pod's ConfigMaps as kubelet
/// lays them out read-only, the state claim). In the workspace's folder
/// next to the shipped bundle sits a hostile one (tests/pod/attack.sh)
/// that tries, from inside the pod, everything the audit did: the control
/// socket (also 30 connections at once), the daemon's key and environment,
/// the other bundle's data and process, the daemon's process, the state
/// dir, the image, and the ops and gateway listeners on loopback and on the
/// pod's address. Every attempt fails; the daemon and the other bundle run
/// on; kubelet's probes (from outside the pod) are answered; SIGTERM stops
/// it cleanly. In the pod deploy/ shipped before (non-root, bundles under
/// the daemon's uid), the attacker's data and process checks pass (same
/// uid: it reads the other bundle's `/proc` entries, and only Landlock
/// stands between them).
#[test]
fn the_pod_runs_for_real_and_a_bundle_inside_it_reaches_neither_the_daemon_nor_another_bundle() {
    use std::os::unix::fs::PermissionsExt;
    let docs = documents(&rendered());
    let set = kind(&docs, "StatefulSet", "bundlevisor");
    let pod = &set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    let pod_name = "bundlevisor-0";
    let config_path = Path::new(BASE).join(format!("config/{pod_name}.toml"));
    let config = bundlevisor::config::Config::load(&config_path).unwrap();
    let workspace = config.watch[0].workspace.clone();
    let image = image();
    let dir = tempfile::tempdir().unwrap();
    let name = format!(
        "bundlevisor-pod-test-{}",
        dir.path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('.')
    );

    let mut run = podman();
    run.args(["run", "-d", "--name", &name, "--hostname", pod_name]);
    // The pod's and the container's securityContext.
    let user = &pod["securityContext"];
    if let (Some(uid), Some(gid)) = (user["runAsUser"].as_u64(), user["runAsGroup"].as_u64()) {
        run.arg(format!("--user={uid}:{gid}"));
    }
    if security["readOnlyRootFilesystem"] == true {
        run.arg("--read-only");
    }
    if security["allowPrivilegeEscalation"] == false {
        run.args(["--security-opt", "no-new-privileges"]);
    }
    for cap in security["capabilities"]["drop"].as_array().unwrap() {
        run.arg(format!("--cap-drop={}", cap.as_str().unwrap()));
    }
    for cap in security["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
    {
        run.arg(format!("--cap-add={}", cap.as_str().unwrap()));
    }
    // What containerd gives a container (podman's own defaults are above
    // this host's hard limits).
    run.args([
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=8192:8192",
    ]);
    if let Some(limit) = container["resources"]["limits"]["memory"].as_str() {
        run.arg(format!(
            "--memory={}",
            limit.replace("Gi", "g").replace("Mi", "m")
        ));
    }
    run.args(["-e", &format!("POD_NAME={pod_name}")]);
    // Its volumes, as kubelet makes them.
    let volumes = pod["volumes"].as_array().unwrap();
    for mount in container["volumeMounts"].as_array().unwrap() {
        let (volume, path) = (
            mount["name"].as_str().unwrap(),
            mount["mountPath"].as_str().unwrap(),
        );
        let host = dir.path().join(volume);
        std::fs::create_dir_all(&host).unwrap();
        let source = volumes.iter().find(|v| v["name"] == volume);
        match source {
            // An emptyDir: 0777, writable.
            Some(v) if v.get("emptyDir").is_some() => {
                run.args(["--tmpfs", &format!("{path}:rw,mode=0777")]);
                continue;
            }
            // A ConfigMap: its files, in a 0777 folder, read-only.
            Some(v) if v.get("configMap").is_some() => {
                let map = v["configMap"]["name"].as_str().unwrap();
                for (file, text) in kind(&docs, "ConfigMap", map)["data"].as_object().unwrap() {
                    std::fs::write(host.join(file), text.as_str().unwrap()).unwrap();
                }
                std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o777)).unwrap();
            }
            // The state claim (volumeClaimTemplates): a fresh volume.
            _ => assert_eq!(volume, "state"),
        }
        let ro = if mount["readOnly"] == true { ":ro" } else { "" };
        run.args(["-v", &format!("{}:{path}{ro}", host.display())]);
    }
    // The attacker: a bundle in the workspace's folder, its tools in /opt.
    let watched = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| Path::new(m["mountPath"].as_str().unwrap()) == config.watch[0].dir)
        .map(|m| dir.path().join(m["name"].as_str().unwrap()))
        .unwrap();
    let notes: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(watched.join("notes.json")).unwrap())
            .unwrap();
    let mut attack = notes.clone();
    attack["name"] = "attack".into();
    attack["server"]["mcp_config"]["command"] = "/bin/sh".into();
    attack["server"]["mcp_config"]["args"] = serde_json::json!(["/opt/attack/attack.sh"]);
    std::fs::write(watched.join("attack.json"), attack.to_string()).unwrap();
    let tools = dir.path().join("attack");
    std::fs::create_dir(&tools).unwrap();
    std::fs::copy("/bin/busybox", tools.join("busybox"))
        .expect("busybox-static: run `make container-base`");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pod/attack.sh"),
        tools.join("attack.sh"),
    )
    .unwrap();
    run.args(["-v", &format!("{}:/opt/attack:ro", tools.display())]);
    run.arg(image);
    for arg in container["args"].as_array().unwrap() {
        run.arg(arg.as_str().unwrap().replace("$(POD_NAME)", pod_name));
    }
    let out = run.output().unwrap();
    assert!(
        out.status.success(),
        "podman run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pod = Container(name);

    // Both bundles come up, each under a uid of its own from the pod's range.
    let status = common::wait_for(Duration::from_secs(60), "both bundles ready", || {
        let (ok, out, _) = pod.exec(&["bundlevisor", "status", "--json"]);
        let status: serde_json::Value = serde_json::from_str(&out).ok().filter(|_| ok)?;
        let bundles = status["bundles"].as_array()?;
        (bundles.len() == 2 && bundles.iter().all(|b| b["state"] == "ready")).then_some(status)
    });
    let bundle = |name: &str| {
        status["bundles"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap()
            .clone()
    };
    let (notes, attacker) = (bundle("notes"), bundle("attack"));
    let range = config.sandbox.uid_range;
    for b in [&notes, &attacker] {
        let uid = b["sandbox"]["uid"].as_u64().unwrap() as u32;
        assert!(range.contains(uid), "{uid} not in {range}: {b:#}");
        // No cgroup to write in the pod: the own uid holds the tree and
        // its pids_max.
        let containment = b["sandbox"]["containment"].as_str().unwrap();
        assert!(
            containment.starts_with("process group and own uid"),
            "{containment}"
        );
        assert!(
            b["sandbox"]["limits"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l.as_str().unwrap().contains("as RLIMIT_NPROC")),
            "{b:#}"
        );
    }
    assert_ne!(notes["sandbox"]["uid"], attacker["sandbox"]["uid"]);
    assert!(pod
        .cli(&[
            "call",
            "-w",
            &workspace,
            "notes",
            "echo",
            r#"{"text":"from root"}"#
        ])
        .contains("from root"));

    // What the attacker tried, as it said it.
    let lines = common::wait_for(Duration::from_secs(60), "the attacker done", || {
        let (_, out, err) = pod.exec(&[
            "bundlevisor",
            "logs",
            "-n",
            "200",
            "-w",
            &workspace,
            "attack",
        ]);
        let text = out + &err;
        text.contains("ATTACK done").then_some(text)
    });
    let attempts: Vec<(&str, &str)> = lines
        .lines()
        .filter_map(|l| l.split_once("ATTACK ").map(|(_, a)| a))
        .filter_map(|a| a.split_once(' '))
        .collect();
    let attempt = |name: &str| {
        attempts
            .iter()
            .find(|(n, _)| *n == name || n.starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no attempt {name} in:\n{lines}"))
    };
    // Failed, saying one of `says` (the kernel's words for the refusal).
    let failed = |name: &str, says: &[&str]| {
        let (_, result) = attempt(name);
        assert!(!result.starts_with("rc=0 "), "{name} succeeded: {result}");
        assert!(says.iter().any(|s| result.contains(s)), "{name}: {result}");
    };
    failed("control", &["Permission denied"]);
    failed("key", &["Permission denied"]);
    failed("environ", &["Permission denied"]);
    failed("other-data", &["Permission denied"]);
    failed("other-kill", &["Operation not permitted"]);
    failed("daemon-kill", &["Operation not permitted"]);
    failed("state-write", &["Permission denied"]);
    failed(
        "image-write",
        &["Read-only file system", "Permission denied"],
    );
    let ip = pod.inspect("{{.NetworkSettings.IPAddress}}");
    assert!(!ip.is_empty());
    for host in ["127.0.0.1", ip.as_str()] {
        for what in ["healthz", "metrics", "mcp"] {
            failed(&format!("{what}@{host}"), &["403 Forbidden"]);
        }
    }
    // The other bundle was not touched (the pid it tried is the one that
    // still runs), and nothing got into the workspace's files.
    let (other, _) = attempt("other-kill");
    let tried: u64 = other.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(Some(tried), notes["pid"].as_u64());
    let now: serde_json::Value =
        serde_json::from_str(&pod.cli(&["status", "--json", "-w", &workspace])).unwrap();
    let notes_now = now["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "notes")
        .unwrap();
    assert_eq!(notes_now["pid"], notes["pid"]);
    assert_eq!(notes_now["restarts"], 0);
    let files: serde_json::Value =
        serde_json::from_str(&pod.cli(&["files", "ls", "-w", &workspace, "--json"])).unwrap();
    assert_eq!(files["files"].as_array().map(Vec::len), Some(0), "{files}");

    // kubelet's probes come from outside the pod, and are answered.
    for path in ["/healthz", "/readyz"] {
        let answer = common::http_get_at((ip.as_str(), 9464), path);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
    }

    // SIGTERM (what kubelet sends) stops the bundles and the daemon.
    let out = podman()
        .args(["stop", "-t", "30", &pod.0])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(pod.inspect("{{.State.ExitCode}}"), "0", "{}", pod.logs());
}
