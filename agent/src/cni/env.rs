//! The `CNI_*` environment: which verb, for which container and interface, for which pod.
//!
//! The required variables per verb, and the checks on the container ID and interface name, are
//! the reference `skel` package's (the runtime's own plugins hold us to the same rules); a missing
//! or invalid variable is code 4 and names the variable. The container ID and interface name are
//! checked before anything uses them, because they also name the DEL spool's files.

use std::ffi::OsString;

use super::proto::{CniError, code};

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    /// The `CNI_COMMAND` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }

    /// Reads `CNI_COMMAND`; missing, not UTF-8 or unknown is code 4.
    pub fn from_env(getenv: &dyn Fn(&str) -> Option<OsString>) -> Result<Command, CniError> {
        let cmd = var(getenv, "CNI_COMMAND")?.ok_or_else(|| missing(&["CNI_COMMAND"]))?;
        match cmd.as_str() {
            "ADD" => Ok(Command::Add),
            "DEL" => Ok(Command::Del),
            "CHECK" => Ok(Command::Check),
            "GC" => Ok(Command::Gc),
            "STATUS" => Ok(Command::Status),
            "VERSION" => Ok(Command::Version),
            other => Err(
                CniError::new(code::INVALID_ENV, format!("unknown CNI_COMMAND: {other}"))
                    .with_details("expected one of ADD, DEL, CHECK, GC, STATUS, VERSION"),
            ),
        }
    }
}

/// The Kubernetes pod a request is for, from `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
}

/// The environment of one invocation, checked for its verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: CniArgs,
    /// Unused by this plugin (it executes nothing), but required as `skel` requires it.
    pub path: Option<String>,
}

/// Which variables a verb requires (skel's table; GC and STATUS need only `CNI_PATH`).
fn required(command: Command) -> &'static [&'static str] {
    match command {
        Command::Add | Command::Check => {
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
        }
        Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
        Command::Gc | Command::Status => &["CNI_PATH"],
        Command::Version => &[],
    }
}

impl CniEnv {
    /// Reads and checks the environment for `command`. An empty variable counts as missing
    /// (as in `skel`); all missing required variables are named at once.
    pub fn from_env(
        command: Command,
        getenv: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<CniEnv, CniError> {
        let container_id = var(getenv, "CNI_CONTAINERID")?;
        let netns = var(getenv, "CNI_NETNS")?;
        let ifname = var(getenv, "CNI_IFNAME")?;
        let path = var(getenv, "CNI_PATH")?;
        let cni_args = var(getenv, "CNI_ARGS")?;

        let vars = [
            ("CNI_CONTAINERID", &container_id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", &ifname),
            ("CNI_PATH", &path),
        ];
        let absent: Vec<&str> = vars
            .iter()
            .filter(|(name, value)| value.is_none() && required(command).contains(name))
            .map(|(name, _)| *name)
            .collect();
        if !absent.is_empty() {
            return Err(missing(&absent));
        }
        if let Some(id) = &container_id {
            validate_container_id(id)?;
        }
        if let Some(name) = &ifname {
            validate_ifname(name)?;
        }
        let args = parse_args(cni_args.as_deref().unwrap_or_default())?;
        Ok(CniEnv {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

/// A variable's value; unset or empty is `None`, not UTF-8 is code 4.
fn var(getenv: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Result<Option<String>, CniError> {
    match getenv(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|_| {
            CniError::new(
                code::INVALID_ENV,
                format!("env variable {name} is not valid UTF-8"),
            )
        }),
    }
}

fn missing(names: &[&str]) -> CniError {
    CniError::new(
        code::INVALID_ENV,
        format!("required env variables [{}] missing", names.join(",")),
    )
}

/// skel's `ValidateContainerID`: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`.
fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut bytes = id.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    if first_ok && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
        Ok(())
    } else {
        Err(
            CniError::new(code::INVALID_ENV, "invalid characters in CNI_CONTAINERID")
                .with_details(id),
        )
    }
}

/// skel's `ValidateInterfaceName`: at most 15 bytes (IFNAMSIZ - 1), not `.` or `..`, no `/`, `:`
/// or whitespace.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > 15 {
        Some("is longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("is . or ..")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains / or : or whitespace")
    } else {
        None
    };
    match problem {
        Some(p) => {
            Err(CniError::new(code::INVALID_ENV, format!("CNI_IFNAME {p}")).with_details(name))
        }
        None => Ok(()),
    }
}

/// The keys this plugin knows in `CNI_ARGS` (what containerd and CRI-O send).
const KNOWN_ARGS: [&str; 5] = [
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
];

/// Parses `CNI_ARGS` (`K=V;K=V`) as libcni's `LoadArgs` does: a pair without `=` is an error, and
/// so is an unknown key unless `IgnoreUnknown` is true (`1` or `true`), wherever it appears.
/// Lenient where Go is needlessly strict: empty segments (a trailing `;`) are skipped, and a value
/// may contain `=`.
pub fn parse_args(raw: &str) -> Result<CniArgs, CniError> {
    let mut pairs = Vec::new();
    for segment in raw.split(';').filter(|s| !s.is_empty()) {
        let (k, v) = segment.split_once('=').ok_or_else(|| {
            CniError::new(
                code::INVALID_ENV,
                format!("CNI_ARGS: invalid pair {segment:?} (want KEY=VALUE)"),
            )
        })?;
        pairs.push((k, v));
    }
    let mut ignore_unknown = false;
    for (_, v) in pairs.iter().filter(|(k, _)| *k == "IgnoreUnknown") {
        ignore_unknown = match v.to_ascii_lowercase().as_str() {
            "1" | "true" => true,
            "0" | "false" => false,
            _ => {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    format!("CNI_ARGS: IgnoreUnknown={v} is not a boolean (1, true, 0, false)"),
                ));
            }
        };
    }
    let mut args = CniArgs::default();
    let mut unknown = Vec::new();
    for (k, v) in pairs {
        let v = (!v.is_empty()).then(|| v.to_owned());
        match k {
            "K8S_POD_NAMESPACE" => args.pod_namespace = v,
            "K8S_POD_NAME" => args.pod_name = v,
            "K8S_POD_UID" => args.pod_uid = v,
            k if KNOWN_ARGS.contains(&k) => {}
            k => unknown.push(k),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!(
                "CNI_ARGS: unknown keys [{}] and IgnoreUnknown is not set",
                unknown.join(",")
            ),
        ));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    const FULL: [(&str, &str); 6] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/p"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=0000-1",
        ),
    ];

    #[test]
    fn a_containerd_add_parses() {
        let getenv = env_of(&FULL);
        let cmd = Command::from_env(&getenv).expect("command");
        let env = CniEnv::from_env(cmd, &getenv).expect("env");
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.container_id.as_deref(), Some("abc123"));
        assert_eq!(env.netns.as_deref(), Some("/var/run/netns/p"));
        assert_eq!(env.ifname.as_deref(), Some("eth0"));
        assert_eq!(env.path.as_deref(), Some("/opt/cni/bin"));
        assert_eq!(
            env.args,
            CniArgs {
                pod_namespace: Some("default".into()),
                pod_name: Some("web-0".into()),
                pod_uid: Some("0000-1".into()),
            }
        );
    }

    #[test]
    fn every_command_and_unknown_ones() {
        for (name, cmd) in [
            ("ADD", Command::Add),
            ("DEL", Command::Del),
            ("CHECK", Command::Check),
            ("GC", Command::Gc),
            ("STATUS", Command::Status),
            ("VERSION", Command::Version),
        ] {
            assert_eq!(
                Command::from_env(&env_of(&[("CNI_COMMAND", name)])),
                Ok(cmd)
            );
        }
        let e = Command::from_env(&env_of(&[("CNI_COMMAND", "add")])).expect_err("lower case");
        assert_eq!((e.code, e.msg.as_str()), (4, "unknown CNI_COMMAND: add"));
        let e = Command::from_env(&env_of(&[])).expect_err("missing");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (4, "required env variables [CNI_COMMAND] missing")
        );
        let bad = |_: &str| Some(OsString::from_vec(vec![0xff]));
        let e = Command::from_env(&bad).expect_err("not UTF-8");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (4, "env variable CNI_COMMAND is not valid UTF-8")
        );
    }

    #[test]
    fn missing_variables_are_named_per_verb() {
        let only_path = env_of(&[("CNI_PATH", "/opt/cni/bin")]);
        let e = CniEnv::from_env(Command::Add, &only_path).expect_err("add");
        assert_eq!(e.code, 4);
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing"
        );
        let e = CniEnv::from_env(Command::Del, &only_path).expect_err("del");
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID,CNI_IFNAME] missing"
        );
        assert!(CniEnv::from_env(Command::Gc, &only_path).is_ok());
        assert!(CniEnv::from_env(Command::Status, &only_path).is_ok());
        let e = CniEnv::from_env(Command::Status, &env_of(&[])).expect_err("status");
        assert_eq!(e.msg, "required env variables [CNI_PATH] missing");
        // An empty value is missing, as in skel.
        let empty_netns = env_of(&[
            ("CNI_CONTAINERID", "c"),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/p"),
        ]);
        let e = CniEnv::from_env(Command::Check, &empty_netns).expect_err("check");
        assert_eq!(e.msg, "required env variables [CNI_NETNS] missing");
        // DEL does not need the netns (it may be gone).
        let del = CniEnv::from_env(Command::Del, &empty_netns).expect("del without netns");
        assert_eq!(del.netns, None);
    }

    #[test]
    fn container_id_and_ifname_are_checked() {
        let with = |id: &str, ifname: &str| {
            CniEnv::from_env(
                Command::Del,
                &env_of(&[
                    ("CNI_CONTAINERID", id),
                    ("CNI_IFNAME", ifname),
                    ("CNI_PATH", "/p"),
                ]),
            )
        };
        assert!(with("a-b_c.d9", "eth0").is_ok());
        for id in ["-a", "../x", "a/b", "a b", "é"] {
            let e = with(id, "eth0").expect_err(id);
            assert_eq!(
                (e.code, e.msg.as_str(), e.details.as_str()),
                (4, "invalid characters in CNI_CONTAINERID", id)
            );
        }
        for (name, msg) in [
            ("abcdefghijklmnop", "CNI_IFNAME is longer than 15 bytes"),
            (".", "CNI_IFNAME is . or .."),
            ("..", "CNI_IFNAME is . or .."),
            ("a/b", "CNI_IFNAME contains / or : or whitespace"),
            ("a:b", "CNI_IFNAME contains / or : or whitespace"),
            ("a b", "CNI_IFNAME contains / or : or whitespace"),
        ] {
            let e = with("c", name).expect_err(name);
            assert_eq!((e.code, e.msg.as_str()), (4, msg));
        }
    }

    #[test]
    fn cni_args_follow_load_args() {
        assert_eq!(parse_args(""), Ok(CniArgs::default()));
        assert_eq!(
            parse_args("K8S_POD_NAME=a;K8S_POD_UID=u;")
                .expect("trailing ;")
                .pod_uid
                .as_deref(),
            Some("u")
        );
        // IgnoreUnknown counts wherever it is, in any case of true.
        let args = parse_args("FOO=1;K8S_POD_NAMESPACE=ns;IgnoreUnknown=TRUE").expect("ignored");
        assert_eq!(args.pod_namespace.as_deref(), Some("ns"));
        let e = parse_args("FOO=1;BAR=2;K8S_POD_NAME=a").expect_err("unknown");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (
                4,
                "CNI_ARGS: unknown keys [FOO,BAR] and IgnoreUnknown is not set"
            )
        );
        let e = parse_args("FOO=1;IgnoreUnknown=0").expect_err("explicitly not ignored");
        assert_eq!(e.code, 4);
        let e = parse_args("IgnoreUnknown=yes").expect_err("not a bool");
        assert_eq!(
            e.msg,
            "CNI_ARGS: IgnoreUnknown=yes is not a boolean (1, true, 0, false)"
        );
        let e = parse_args("K8S_POD_NAME").expect_err("no =");
        assert_eq!(
            e.msg,
            r#"CNI_ARGS: invalid pair "K8S_POD_NAME" (want KEY=VALUE)"#
        );
        // A value may hold '='; an empty value is no value.
        let args = parse_args("K8S_POD_NAME=a=b;K8S_POD_UID=").expect("lenient");
        assert_eq!(
            (args.pod_name.as_deref(), args.pod_uid),
            (Some("a=b"), None)
        );
    }
}
