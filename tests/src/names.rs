//! Name rules of apimachinery's `validation` package (DNS-1123 labels and subdomains, DNS-1035
//! labels), each returning the real server's messages.

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, of any length.
fn label_shape(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.bytes().all(|b| alnum(b) || b == b'-')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}

/// `label_shape` parts joined by dots, of any length.
fn subdomain_shape(s: &str) -> bool {
    s.split('.').all(label_shape)
}

const QUALIFIED_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, of any length.
fn qualified_shape(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// `IsQualifiedName`: an optional DNS-1123 subdomain prefix and `/`, then a name part of at
/// most 63 characters of the qualified shape.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len(63)));
    }
    if !qualified_shape(name) {
        errs.push(format!("name part {QUALIFIED_MSG}"));
    }
    errs
}

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `IsDNS1123Label`: at most 63 characters of the label shape.
pub(crate) fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len(63));
    }
    if !label_shape(s) {
        errs.push(if subdomain_shape(s) {
            "must not contain dots".to_string()
        } else {
            LABEL_MSG.to_string()
        });
    }
    errs
}

/// `IsDNS1123Subdomain`: at most 253 characters of dot-separated labels (each of any length).
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len(253));
    }
    if !subdomain_shape(s) {
        errs.push(SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// `IsDNS1035Label`: a DNS-1123 label that starts with a letter.
pub(crate) fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len(63));
    }
    if !label_shape(s) || !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        errs.push(DNS1035_MSG.to_string());
    }
    errs
}

/// `IsValidPathSegmentName`: anything but `.` and `..`, without `/` or `%`.
pub(crate) fn path_segment(s: &str) -> Vec<String> {
    if let Some(bad) = [".", ".."].into_iter().find(|b| *b == s) {
        return vec![format!("may not be '{bad}'")];
    }
    ["/", "%"]
        .into_iter()
        .filter(|c| s.contains(c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// The messages for an object name of `kind` (`metadata.name` causes, without the value).
pub(crate) fn object_name(kind: &str, name: &str) -> Vec<String> {
    match kind {
        "Namespace" => dns1123_label(name),
        // `ValidateRBACName`: `system:…` names are common
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => path_segment(name),
        _ => dns1123_subdomain(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rbac_names_are_path_segments() {
        assert!(object_name("ClusterRole", "system:tidepool:agent").is_empty());
        assert_eq!(object_name("RoleBinding", ".."), ["may not be '..'"]);
        assert_eq!(
            object_name("Role", "a/b%c"),
            ["may not contain '/'", "may not contain '%'"]
        );
        assert!(!object_name("ConfigMap", "system:x").is_empty());
    }

    #[test]
    fn subdomains_labels_and_lengths() {
        assert!(dns1123_subdomain(&"a".repeat(100)).is_empty());
        assert!(dns1123_subdomain(&format!("{}.b", "a".repeat(200))).is_empty());
        assert_eq!(dns1123_subdomain(&"a".repeat(254)), vec![max_len(253)]);
        assert_eq!(dns1123_subdomain("a..b"), vec![SUBDOMAIN_MSG]);
        assert_eq!(dns1123_label(&"a".repeat(64)), vec![max_len(63)]);
        assert_eq!(dns1123_label("a.b"), vec!["must not contain dots"]);
        assert!(qualified_name("example.com/My_name.1").is_empty());
        assert_eq!(
            qualified_name(""),
            vec![
                "name part must be non-empty".to_string(),
                format!("name part {QUALIFIED_MSG}")
            ]
        );
        assert_eq!(qualified_name("/a"), vec!["prefix part must be non-empty"]);
        assert_eq!(dns1123_label("A"), vec![LABEL_MSG]);
        assert!(dns1123_label("0a").is_empty());
        assert_eq!(dns1035_label("0a"), vec![DNS1035_MSG]);
        assert!(dns1035_label("v1beta1").is_empty());
    }
}
