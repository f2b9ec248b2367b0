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
//! their `files://` URIs. Two schemes whose clients insist on them keep
//! their scheme, the bundle as the first path segment: MCP Apps' `ui://X/Y`
//! is `ui://BUNDLE/X/Y` (ext-apps refuses a UI resource that is not
//! `ui://`), Skills' `skill://P/SKILL.md` is `skill://BUNDLE/P/SKILL.md`
//! (the skill's last path segment stays its name, as SEP-2640 requires).
//!
//! A resource template is mapped the same way, its expressions (`{id}`)
//! kept as they are so that an agent can still expand it.
//!
//! [`Naming::Single`] is one bundle as itself: every name and URI as the
//! bundle gave it (the per-bundle endpoint).

use std::collections::{BTreeMap, HashSet};

pub const SEPARATOR: &str = "__";
pub const BUNDLE_URI_PREFIX: &str = "bundle://";

/// URI schemes kept as they are, the bundle put first in their path.
const KEPT_SCHEMES: [&str; 2] = ["ui://", "skill://"];

/// How a gateway names what its bundles offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// The workspace's bundles together: `BUNDLE__NAME`, `bundle://…`.
    Prefixed,
    /// One bundle, exactly as it names things.
    Single(String),
    /// The workspace's bundles together, tools and prompts under their own
    /// names (a profile's `names = "bare"`); a name two bundles share is
    /// given both of them prefixed, never to one of them silently.
    /// URIs are mapped as [`Naming::Prefixed`] maps them.
    Bare,
}

impl Naming {
    /// The naming of an endpoint: one bundle as itself, or the workspace
    /// under its profile's name mode.
    pub fn of(bundle: Option<String>, profile: Option<&crate::config::Profile>) -> Naming {
        match (bundle, profile.map(|p| p.names)) {
            (Some(bundle), _) => Naming::Single(bundle),
            (None, Some(crate::config::NameMode::Bare)) => Naming::Bare,
            (None, _) => Naming::Prefixed,
        }
    }

    /// The names (tools, prompts) of `(bundle, name)` pairs.
    pub fn entries(&self, pairs: impl IntoIterator<Item = (String, String)>) -> Vec<Entry> {
        match self {
            Naming::Prefixed => namespace(pairs),
            Naming::Single(_) => pairs.into_iter().map(own_name).collect(),
            Naming::Bare => {
                let pairs: Vec<(String, String)> = pairs.into_iter().collect();
                let shared = shared_names(&pairs);
                let (clashing, own): (Vec<_>, Vec<_>) = pairs
                    .into_iter()
                    .partition(|(_, name)| shared.contains(name));
                for name in &shared {
                    tracing::warn!(name, "a profile with bare names has two bundles that share this name: both are shown prefixed (BUNDLE__NAME)");
                }
                let mut entries: Vec<Entry> = own.into_iter().map(own_name).collect();
                // A prefixed name never takes one a bundle has bare.
                let taken: HashSet<String> = entries.iter().map(|e| e.exposed.clone()).collect();
                entries.extend(namespace_around(clashing, taken));
                entries
            }
        }
    }

    /// The URI (or URI template) agents see for `uri` of `bundle`.
    pub fn uri(&self, bundle: &str, uri: &str) -> String {
        match self {
            Naming::Single(_) => uri.to_string(),
            Naming::Prefixed | Naming::Bare => {
                match KEPT_SCHEMES.iter().find(|s| uri.starts_with(*s)) {
                    Some(scheme) => format!("{scheme}{bundle}/{}", &uri[scheme.len()..]),
                    None => bundle_uri(bundle, uri),
                }
            }
        }
    }

    /// The bundle and its own URI of a URI agents were given, if it names
    /// one (the workspace's `files://` URIs do not).
    pub fn route_uri(&self, uri: &str) -> Option<(String, String)> {
        match self {
            Naming::Single(bundle) => Some((bundle.clone(), uri.to_string())),
            Naming::Prefixed | Naming::Bare => {
                match KEPT_SCHEMES.iter().find(|s| uri.starts_with(*s)) {
                    Some(scheme) => {
                        let (bundle, rest) = uri[scheme.len()..].split_once('/')?;
                        (!bundle.is_empty())
                            .then(|| (bundle.to_string(), format!("{scheme}{rest}")))
                    }
                    None => parse_bundle_uri(uri),
                }
            }
        }
    }

    /// The URI template agents see for `template` of `bundle`: literal
    /// parts mapped as [`Self::uri`] maps URIs, `{…}` expressions kept, so
    /// the expanded template routes back by [`Self::route_uri`].
    pub fn template(&self, bundle: &str, template: &str) -> String {
        match self {
            Naming::Single(_) => template.to_string(),
            _ if KEPT_SCHEMES.iter().any(|s| template.starts_with(*s)) => {
                self.uri(bundle, template)
            }
            Naming::Prefixed | Naming::Bare => {
                let mut out = format!("{BUNDLE_URI_PREFIX}{bundle}/");
                let mut rest = template;
                while !rest.is_empty() {
                    let (literal, after) = match rest.find('{') {
                        Some(i) => rest.split_at(i),
                        None => (rest, ""),
                    };
                    out.extend(url::form_urlencoded::byte_serialize(literal.as_bytes()));
                    let (expression, after) = match after.find('}') {
                        Some(j) => after.split_at(j + 1),
                        None => (after, ""),
                    };
                    out.push_str(expression);
                    rest = after;
                }
                out
            }
        }
    }
}

/// One exposed item: its namespaced name and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub exposed: String,
    pub bundle: String,
    pub name: String,
}

/// Namespaces `(bundle, name)` pairs with the collision rule above.
pub fn namespace(pairs: impl IntoIterator<Item = (String, String)>) -> Vec<Entry> {
    namespace_around(pairs, HashSet::new())
}

/// [`namespace`], no exposed name taking one of `used`.
fn namespace_around(
    pairs: impl IntoIterator<Item = (String, String)>,
    mut used: HashSet<String>,
) -> Vec<Entry> {
    let mut pairs: Vec<(String, String)> = pairs.into_iter().collect();
    pairs.sort();
    pairs.dedup();
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

/// Whether `profile` (none: every bundle) shows `bundle`.
pub fn profile_allows(profile: Option<&crate::config::Profile>, bundle: &str) -> bool {
    profile
        .and_then(|p| p.bundles.as_ref())
        .is_none_or(|allowed| allowed.iter().any(|b| b == bundle))
}

/// An item under its bundle's own name.
fn own_name((bundle, name): (String, String)) -> Entry {
    Entry {
        exposed: name.clone(),
        bundle,
        name,
    }
}

/// The names more than one bundle uses.
pub fn shared_names(pairs: &[(String, String)]) -> std::collections::BTreeSet<String> {
    let mut bundles_of: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for (bundle, name) in pairs {
        bundles_of.entry(name).or_default().insert(bundle);
    }
    bundles_of
        .into_iter()
        .filter(|(_, bundles)| bundles.len() > 1)
        .map(|(name, _)| name.to_string())
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
    // Form-decoded whole: an `&` or `=` an agent expanded into a template
    // (`?q=x&lang=en`) is part of the URI, not a separator.
    let plus_as_space = encoded.replace('+', " ");
    let original = percent_encoding::percent_decode_str(&plus_as_space)
        .decode_utf8()
        .ok()?
        .into_owned();
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
    fn ui_and_skill_uris_keep_their_scheme_and_route_back() {
        let n = Naming::Prefixed;
        let ui = n.uri("basic", "ui://get-time/mcp-app.html");
        assert_eq!(ui, "ui://basic/get-time/mcp-app.html");
        let back = n.route_uri(&ui);
        assert_eq!(
            back,
            Some(("basic".into(), "ui://get-time/mcp-app.html".into()))
        );
        let skill = n.uri("nb", "skill://release-notes/SKILL.md");
        assert_eq!(skill, "skill://nb/release-notes/SKILL.md");
        assert_eq!(
            n.route_uri(&skill),
            Some(("nb".into(), "skill://release-notes/SKILL.md".into()))
        );
        assert_eq!(n.route_uri("ui://"), None);
        assert_eq!(n.route_uri("files://fl_1"), None);
    }

    #[test]
    fn templates_keep_their_expressions_and_expand_to_routable_uris() {
        let n = Naming::Prefixed;
        let t = n.template("everything", "demo://resource/dynamic/text/{resourceId}");
        assert_eq!(
            t,
            "bundle://everything/demo%3A%2F%2Fresource%2Fdynamic%2Ftext%2F{resourceId}"
        );
        let expanded = t.replace("{resourceId}", "42");
        assert_eq!(
            n.route_uri(&expanded),
            Some((
                "everything".into(),
                "demo://resource/dynamic/text/42".into()
            ))
        );
        let query = n.template("b", "demo://search{?q,lang}");
        let expanded = query.replace("{?q,lang}", "?q=x&lang=en");
        assert_eq!(
            n.route_uri(&expanded),
            Some(("b".into(), "demo://search?q=x&lang=en".into()))
        );
        let ui = n.template("b", "ui://{name}/app.html");
        assert_eq!(ui, "ui://b/{name}/app.html");
        let single = Naming::Single("b".into());
        assert_eq!(single.template("b", "test://{id}"), "test://{id}");
        assert_eq!(
            single.route_uri("test://7"),
            Some(("b".into(), "test://7".into()))
        );
    }

    #[test]
    fn bare_names_are_the_bundles_own_and_a_shared_one_is_prefixed_for_both() {
        let e = Naming::Bare.entries(pairs(&[
            ("demo", "echo"),
            ("demo", "sleep"),
            ("reader", "echo"),
            ("reader", "read"),
        ]));
        let mut got: Vec<(&str, &str, &str)> = e
            .iter()
            .map(|e| (e.exposed.as_str(), e.bundle.as_str(), e.name.as_str()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("demo__echo", "demo", "echo"),
                ("read", "reader", "read"),
                ("reader__echo", "reader", "echo"),
                ("sleep", "demo", "sleep"),
            ]
        );
        // A prefixed name never lands on a bare one: bundle `x`'s own
        // `a__b`, and `b` shared by `a` and `c`.
        let e = Naming::Bare.entries(pairs(&[("x", "a__b"), ("a", "b"), ("c", "b")]));
        let exposed: HashSet<&str> = e.iter().map(|e| e.exposed.as_str()).collect();
        assert_eq!(exposed.len(), 3, "{e:?}");
        assert!(
            exposed.contains("a__b") && exposed.contains("a__b__2"),
            "{e:?}"
        );
        assert_eq!(
            Naming::Bare.uri("demo", "test://x"),
            "bundle://demo/test%3A%2F%2Fx"
        );
    }

    #[test]
    fn one_bundle_keeps_its_names() {
        let n = Naming::Single("demo".into());
        let e = n.entries(pairs(&[("demo", "echo")]));
        assert_eq!(e[0].exposed, "echo");
        assert_eq!(n.uri("demo", "test://x"), "test://x");
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
