//! Bundle and workspace names. Both become path components (log files,
//! actor names), so they are restricted to a safe alphabet.

/// Longest accepted name.
pub const MAX_NAME_LEN: usize = 64;

/// Checks that `value` is a usable name: 1–64 characters of ASCII letters,
/// digits, `.`, `_` and `-`, not starting with `.` or `-`.
pub fn check_name(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} name must be 1 to {MAX_NAME_LEN} characters, got {}",
            value.len()
        ));
    }
    if value.starts_with('.') || value.starts_with('-') {
        return Err(format!(
            "{what} name {value:?} must not start with '.' or '-'"
        ));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{what} name {value:?} contains {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn accepts_ordinary_names_and_refuses_path_like_ones() {
        for ok in ["demo", "my-bundle_2", "a.b"] {
            assert!(check_name("bundle", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            ".hidden",
            "a/b",
            "-x",
            "sp ace",
            &"x".repeat(65),
        ] {
            assert!(check_name("bundle", bad).is_err(), "{bad:?}");
        }
    }
}
