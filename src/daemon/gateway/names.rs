//! Namespacing of bundle tools, prompts and resources in the gateway.
//!
//! A tool `echo` of bundle `demo` is `demo__echo`. Names can collide only
//! when a bundle or tool name itself contains `__` (`a__b` + `c` and `a` +
//! `b__c`). The rule: entries are taken in (bundle, name) order; the first
//! keeps `BUNDLE__NAME`, each later one gets the first free of
//! `BUNDLE__NAME__2`, `__3`, ... — stable for a given set of bundles.
//!
//! A bundle resource's URI `U` becomes `bundle://BUNDLE/ENC(U)`, `ENC` being
//! form-urlencoding, so any URI maps back exactly; workspace files keep
//! their `files://` URIs.

use std::collections::{BTreeMap, HashSet};

pub const SEPARATOR: &str = "__";
pub const BUNDLE_URI_PREFIX: &str = "bundle://";

/// One exposed item: its namespaced name and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub exposed: String,
    pub bundle: String,
    pub name: String,
}

/// Namespaces `(bundle, name)` pairs with the collision rule above.
pub fn namespace(pairs: impl IntoIterator<Item = (String, String)>) -> Vec<Entry> {
    let mut pairs: Vec<(String, String)> = pairs.into_iter().collect();
    pairs.sort();
    pairs.dedup();
    let mut used = HashSet::new();
    pairs
        .into_iter()
        .map(|(bundle, name)| {
            let base = format!("{bundle}{SEPARATOR}{name}");
            let mut exposed = base.clone();
            let mut n = 2;
            while !used.insert(exposed.clone()) {
                exposed = format!("{base}{SEPARATOR}{n}");
                n += 1;
            }
            Entry {
                exposed,
                bundle,
                name,
            }
        })
        .collect()
}

/// Exposed name → entry.
pub fn index(entries: &[Entry]) -> BTreeMap<String, Entry> {
    entries
        .iter()
        .map(|e| (e.exposed.clone(), e.clone()))
        .collect()
}

pub fn bundle_uri(bundle: &str, uri: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(uri.as_bytes()).collect();
    format!("{BUNDLE_URI_PREFIX}{bundle}/{encoded}")
}

/// `(bundle, original URI)` of a `bundle://` URI.
pub fn parse_bundle_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(BUNDLE_URI_PREFIX)?;
    let (bundle, encoded) = rest.split_once('/')?;
    let query = format!("u={encoded}");
    let original = url::form_urlencoded::parse(query.as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())?;
    (!bundle.is_empty()).then(|| (bundle.to_string(), original))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn tools_are_prefixed_with_their_bundle() {
        let e = namespace(pairs(&[("demo", "echo"), ("reader", "echo")]));
        let names: Vec<&str> = e.iter().map(|e| e.exposed.as_str()).collect();
        assert_eq!(names, ["demo__echo", "reader__echo"]);
    }

    #[test]
    fn collisions_get_numbered_suffixes_in_a_stable_order() {
        // "a" + "b__c" and "a__b" + "c" both make "a__b__c".
        let e = namespace(pairs(&[("a__b", "c"), ("a", "b__c"), ("a", "b__c__2")]));
        let got: Vec<(&str, &str, &str)> = e
            .iter()
            .map(|e| (e.exposed.as_str(), e.bundle.as_str(), e.name.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a__b__c", "a", "b__c"),
                ("a__b__c__2", "a", "b__c__2"),
                ("a__b__c__3", "a__b", "c"),
            ]
        );
        let idx = index(&e);
        assert_eq!(idx.len(), 3, "every exposed name is unique");
    }

    #[test]
    fn bundle_uris_round_trip_any_uri() {
        for uri in ["file:///tmp/a b.txt", "custom://x/y?z=1&w=%20", "plain"] {
            let wrapped = bundle_uri("demo", uri);
            assert!(wrapped.starts_with("bundle://demo/"), "{wrapped}");
            assert_eq!(
                parse_bundle_uri(&wrapped),
                Some(("demo".to_string(), uri.to_string()))
            );
        }
        assert_eq!(parse_bundle_uri("files://fl_1"), None);
        assert_eq!(parse_bundle_uri("bundle://nobundle"), None);
    }
}
