//! The MCPB / remote-bundle manifest parser and validator: any text either
//! validates or yields problems with JSON paths; it never panics, and a
//! valid manifest resolves a plan without panicking.
#![no_main]

use std::collections::BTreeMap;
use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match bundlevisor::manifest::parse(text) {
        Ok(manifest) => {
            let _ = manifest.plan(Path::new("/b"), &BTreeMap::new());
            let _ = bundlevisor::manifest::gate(&manifest, &["ai.nimblebrain/host-resources"]);
        }
        Err(bundlevisor::manifest::ParseFailure::Invalid(problems)) => {
            assert!(!problems.is_empty(), "invalid without a problem");
        }
        Err(bundlevisor::manifest::ParseFailure::Json { .. }) => {}
    }
});
