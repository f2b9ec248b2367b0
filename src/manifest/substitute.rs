//! `${...}` substitution in `command`, `args` and `env` values.

use std::collections::BTreeMap;

/// Values available to a manifest's launch command.
#[derive(Debug, Clone, Default)]
pub struct SubstitutionVars {
    pub dirname: String,
    pub home: String,
    pub user_config: BTreeMap<String, String>,
}

/// Replaces `${__dirname}`, `${HOME}`, `${DESKTOP}`, `${DOCUMENTS}`,
/// `${DOWNLOADS}` (those folders of `${HOME}`), `${/}` and
/// `${pathSeparator}` (`/` here) and `${user_config.KEY}`.
/// Anything else inside `${...}`, or an unclosed `${`, is an error.
pub fn substitute(input: &str, vars: &SubstitutionVars) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed \"${{\" in {input:?}"));
        };
        let name = &after[..end];
        match lookup(name, vars) {
            Some(value) => out.push_str(&value),
            None => return Err(unknown_variable(name)),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Names of the variables a string refers to, or the first error.
pub(crate) fn variables(input: &str) -> Result<Vec<&str>, String> {
    let mut names = Vec::new();
    let mut rest = input;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("unclosed \"${\"".to_string());
        };
        names.push(&after[..end]);
        rest = &after[end + 1..];
    }
    Ok(names)
}

fn lookup<'a>(name: &str, vars: &'a SubstitutionVars) -> Option<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow;
    let in_home =
        |folder: &str| Cow::Owned(format!("{}/{folder}", vars.home.trim_end_matches('/')));
    match name {
        "__dirname" => Some(Cow::Borrowed(&vars.dirname)),
        "HOME" => Some(Cow::Borrowed(&vars.home)),
        "DESKTOP" => Some(in_home("Desktop")),
        "DOCUMENTS" => Some(in_home("Documents")),
        "DOWNLOADS" => Some(in_home("Downloads")),
        "/" | "pathSeparator" => Some(Cow::Borrowed("/")),
        _ => name
            .strip_prefix("user_config.")
            .and_then(|key| vars.user_config.get(key))
            .map(|v| Cow::Borrowed(v.as_str())),
    }
}

/// The variables every manifest may use, besides `${user_config.KEY}`.
pub(crate) const BUILTIN: &[&str] = &[
    "__dirname",
    "HOME",
    "DESKTOP",
    "DOCUMENTS",
    "DOWNLOADS",
    "/",
    "pathSeparator",
];

pub(crate) fn unknown_variable(name: &str) -> String {
    format!(
        "unknown variable ${{{name}}}; known: {}, ${{user_config.KEY}}",
        BUILTIN
            .iter()
            .map(|b| format!("${{{b}}}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitutes_every_known_variable() {
        let vars = SubstitutionVars {
            dirname: "/b/demo".into(),
            home: "/home/op".into(),
            user_config: [("key".to_string(), "v1".to_string())].into(),
        };
        assert_eq!(
            substitute("${__dirname}${/}bin --k=${user_config.key} ${HOME}", &vars).unwrap(),
            "/b/demo/bin --k=v1 /home/op"
        );
        assert_eq!(substitute("plain", &vars).unwrap(), "plain");
    }

    #[test]
    fn unknown_and_unclosed_variables_are_errors() {
        let vars = SubstitutionVars::default();
        assert!(substitute("${nope}", &vars)
            .unwrap_err()
            .contains("${nope}"));
        assert!(substitute("${user_config.missing}", &vars).is_err());
        assert!(substitute("a ${__dirname", &vars)
            .unwrap_err()
            .contains("unclosed"));
    }
}
