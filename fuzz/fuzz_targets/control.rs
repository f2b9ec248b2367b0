//! The control-protocol decoder: request envelopes (as the daemon reads
//! them) and responses/notifications (as clients read them).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
        if let Ok(request) = bundlevisor::protocol::Request::from_value(value) {
            // Every params type the daemon decodes.
            let p = request.params;
            let _ = serde_json::from_value::<bundlevisor::protocol::CallParams>(p.clone());
            let _ = serde_json::from_value::<bundlevisor::protocol::ConfigureParams>(p.clone());
            let _ = serde_json::from_value::<bundlevisor::protocol::InstallParams>(p.clone());
            let _ = serde_json::from_value::<bundlevisor::protocol::McpParams>(p.clone());
            let _ = serde_json::from_value::<bundlevisor::protocol::AuthCompleteParams>(p);
        }
    }
    let _ = bundlevisor::protocol::Incoming::parse(text);
});
