//! The guard on a bundle's stdout: arbitrary output either passes through
//! unchanged or is cut with a recorded reason, and never more than the
//! limit of one line is let through before a violation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncReadExt;

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let violation = bundlevisor::bundle::guard::Violation::default();
        let mut guarded = bundlevisor::bundle::guard::Guarded::new(data, 256, violation.clone());
        let mut out = Vec::new();
        match guarded.read_to_end(&mut out).await {
            Ok(_) => {
                assert_eq!(out, data);
                assert!(violation.get().is_none());
            }
            Err(_) => {
                assert!(violation.get().is_some());
                assert!(data.starts_with(&out));
            }
        }
    });
});
