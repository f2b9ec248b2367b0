//! The Kubernetes deployment (deploy/base, a Kustomize base): rendered with
//! `kubectl kustomize`, validated against the Kubernetes schemas with the
//! pinned kubernetes-validate (`make k8s-validate`), and checked for what
//! docs/scaling.md promises: a StatefulSet with a volume per pod, non-root,
//! liveness and readiness on the ops endpoints, each workspace's watched
//! folder from a ConfigMap, and each workspace's Ingress path sent to the
//! pod whose config serves it. The daemon configs and bundle files in it are
//! the daemon's own: they load.

use std::path::Path;
use std::process::Command;

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
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
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
