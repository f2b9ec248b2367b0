//! The host-resources request parser (what a bundle sends): any params of
//! either method parse to a request or to one of the contract's errors.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(params) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for method in [
        bundlevisor::host_resources::METHOD_READ,
        bundlevisor::host_resources::METHOD_LIST,
    ] {
        if let Err(e) = bundlevisor::host_resources::parse(method, Some(&params)) {
            assert!(
                [-32602, -32002, -32601].contains(&e.code),
                "unexpected error code {}",
                e.code
            );
        }
    }
});
