//! [`run`] end to end without an agent: every error code, VERSION, and what each verb does when
//! the agent is down (the socket path in an empty temp dir). The exchanges with a live agent are
//! in `tests/cni_plugin.rs`, against the built binary.

use super::*;
use std::fs;
use std::path::PathBuf;
use std::time::Instant;

/// A temp dir laid out like a node: a socket path nobody listens on, a spool dir (not created
/// yet) and a marker path (absent).
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn spool(&self) -> PathBuf {
        self.dir.path().join("spool")
    }

    fn marker(&self) -> PathBuf {
        self.dir.path().join("restored")
    }

    fn config(&self, version: &str) -> String {
        format!(
            r#"{{"cniVersion":"{version}","name":"pods","type":"ptp","ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}","connectTimeout":200}}}}"#,
            self.dir.path().join("agent.sock").display(),
            self.spool().display(),
            self.marker().display(),
        )
    }

    fn spool_files(&self) -> Vec<String> {
        match fs::read_dir(self.spool()) {
            Err(_) => Vec::new(),
            Ok(entries) => {
                let mut names: Vec<String> = entries
                    .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
                    .collect();
                names.sort();
                names
            }
        }
    }
}

const ADD_ENV: [(&str, &str); 6] = [
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "c0ffee"),
    ("CNI_NETNS", "/var/run/netns/pod"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/opt/cni/bin"),
    (
        "CNI_ARGS",
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=uid-1",
    ),
];

/// Runs the plugin with `vars` (overriding `base`; an empty value unsets) and `stdin`.
fn run_with(base: &[(&str, &str)], vars: &[(&str, &str)], stdin: &str) -> Output {
    let mut all: Vec<(String, String)> = base
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for (k, v) in vars {
        all.retain(|(name, _)| name != k);
        if !v.is_empty() {
            all.push(((*k).to_owned(), (*v).to_owned()));
        }
    }
    let getenv = move |name: &str| {
        all.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| OsString::from(v))
    };
    run(&getenv, &mut stdin.as_bytes())
}

/// The error an output carries: (cniVersion, code, msg, details); panics on success.
fn error_of(out: &Output) -> (String, u64, String, String) {
    assert_eq!(out.exit_code, 1, "{out:?}");
    assert!(out.stdout.ends_with('\n'));
    let v = json::parse(&out.stdout).expect("error JSON");
    let s = |k| v.get(k).and_then(Value::as_str).expect(k).to_owned();
    (
        s("cniVersion"),
        v.get("code").and_then(Value::as_u64).expect("code"),
        s("msg"),
        s("details"),
    )
}

#[test]
fn version_needs_no_config_and_no_agent() {
    let out = run_with(&[("CNI_COMMAND", "VERSION")], &[], "not even JSON");
    assert_eq!(
        out,
        Output::success(
            "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.0.0\",\"1.1.0\"]}\n".into()
        )
    );
}

/// Run with no `CNI_COMMAND` (by a person), the plugin says what it is on stderr and exits
/// 0, as the reference plugins do (containernetworking/cni `pkg/skel`: the about string when
/// `CNI_COMMAND` is empty); nothing on stdout.
#[test]
fn without_a_command_it_prints_its_about_line() {
    let out = run_with(&ADD_ENV, &[("CNI_COMMAND", "")], "");
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
    assert_eq!(
        out.stderr,
        format!(
            "CNI tidepool-cni plugin v{}\nCNI protocol versions supported: 1.0.0, 1.1.0\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn env_errors_are_code_4_and_name_the_variable() {
    let node = Node::new();
    let conf = node.config("1.1.0");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[("CNI_COMMAND", "RESTART")],
            "unknown CNI_COMMAND: RESTART",
        ),
        (
            &[("CNI_NETNS", "")],
            "required env variables [CNI_NETNS] missing",
        ),
        (
            &[("CNI_CONTAINERID", ""), ("CNI_PATH", "")],
            "required env variables [CNI_CONTAINERID,CNI_PATH] missing",
        ),
        (
            &[("CNI_CONTAINERID", "../../etc")],
            "invalid characters in CNI_CONTAINERID",
        ),
        (
            &[("CNI_IFNAME", "eth0/x")],
            "CNI_IFNAME contains / or : or whitespace",
        ),
        (
            &[("CNI_ARGS", "K8S_POD_NAME=a;FOO=b")],
            "CNI_ARGS: unknown keys [FOO] and IgnoreUnknown is not set",
        ),
    ];
    for (vars, msg) in cases {
        let (version, code, got, _) = error_of(&run_with(&ADD_ENV, vars, &conf));
        assert_eq!((code, got.as_str()), (4, *msg));
        assert_eq!(version, "1.1.0");
    }
    // The env is checked before the config, as in skel.
    let (_, code, _, _) = error_of(&run_with(&ADD_ENV, &[("CNI_IFNAME", "")], "garbage"));
    assert_eq!(code, 4);
}

#[test]
fn config_errors_are_code_6_or_7_and_version_errors_code_1() {
    let node = Node::new();
    let cases: &[(&str, u64, &str)] = &[
        (
            "",
            6,
            "network config is not JSON: expected a JSON value, found the end of the input at byte 0",
        ),
        (
            "{\"cniVersion\":\"1.1.0\",}",
            6,
            "network config is not JSON: expected a string (an object key), found '}' at byte 22",
        ),
        (
            "\"1.1.0\"",
            6,
            "network config is a JSON string, not an object",
        ),
        (
            r#"{"cniVersion":"1.1.0","ipam":[]}"#,
            6,
            "ipam must be an object, got array",
        ),
        (
            r#"{"cniVersion":"1.1.0","ipam":{"socket":"rel.sock"}}"#,
            7,
            "ipam.socket must be an absolute path",
        ),
        (r#"{"cniVersion":"0.4.0"}"#, 1, "incompatible CNI versions"),
        (r#"{"name":"n"}"#, 1, "incompatible CNI versions"),
    ];
    for (stdin, want_code, msg) in cases {
        let (version, code, got, _) = error_of(&run_with(&ADD_ENV, &[], stdin));
        assert_eq!((code, got.as_str()), (*want_code, *msg), "{stdin}");
        assert_eq!(version, "1.1.0");
    }
    // GC and STATUS exist from 1.1.0 on.
    let (version, code, msg, _) = error_of(&run_with(
        &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/p")],
        &[],
        &node.config("1.0.0"),
    ));
    assert_eq!(
        (version.as_str(), code, msg.as_str()),
        ("1.0.0", 1, "config version 1.0.0 does not allow STATUS")
    );
}

#[test]
fn bad_input_writes_nothing_to_the_spool() {
    let node = Node::new();
    let del = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/p"),
    ];
    let good = node.config("1.1.0");
    let bad_stdin = good.replace("\"name\"", "name");
    for (vars, stdin) in [
        (&[("CNI_IFNAME", "")][..], good.as_str()),
        (&[("CNI_CONTAINERID", "-x")][..], good.as_str()),
        (&[("CNI_ARGS", "novalue")][..], good.as_str()),
        (&[][..], bad_stdin.as_str()),
        (&[][..], &good.replace("1.1.0", "9.9.9")),
    ] {
        let out = run_with(&del, vars, stdin);
        assert_eq!(out.exit_code, 1, "{out:?}");
        assert!(!node.spool().exists(), "spool touched by {vars:?}");
    }
    // The same DEL with good input is spooled.
    assert_eq!(run_with(&del, &[], &good), Output::success(String::new()));
    assert_eq!(node.spool_files(), ["c1@eth0.json"]);
}

#[test]
fn del_while_the_agent_is_down_is_spooled_and_succeeds() {
    let node = Node::new();
    let conf = node.config("1.1.0");
    let vars = [("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")];
    let out = run_with(&ADD_ENV, &vars, &conf);
    assert_eq!(out, Output::success(String::new()));
    assert_eq!(node.spool_files(), ["c0ffee@eth0.json"]);
    let text = fs::read_to_string(node.spool().join("c0ffee@eth0.json")).expect("spool file");
    let rec = json::parse(&text).expect("JSON");
    assert_eq!(rec.get("spoolVersion").and_then(Value::as_u64), Some(1));
    assert!(
        rec.get("spooledAtMs")
            .and_then(Value::as_u64)
            .is_some_and(|ms| ms > 1_700_000_000_000)
    );
    let config = json::parse(&conf).expect("config");
    let want = format!(
        r#"{{"containerID":"c0ffee","ifname":"eth0","netns":null,"podNamespace":"default","podName":"web-0","podUID":"uid-1","cniVersion":"1.1.0","config":{config}}}"#
    );
    assert_eq!(rec.get("del").map(ToString::to_string), Some(want));
}

#[test]
fn del_that_cannot_be_spooled_fails_with_code_5() {
    let node = Node::new();
    fs::write(node.spool(), "a file where the spool dir should be").expect("file");
    let (_, code, msg, details) = error_of(&run_with(
        &ADD_ENV,
        &[("CNI_COMMAND", "DEL")],
        &node.config("1.1.0"),
    ));
    assert_eq!(
        (code, msg.as_str()),
        (
            5,
            "tidepool agent unreachable and the DEL could not be spooled"
        )
    );
    assert!(details.contains("cannot connect to"), "{details}");
}

#[test]
fn add_while_the_agent_is_down_waits_then_says_try_again() {
    let node = Node::new();
    let started = Instant::now();
    let out = run_with(&ADD_ENV, &[], &node.config("1.0.0"));
    let waited = started.elapsed();
    let (version, code, msg, details) = error_of(&out);
    assert_eq!(
        (version.as_str(), code, msg.as_str()),
        ("1.0.0", 11, "tidepool agent unreachable, try again later")
    );
    assert!(details.contains("agent.sock"), "{details}");
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert!(!node.spool().exists());
}

#[test]
fn check_and_gc_while_the_agent_is_down_say_try_again() {
    let node = Node::new();
    let (_, code, _, _) = error_of(&run_with(
        &ADD_ENV,
        &[("CNI_COMMAND", "CHECK")],
        &node.config("1.1.0"),
    ));
    assert_eq!(code, 11);
    let gc_conf = node
        .config("1.1.0")
        .replacen('{', r#"{"cni.dev/valid-attachments":[],"#, 1);
    let gc = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/p")];
    let (_, code, _, _) = error_of(&run_with(&gc, &[], &gc_conf));
    assert_eq!(code, 11);
    // Without the list GC is refused before anything is sent.
    let (_, code, msg, _) = error_of(&run_with(&gc, &[], &node.config("1.1.0")));
    assert_eq!(
        (code, msg.as_str()),
        (7, "GC config has no cni.dev/valid-attachments")
    );
}

#[test]
fn status_while_the_agent_is_down_depends_on_the_restore_marker() {
    let node = Node::new();
    let status = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/p")];
    let (_, code, msg, details) = error_of(&run_with(&status, &[], &node.config("1.1.0")));
    assert_eq!(
        (code, msg.as_str()),
        (50, "the tidepool agent is not available")
    );
    assert!(
        details.contains(&format!("{} is absent", node.marker().display())),
        "{details}"
    );
    fs::write(node.marker(), "").expect("marker");
    assert_eq!(
        run_with(&status, &[], &node.config("1.1.0")),
        Output::success(String::new())
    );
}

#[test]
fn status_fails_once_the_agent_is_unreachable_beyond_the_grace() {
    let node = Node::new();
    let status = [("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/p")];
    let conf = node
        .config("1.1.0")
        .replace(r#""connectTimeout":200"#, r#""unreachableGrace":60000"#);
    let marker = fs::File::create(node.marker()).expect("marker");
    // last refreshed 59 s ago: within the grace, an ordinary restart
    let at = |ago| SystemTime::now() - Duration::from_secs(ago);
    marker.set_modified(at(59)).expect("mtime");
    assert_eq!(
        run_with(&status, &[], &conf),
        Output::success(String::new())
    );
    // 61 s ago: the agent has been gone for longer than the grace
    marker.set_modified(at(61)).expect("mtime");
    let (_, code, msg, details) = error_of(&run_with(&status, &[], &conf));
    assert_eq!(
        (code, msg.as_str()),
        (50, "the tidepool agent is not available")
    );
    assert!(details.contains("for 61 s (grace 60 s)"), "{details}");
}

#[test]
fn oversized_stdin_is_refused() {
    let big = format!(
        "{{\"cniVersion\":\"1.1.0\",\"pad\":\"{}\"}}",
        "x".repeat(config::MAX_CONFIG_BYTES)
    );
    let (_, code, msg, _) = error_of(&run_with(&ADD_ENV, &[], &big));
    assert_eq!(
        (code, msg.as_str()),
        (6, "network config is larger than 1048576 bytes")
    );
}
