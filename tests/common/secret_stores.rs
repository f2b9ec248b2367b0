//! Fakes of the two cloud secret stores the daemon reads references from,
//! each following its documented HTTP API (no cloud is reachable here):
//!
//! - GCP Secret Manager: `GET /v1/projects/P/secrets/S/versions/V:access`
//!   with `Authorization: Bearer TOKEN`, answering `{"name", "payload":
//!   {"data": BASE64, "dataCrc32c": "DECIMAL"}}`; and the metadata server's
//!   `GET /computeMetadata/v1/instance/service-accounts/default/token`
//!   (only with `Metadata-Flavor: Google`).
//! - Vault / OpenBao KV version 2: `GET /v1/MOUNT/data/PATH[?version=N]`
//!   with `X-Vault-Token`, answering `{"data": {"data": {...},
//!   "metadata": {"version": N, ...}}}`.
//!
//! Unknown secrets are 404 and a wrong token 403, as both stores answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
pub struct Stores {
    /// `projects/P/secrets/S/versions/V` → value (`latest` is looked up as written).
    pub gcp: HashMap<String, String>,
    /// `MOUNT/PATH` → the versions' fields, version 1 first.
    pub vault: HashMap<String, Vec<HashMap<String, String>>>,
    /// `MOUNT/PATH` → the status Vault answers it with instead (a sealed
    /// or overloaded Vault's 503, a standby's 307 to the active node).
    pub vault_status: HashMap<String, u16>,
    /// Secret Manager's payloads come with a wrong `dataCrc32c`.
    pub gcp_bad_crc: bool,
    /// The `X-Vault-Namespace` of Vault's last request.
    pub vault_namespace: Option<String>,
    /// Requests that reached each store.
    pub gcp_reads: usize,
    pub vault_reads: usize,
    pub metadata_tokens: usize,
}

pub const GCP_TOKEN: &str = "ya29.fake-gcp-access-token";
pub const VAULT_TOKEN: &str = "hvs.fake-vault-token";

pub struct Fake {
    pub url: String,
    pub stores: Arc<Mutex<Stores>>,
    ct: CancellationToken,
    _rt: tokio::runtime::Runtime,
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl Fake {
    /// Both stores and the metadata server, on one loopback port.
    pub fn start() -> Fake {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let stores = Arc::new(Mutex::new(Stores::default()));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let app = Router::new()
            .route(
                "/computeMetadata/v1/instance/service-accounts/default/token",
                get(metadata_token),
            )
            .route(
                "/v1/projects/{project}/secrets/{secret}/versions/{version}",
                get(gcp_access),
            )
            .route("/v1/{mount}/data/{*path}", get(vault_read))
            .with_state(stores.clone());
        let ct = CancellationToken::new();
        let stop = ct.clone();
        rt.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .unwrap();
        });
        Fake {
            url,
            stores,
            ct,
            _rt: rt,
        }
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut Stores) -> T) -> T {
        f(&mut self.stores.lock().unwrap())
    }
}

async fn metadata_token(State(s): State<Arc<Mutex<Stores>>>, headers: HeaderMap) -> Response {
    if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
        return (StatusCode::FORBIDDEN, "Missing Metadata-Flavor: Google").into_response();
    }
    s.lock().unwrap().metadata_tokens += 1;
    Json(json!({"access_token": GCP_TOKEN, "expires_in": 3599, "token_type": "Bearer"}))
        .into_response()
}

async fn gcp_access(
    State(s): State<Arc<Mutex<Stores>>>,
    Path((project, secret, version)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    // The route's last segment is `V:access`.
    let Some(version) = version.strip_suffix(":access") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let bearer = format!("Bearer {GCP_TOKEN}");
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(bearer.as_str()) {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"error": {"code": 403, "status": "PERMISSION_DENIED"}})),
        )
            .into_response();
    }
    let mut stores = s.lock().unwrap();
    stores.gcp_reads += 1;
    let name = format!("projects/{project}/secrets/{secret}/versions/{version}");
    let Some(value) = stores.gcp.get(&name) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"code": 404, "status": "NOT_FOUND"}})),
        )
            .into_response();
    };
    use base64::Engine as _;
    Json(json!({
        "name": name,
        "payload": {
            "data": base64::engine::general_purpose::STANDARD.encode(value),
            "dataCrc32c": (crc32c(value.as_bytes()) ^ u32::from(stores.gcp_bad_crc)).to_string(),
        }
    }))
    .into_response()
}

async fn vault_read(
    State(s): State<Arc<Mutex<Stores>>>,
    Path((mount, path)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if headers.get("x-vault-token").and_then(|v| v.to_str().ok()) != Some(VAULT_TOKEN) {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"errors": ["permission denied"]})),
        )
            .into_response();
    }
    let mut stores = s.lock().unwrap();
    stores.vault_reads += 1;
    stores.vault_namespace = headers
        .get("x-vault-namespace")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(&code) = stores.vault_status.get(&format!("{mount}/{path}")) {
        let status = StatusCode::from_u16(code).unwrap();
        return (
            status,
            [("location", "http://127.0.0.1:1/v1/elsewhere")],
            Json(json!({"errors": ["Vault is sealed"]})),
        )
            .into_response();
    }
    let versions = stores.vault.get(&format!("{mount}/{path}"));
    let wanted = query.get("version").and_then(|v| v.parse::<usize>().ok());
    let found = versions.and_then(|v| match wanted {
        Some(n) if n > 0 => v.get(n - 1).map(|d| (n, d)),
        Some(_) | None => v.last().map(|d| (v.len(), d)),
    });
    let Some((version, data)) = found else {
        return (StatusCode::NOT_FOUND, Json(json!({"errors": []}))).into_response();
    };
    Json(json!({
        "request_id": "fake",
        "data": {"data": data, "metadata": {"version": version, "destroyed": false}},
    }))
    .into_response()
}

/// CRC-32C, as Secret Manager's `dataCrc32c` (written here again: the
/// fake must not trust the daemon's).
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0x82F6_3B78 & mask);
        }
    }
    !crc
}
