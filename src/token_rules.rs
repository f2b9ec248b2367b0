//! A token's own allow and deny rules over what the gateway offers
//! (docs/gateway.md, "Token policy"): `KIND:BUNDLE/NAME`, where KIND is
//! `tool`, `prompt`, `resource` or `*`, BUNDLE a bundle's name and NAME a
//! tool's or prompt's own name or a resource's own URI, both globs (`*`
//! any run of characters, `?` one). The workspace's files are the
//! resources of the bundle `@files` (`resource:@files/*`). Without a KIND
//! (`github/*`) a rule covers every kind.
//!
//! A deny rule that matches refuses; else, when the token has allow rules
//! for that kind, one of them must match. A refusal names the rule.

use std::fmt;

/// What an item of the gateway is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Prompt,
    Resource,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tool => "tool",
            Kind::Prompt => "prompt",
            Kind::Resource => "resource",
        }
    }
}

/// The bundle name rules give the workspace's own files.
pub const FILES: &str = "@files";

/// One rule, as written and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    text: String,
    kind: Option<Kind>,
    bundle: String,
    name: String,
}

impl Rule {
    /// Parses `KIND:BUNDLE/NAME` (see the module doc), or says what is wrong.
    pub fn parse(text: &str) -> Result<Rule, String> {
        let usage = "write KIND:BUNDLE/NAME, e.g. tool:github/create_*, prompt:*/*, resource:@files/*, or BUNDLE/NAME for every kind";
        let (kind, rest) = match text.split_once(':') {
            Some((kind, rest)) if !kind.contains('/') => {
                let kind = match kind {
                    "tool" | "tools" => Some(Kind::Tool),
                    "prompt" | "prompts" => Some(Kind::Prompt),
                    "resource" | "resources" => Some(Kind::Resource),
                    "*" => None,
                    other => {
                        return Err(format!(
                            "rule {text:?}: {other:?} is not a kind (tool, prompt, resource or *); {usage}"
                        ))
                    }
                };
                (kind, rest)
            }
            _ => (None, text),
        };
        let Some((bundle, name)) = rest.split_once('/') else {
            return Err(format!("rule {text:?} names no BUNDLE/NAME; {usage}"));
        };
        if bundle.is_empty() || name.is_empty() {
            return Err(format!(
                "rule {text:?} has an empty bundle or name (use * for any); {usage}"
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(format!("rule {text:?} holds a control character"));
        }
        if text.trim() != text || bundle.contains(char::is_whitespace) {
            return Err(format!(
                "rule {text:?} has a space at an end or in its bundle name, so it would match nothing; {usage}"
            ));
        }
        Ok(Rule {
            text: text.to_string(),
            kind,
            bundle: bundle.to_string(),
            name: name.to_string(),
        })
    }

    fn matches(&self, kind: Kind, bundle: &str, name: &str) -> bool {
        self.kind.is_none_or(|k| k == kind) && glob(&self.bundle, bundle) && glob(&self.name, name)
    }

    fn covers(&self, kind: Kind) -> bool {
        self.kind.is_none_or(|k| k == kind)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A token's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
}

impl Rules {
    /// Parses every rule; all problems at once.
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Rules, Vec<String>> {
        let mut problems = Vec::new();
        let mut parse = |texts: &[String]| {
            texts
                .iter()
                .filter_map(|t| Rule::parse(t).map_err(|e| problems.push(e)).ok())
                .collect()
        };
        let rules = Rules {
            allow: parse(allow),
            deny: parse(deny),
        };
        if problems.is_empty() {
            Ok(rules)
        } else {
            Err(problems)
        }
    }

    /// Rules that refuse everything (a token whose rules cannot be read).
    pub fn nothing() -> Rules {
        Rules {
            allow: Vec::new(),
            deny: vec![Rule {
                text: "*/*".into(),
                kind: None,
                bundle: "*".into(),
                name: "*".into(),
            }],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether `name` of `bundle` (a `kind`) is allowed; Err says which
    /// rule refused it (or that no allow rule admits it).
    pub fn check(&self, kind: Kind, bundle: &str, name: &str) -> Result<(), String> {
        if let Some(rule) = self.deny.iter().find(|r| r.matches(kind, bundle, name)) {
            return Err(format!("the token's rule --deny {rule} refuses it"));
        }
        let allows: Vec<&Rule> = self.allow.iter().filter(|r| r.covers(kind)).collect();
        if allows.is_empty() || allows.iter().any(|r| r.matches(kind, bundle, name)) {
            return Ok(());
        }
        let listed: Vec<String> = allows.iter().map(|r| r.to_string()).collect();
        Err(format!(
            "no --allow rule of the token admits it (it allows {})",
            listed.join(", ")
        ))
    }

    pub fn allows(&self, kind: Kind, bundle: &str, name: &str) -> bool {
        self.check(kind, bundle, name).is_ok()
    }
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one character).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    // Where the last `*` was, and the text position it now covers up to.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> Rules {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Rules::parse(&owned(allow), &owned(deny)).unwrap()
    }

    #[test]
    fn globs_match_runs_and_single_characters() {
        assert!(glob("create_*", "create_issue"));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXbYY"));
        assert!(glob("file:///srv/*", "file:///srv/a/b.txt"));
        assert!(glob("?at", "cat"));
        assert!(!glob("?at", "at"));
        assert!(glob("*_issue", "create_issue"));
        assert!(!glob("create", "create_issue"));
    }

    #[test]
    fn deny_wins_then_allows_of_the_kind_must_admit() {
        let r = rules(
            &["tool:github/*", "tool:time/get_*"],
            &["tool:github/delete_*"],
        );
        assert!(r.allows(Kind::Tool, "github", "create_issue"));
        assert!(r.allows(Kind::Tool, "time", "get_current_time"));
        let why = r.check(Kind::Tool, "github", "delete_repo").unwrap_err();
        assert!(why.contains("--deny tool:github/delete_*"), "{why}");
        let why = r.check(Kind::Tool, "slack", "post").unwrap_err();
        assert!(why.contains("tool:github/*, tool:time/get_*"), "{why}");
        // No allow rule for prompts: every prompt is allowed.
        assert!(r.allows(Kind::Prompt, "slack", "summary"));
        // A rule without a kind covers all.
        let r = rules(&[], &["secret/*"]);
        assert!(!r.allows(Kind::Resource, "secret", "file:///x"));
        assert!(!r.allows(Kind::Tool, "secret", "x"));
        assert!(r.allows(Kind::Tool, "public", "x"));
        let r = rules(&["resource:@files/*"], &[]);
        assert!(r.allows(Kind::Resource, FILES, "files://abc"));
        assert!(!r.allows(Kind::Resource, "github", "repo://x"));
    }

    #[test]
    fn bad_rules_are_refused_all_at_once_with_the_form_to_use() {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let problems =
            Rules::parse(&owned(&["tool:github", "bogus:a/b"]), &owned(&["/x"])).unwrap_err();
        assert_eq!(problems.len(), 3, "{problems:?}");
        let spaced = Rules::parse(&owned(&["tool:github/delete_* "]), &[]).unwrap_err();
        assert!(spaced[0].contains("space"), "{spaced:?}");
        assert!(!Rules::nothing().allows(Kind::Resource, FILES, "files://x"));
        assert!(problems[0].contains("names no BUNDLE/NAME"));
        assert!(problems[1].contains("\"bogus\" is not a kind"));
        assert!(problems[2].contains("empty bundle or name"));
        assert!(problems
            .iter()
            .all(|p| p.contains("KIND:BUNDLE/NAME") || p.contains("empty")));
    }
}
