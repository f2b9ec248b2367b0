//! Shell completions and the man page come from the clap definitions, so
//! they list every subcommand the binary has. No daemon needed.

mod common;

use std::process::Command;

use common::BIN;

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const SUBCOMMANDS: &[&str] = &[
    "status",
    "install",
    "configure",
    "auth",
    "mcp",
    "files",
    "events",
];

#[test]
fn completions_generate_for_each_shell() {
    let bash = run(&["completions", "bash"]);
    let zsh = run(&["completions", "zsh"]);
    let fish = run(&["completions", "fish"]);
    assert!(zsh.starts_with("#compdef bundlevisor"), "{}", &zsh[..80]);
    assert!(fish.contains("complete -c bundlevisor"));
    for script in [&bash, &zsh, &fish] {
        for sub in SUBCOMMANDS {
            assert!(
                script.contains(sub),
                "{sub} missing from a completion script"
            );
        }
    }
    // The bash script is valid bash.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundlevisor.bash");
    std::fs::write(&file, &bash).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values"));
}

#[test]
fn the_man_page_documents_every_subcommand() {
    let page = run(&["man"]);
    assert!(page.contains(".TH bundlevisor 1"), "{}", &page[..200]);
    for sub in SUBCOMMANDS {
        assert!(page.contains(sub), "{sub} missing from the man page");
    }
}
