//! MIME types of workspace files. The one `is_text_mime` predicate decides,
//! everywhere (the host-resources resolver, the gateway, the CLI), whether
//! content travels as `text` or as a base64 `blob`.

/// MIME type from an explicit choice, else the file name's extension, else
/// the content (magic numbers; valid UTF-8 without NUL is `text/plain`).
pub fn detect(explicit: Option<&str>, filename: &str, head: &[u8]) -> String {
    if let Some(m) = explicit.map(str::trim).filter(|m| !m.is_empty()) {
        return m.to_ascii_lowercase();
    }
    if let Some(m) = by_extension(filename) {
        return m.to_string();
    }
    sniff(head).to_string()
}

fn by_extension(filename: &str) -> Option<&'static str> {
    let ext = filename.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "wasm" => "application/wasm",
        "bin" => "application/octet-stream",
        _ => return None,
    })
}

fn sniff(head: &[u8]) -> &'static str {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
        (b"\0asm", "application/wasm"),
    ];
    if let Some((_, m)) = MAGIC.iter().find(|(magic, _)| head.starts_with(magic)) {
        return m;
    }
    // A cut at the end of `head` may split a UTF-8 sequence: allow that.
    let text = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none() && e.valid_up_to() + 4 > head.len(),
    };
    if text && !head.contains(&0) {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// Whether content of this MIME type is sent as text (else base64).
pub fn is_text_mime(mime: &str) -> bool {
    let essence = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind == "text"
        || sub.ends_with("+json")
        || sub.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/json"
                | "application/x-ndjson"
                | "application/xml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/toml"
                | "application/javascript"
                | "application/ecmascript"
                | "application/sql"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_then_extension_then_content() {
        assert_eq!(detect(Some("Text/CSV"), "x.bin", b"\0"), "text/csv");
        assert_eq!(detect(None, "data.JSON", b"\0\0"), "application/json");
        assert_eq!(detect(None, "noext", b"\x89PNG\r\n\x1a\nrest"), "image/png");
        assert_eq!(detect(None, "noext", "héllo".as_bytes()), "text/plain");
        assert_eq!(
            detect(None, "noext", b"\x00\x01\x02"),
            "application/octet-stream"
        );
        // A multi-byte character cut by the sniff window is still text.
        assert_eq!(detect(None, "noext", &"aé".as_bytes()[..2]), "text/plain");
    }

    #[test]
    fn text_mimes_are_text_and_binary_ones_are_not() {
        for m in [
            "text/plain",
            "text/csv; charset=utf-8",
            "application/json",
            "application/ld+json",
            "image/svg+xml",
            "application/yaml",
        ] {
            assert!(is_text_mime(m), "{m}");
        }
        for m in [
            "image/png",
            "application/octet-stream",
            "application/pdf",
            "application/zip",
            "",
            "garbage",
        ] {
            assert!(!is_text_mime(m), "{m}");
        }
    }
}
