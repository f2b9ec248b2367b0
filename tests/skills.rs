//! Issue 33, point 2: Skills (SEP-2640) reach agents through the gateway.
//! A bundle serves a skill with the published `nimblebrain-bundle-sdk`
//! 0.2.0 (`SkillsExtension` on FastMCP; tests/skills, built with its own
//! virtual environment by `make skills-bundle`). Through the workspace
//! endpoint the gateway declares the extension, aggregates `skills/list`
//! and `skills/get` under `skill://BUNDLE/…` (the skill's last path segment
//! still its name), and each file listed is readable by that URI; through
//! the per-bundle endpoint the bundle's own URIs are kept. Before, both
//! methods answered -32601 and the files were only `bundle://…` resources.

mod common;

use std::path::PathBuf;

use common::{free_port, Daemon};
use rmcp::model::{GetSkillRequestParams, ReadResourceRequestParams, SkillResources};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;

/// The skills bundle, built by `make skills-bundle` (tests/skills).
fn skills_bundle() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/nb-skills-bundle");
    assert!(
        dir.join(".installed").exists(),
        "{} is not built; run `make skills-bundle` (make test does)",
        dir.display()
    );
    dir
}

async fn agent(url: String, token: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(transport).await.unwrap()
}

/// The text of resource `uri`, read by `peer`.
async fn text_of(peer: &rmcp::Peer<rmcp::RoleClient>, uri: &str) -> String {
    let read = peer
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    let contents = serde_json::to_value(&read).unwrap()["contents"][0].clone();
    contents["text"].as_str().unwrap_or_default().to_string()
}

/// The same agent on MCP 2026-07-28 (stateless requests).
async fn agent_2026(
    url: String,
    token: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    use rmcp::ClientServiceExt;
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token.to_string());
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let discover = rmcp::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    ().serve_with_lifecycle(transport, discover).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_reach_agents_under_uris_that_name_their_bundle() {
    let port = free_port();
    let d = Daemon::start_with(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    let folder = skills_bundle();
    tokio::task::block_in_place(|| d.ok(&["install", folder.to_str().unwrap()]));
    let token = tokio::task::block_in_place(|| d.ok(&["token", "create"]))
        .trim()
        .to_string();

    let workspace = agent(format!("http://127.0.0.1:{port}/mcp/default"), &token).await;
    let declared = workspace.peer().peer_info().unwrap();
    assert!(
        declared.capabilities.supports_skills(),
        "{:?}",
        declared.capabilities
    );
    let listed = workspace.peer().list_skills(None).await.unwrap();
    let uris: Vec<&str> = listed.skills.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["skill://nb-skills/release-notes/SKILL.md"]);
    let skill = &listed.skills[0];
    assert_eq!(skill.frontmatter.name, "release-notes");
    let SkillResources::Files(files) = &skill.resources else {
        panic!("the SDK lists its files: {skill:?}")
    };
    let mut file_uris: Vec<&str> = files.iter().map(|f| f.uri.as_str()).collect();
    file_uris.sort();
    assert_eq!(
        file_uris,
        [
            "skill://nb-skills/release-notes/SKILL.md",
            "skill://nb-skills/release-notes/template.md"
        ]
    );
    let got = workspace
        .peer()
        .get_skill(GetSkillRequestParams::new(skill.uri.clone()))
        .await
        .unwrap();
    assert_eq!(got.skill.uri, skill.uri);
    for file in files {
        let read = workspace
            .peer()
            .read_resource(ReadResourceRequestParams::new(file.uri.clone()))
            .await
            .unwrap();
        let contents = serde_json::to_value(&read).unwrap()["contents"][0].clone();
        assert_eq!(contents["uri"], file.uri.as_str(), "{contents}");
        let text = contents["text"].as_str().unwrap_or_default();
        assert_eq!(text.len() as u64, file.size, "{contents}");
    }
    let unknown = workspace
        .peer()
        .get_skill(GetSkillRequestParams::new(
            "skill://nb-skills/nosuch/SKILL.md",
        ))
        .await
        .expect_err("no such skill");
    assert!(unknown.to_string().contains("nosuch"), "{unknown}");
    workspace.cancel().await.unwrap();

    // The bundle as itself keeps its own URIs.
    let own = agent(
        format!("http://127.0.0.1:{port}/mcp/default/bundle/nb-skills"),
        &token,
    )
    .await;
    let listed = own.peer().list_skills(None).await.unwrap();
    let uris: Vec<&str> = listed.skills.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["skill://release-notes/SKILL.md"]);
    assert_eq!(
        text_of(own.peer(), "skill://release-notes/template.md").await,
        "## Version {version}\n"
    );
    own.cancel().await.unwrap();

    // The same on MCP 2026-07-28.
    let modern = agent_2026(format!("http://127.0.0.1:{port}/mcp/default"), &token).await;
    let listed = modern.peer().list_skills(None).await.unwrap();
    let uris: Vec<&str> = listed.skills.iter().map(|s| s.uri.as_str()).collect();
    assert_eq!(uris, ["skill://nb-skills/release-notes/SKILL.md"]);
    let got = modern
        .peer()
        .get_skill(GetSkillRequestParams::new(uris[0]))
        .await
        .unwrap();
    assert_eq!(got.skill.frontmatter.name, "release-notes");
    assert_eq!(
        text_of(modern.peer(), "skill://nb-skills/release-notes/template.md").await,
        "## Version {version}\n"
    );
    modern.cancel().await.unwrap();
}
