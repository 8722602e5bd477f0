//! The built `tidepool-cni` binary, run the way a runtime (or a main plugin like ptp) runs it:
//! a clean environment of `CNI_*` variables, the network config on stdin, the answer on stdout.
//! A fake agent on a unix socket in a temp dir records each request and answers as scripted.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

#[path = "../../tests/tests/system/mod.rs"]
mod common;

use common::{BIN, Run, plugin_with};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One request as the fake agent received it.
#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

type Responder = dyn Fn(&Recorded) -> Answer + Send + Sync;

/// What the fake agent does with a request.
enum Answer {
    /// Status and body, sent with a Content-Length.
    Reply(u16, String),
    /// Read the request, then say nothing (a hung agent).
    Hang,
}

/// A fake agent: serves the plugin protocol's transport on `sock`, one thread per connection.
struct FakeAgent {
    sock: PathBuf,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    fn start(
        sock: &Path,
        respond: impl Fn(&Recorded) -> Answer + Send + Sync + 'static,
    ) -> FakeAgent {
        let listener = UnixListener::bind(sock).expect("bind the fake agent's socket");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let respond: Arc<Responder> = Arc::new(respond);
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (requests, respond) = (requests.clone(), respond.clone());
                    std::thread::spawn(move || serve(conn, &requests, &*respond));
                }
            })
        };
        FakeAgent {
            sock: sock.to_owned(),
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = UnixStream::connect(&self.sock);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: UnixStream, requests: &Mutex<Vec<Recorded>>, respond: &Responder) {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return; // the wake-up connection
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).expect("header line");
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').expect("header has a colon");
        if k.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse().expect("content length");
        }
        headers.push((k.to_owned(), v.trim().to_owned()));
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("body");
    let rec = Recorded {
        method,
        target,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    };
    let answer = respond(&rec);
    requests.lock().expect("lock").push(rec);
    let mut conn = reader.into_inner();
    match answer {
        Answer::Reply(status, body) => {
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        Answer::Hang => {
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink); // until the plugin gives up and closes
        }
    }
}

/// A node's paths in a temp dir.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn sock(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }
    fn spool(&self) -> PathBuf {
        self.dir.path().join("spool")
    }
    fn marker(&self) -> PathBuf {
        self.dir.path().join("restored")
    }
    /// A ptp config delegating to tidepool-cni, compact (so the forwarded body can be spelled
    /// out), with `extra` IPAM members.
    fn config(&self, version: &str, extra: &str) -> String {
        format!(
            r#"{{"cniVersion":"{version}","name":"pods","type":"ptp","mtu":1500,"ipam":{{"type":"tidepool-cni","socket":"{}","spoolDir":"{}","restoredMarker":"{}"{extra}}}}}"#,
            self.sock().display(),
            self.spool().display(),
            self.marker().display()
        )
    }
    fn agent(&self, respond: impl Fn(&Recorded) -> Answer + Send + Sync + 'static) -> FakeAgent {
        FakeAgent::start(&self.sock(), respond)
    }
    fn spool_files(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.spool()) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        names.sort();
        names
    }
}

/// The plugin's run: stdout, exit status, wall time.
fn env_for<'a>(cmd: &'a str, container: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("CNI_COMMAND", cmd), ("CNI_PATH", "/opt/cni/bin")];
    if matches!(cmd, "ADD" | "DEL" | "CHECK") {
        env.extend([
            ("CNI_CONTAINERID", container),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=uid-1"),
        ]);
    }
    if matches!(cmd, "ADD" | "CHECK") {
        env.push(("CNI_NETNS", "/var/run/netns/pod-1"));
    }
    env
}

/// (code, msg, cniVersion) of an error answer.
fn error_of(run: &Run) -> (u64, String, String) {
    assert_eq!(run.code, 1, "expected an error, got {:?}", run.stdout);
    let field = |key: &str| -> Option<String> {
        let at = run.stdout.find(&format!("\"{key}\":"))? + key.len() + 3;
        let rest = &run.stdout[at..];
        Some(match rest.strip_prefix('"') {
            Some(s) => s[..s.find('"')?].to_owned(),
            None => rest[..rest.find(|c: char| !c.is_ascii_digit())?].to_owned(),
        })
    };
    let code = field("code").and_then(|c| c.parse().ok()).expect("code");
    (
        code,
        field("msg").expect("msg"),
        field("cniVersion").expect("cniVersion"),
    )
}

const RESULT: &str = r#"{"cniVersion":"1.1.0","ips":[{"address":"10.250.1.5/16","gateway":"10.250.0.1"}],"routes":[{"dst":"0.0.0.0/0"}]}"#;

#[test]
fn add_forwards_the_exact_body_and_prints_the_agent_result() {
    let node = Node::new();
    let agent = node.agent(|_| Answer::Reply(200, RESULT.to_owned()));
    let config = node.config("1.1.0", "");
    let run = plugin_with(&env_for("ADD", "c1"), &config);
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, format!("{RESULT}\n").as_str())
    );
    let reqs = agent.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(
        (r.method.as_str(), r.target.as_str()),
        ("POST", "/v1/cni/add")
    );
    assert_eq!(
        r.body,
        format!(
            r#"{{"containerID":"c1","ifname":"eth0","netns":"/var/run/netns/pod-1","podNamespace":"default","podName":"web-0","podUID":"uid-1","cniVersion":"1.1.0","config":{config}}}"#
        )
    );
    let header = |k: &str| {
        r.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("content-type"), Some("application/json"));
    assert_eq!(header("connection"), Some("close"));
}

#[test]
fn del_check_gc_and_status_forward_to_their_paths_and_print_nothing() {
    let node = Node::new();
    let agent = node.agent(|_| Answer::Reply(200, "{}".to_owned()));
    let config = node.config("1.1.0", "");
    let gc_config = config.replacen(
        '{',
        r#"{"cni.dev/valid-attachments":[{"containerID":"c9","ifname":"eth0"}],"#,
        1,
    );
    for (cmd, stdin) in [
        ("DEL", &config),
        ("CHECK", &config),
        ("GC", &gc_config),
        ("STATUS", &config),
    ] {
        let run = plugin_with(&env_for(cmd, "c1"), stdin);
        assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{cmd}");
    }
    let reqs = agent.requests();
    let targets: Vec<&str> = reqs.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/v1/cni/del",
            "/v1/cni/check",
            "/v1/cni/gc",
            "/v1/cni/status"
        ]
    );
    // DEL without a netns says null; GC and STATUS have no key; GC's list reaches the agent.
    assert!(
        reqs[0]
            .body
            .starts_with(r#"{"containerID":"c1","ifname":"eth0","netns":null,"#),
        "{}",
        reqs[0].body
    );
    assert!(reqs[1].body.contains(r#""netns":"/var/run/netns/pod-1""#));
    assert!(
        reqs[2]
            .body
            .starts_with(r#"{"containerID":null,"ifname":null,"netns":null,"podNamespace":null,"#)
    );
    assert!(reqs[2].body.contains(
        r#""config":{"cni.dev/valid-attachments":[{"containerID":"c9","ifname":"eth0"}],"#
    ));
    assert!(
        reqs[3]
            .body
            .contains(&format!(r#""cniVersion":"1.1.0","config":{config}}}"#))
    );
}

#[test]
fn agent_errors_are_printed_with_the_request_version() {
    let node = Node::new();
    let _agent = node.agent(|r| match r.target.as_str() {
        "/v1/cni/add" => Answer::Reply(
            503,
            r#"{"code":11,"msg":"pool empty","details":"no block yet"}"#.into(),
        ),
        "/v1/cni/status" => Answer::Reply(
            503,
            r#"{"code":50,"msg":"not restored","details":""}"#.into(),
        ),
        _ => Answer::Reply(500, "boom".into()),
    });
    let run = plugin_with(&env_for("ADD", "c1"), &node.config("1.0.0", ""));
    assert_eq!(
        run.stdout,
        "{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"pool empty\",\"details\":\"no block yet\"}\n"
    );
    assert_eq!(error_of(&run).0, 11);
    let run = plugin_with(&env_for("STATUS", ""), &node.config("1.1.0", ""));
    assert_eq!(error_of(&run), (50, "not restored".into(), "1.1.0".into()));
    let run = plugin_with(&env_for("DEL", "c1"), &node.config("1.1.0", ""));
    assert_eq!(
        error_of(&run),
        (
            999,
            "tidepool agent answered HTTP 500".into(),
            "1.1.0".into()
        )
    );
    // An agent that answers, even with an error, is not "down": nothing is spooled.
    assert!(node.spool_files().is_empty());
}

#[test]
fn version_answers_without_an_agent() {
    let run = plugin_with(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.1.0"}"#);
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stdout,
        "{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.0.0\",\"1.1.0\"]}\n"
    );
}

#[test]
fn del_while_the_agent_is_down_is_spooled_durably_and_succeeds() {
    let node = Node::new();
    let config = node.config("1.0.0", "");
    let run = plugin_with(&env_for("DEL", "c1"), &config);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    assert_eq!(node.spool_files(), ["c1@eth0.json"]);
    let text = std::fs::read_to_string(node.spool().join("c1@eth0.json")).expect("spool file");
    let del = format!(
        r#"{{"containerID":"c1","ifname":"eth0","netns":null,"podNamespace":"default","podName":"web-0","podUID":"uid-1","cniVersion":"1.0.0","config":{config}}}"#
    );
    let prefix = r#"{"spoolVersion":1,"spooledAtMs":"#;
    assert!(
        text.starts_with(prefix) && text.ends_with(&format!(r#","del":{del}}}"#)),
        "{text}"
    );
    let ms: u64 = text[prefix.len()..text.find(",\"del\"").expect("del")]
        .parse()
        .expect("ms");
    assert!(ms > 1_700_000_000_000);
    // A repeated DEL replaces the file; a DEL for another interface gets its own.
    assert_eq!(plugin_with(&env_for("DEL", "c1"), &config).code, 0);
    let mut env = env_for("DEL", "c1");
    env.retain(|(k, _)| *k != "CNI_IFNAME");
    env.push(("CNI_IFNAME", "net1"));
    assert_eq!(plugin_with(&env, &config).code, 0);
    assert_eq!(node.spool_files(), ["c1@eth0.json", "c1@net1.json"]);
}

#[test]
fn a_hung_agent_gets_the_del_spooled_and_the_add_told_to_try_again() {
    let node = Node::new();
    let _agent = node.agent(|_| Answer::Hang);
    let config = node.config("1.1.0", r#","requestTimeout":300"#);
    let run = plugin_with(&env_for("DEL", "c1"), &config);
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert_eq!(node.spool_files(), ["c1@eth0.json"]);
    let run = plugin_with(&env_for("ADD", "c2"), &config);
    let (code, msg, _) = error_of(&run);
    assert_eq!(
        (code, msg.as_str()),
        (11, "tidepool agent unreachable, try again later")
    );
    assert!(
        run.stdout.contains("timed out reading the answer"),
        "{}",
        run.stdout
    );
}

#[test]
fn add_while_the_agent_is_down_waits_briefly_then_answers_11() {
    let node = Node::new();
    let run = plugin_with(
        &env_for("ADD", "c1"),
        &node.config("1.1.0", r#","connectTimeout":400"#),
    );
    let (code, msg, version) = error_of(&run);
    assert_eq!(
        (code, msg.as_str(), version.as_str()),
        (11, "tidepool agent unreachable, try again later", "1.1.0")
    );
    assert!(
        run.took >= Duration::from_millis(400),
        "gave up after {:?}",
        run.took
    );
    assert!(run.took < Duration::from_secs(3), "waited {:?}", run.took);
    assert!(node.spool_files().is_empty());
}

#[test]
fn add_succeeds_when_the_agent_comes_back_within_the_wait() {
    let node = Node::new();
    let config = node.config("1.1.0", r#","connectTimeout":5000"#);
    let sock = node.sock();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        FakeAgent::start(&sock, |_| Answer::Reply(200, RESULT.to_owned()))
    });
    let run = plugin_with(&env_for("ADD", "c1"), &config);
    let agent = late.join().expect("agent thread");
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (0, format!("{RESULT}\n").as_str())
    );
    assert!(run.took >= Duration::from_millis(300), "{:?}", run.took);
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn status_while_the_agent_is_down_fails_only_before_the_first_restore() {
    let node = Node::new();
    let config = node.config("1.1.0", "");
    let run = plugin_with(&env_for("STATUS", ""), &config);
    let (code, msg, _) = error_of(&run);
    assert_eq!(
        (code, msg.as_str()),
        (50, "the tidepool agent is not available")
    );
    std::fs::write(node.marker(), "").expect("marker");
    let run = plugin_with(&env_for("STATUS", ""), &config);
    assert_eq!((run.code, run.stdout.as_str()), (0, ""));
    // GC and CHECK while down: try again later.
    let gc = config.replacen('{', r#"{"cni.dev/valid-attachments":[],"#, 1);
    assert_eq!(error_of(&plugin_with(&env_for("GC", ""), &gc)).0, 11);
    assert_eq!(
        error_of(&plugin_with(&env_for("CHECK", "c1"), &config)).0,
        11
    );
}

#[test]
fn malformed_input_gets_the_error_json_and_reaches_nobody() {
    let node = Node::new();
    let agent = node.agent(|_| Answer::Reply(200, RESULT.to_owned()));
    let config = node.config("1.1.0", "");
    let without = |name: &str| {
        let mut env = env_for("DEL", "c1");
        env.retain(|(k, _)| *k != name);
        env
    };
    // (env, stdin, expected code, expected msg)
    type Case<'a> = (Vec<(&'a str, &'a str)>, String, u64, &'a str);
    let cases: Vec<Case> = vec![
        (
            env_for("DEL", "c1"),
            "{not json".into(),
            6,
            "network config is not JSON: expected a string (an object key), found 'n' at byte 1",
        ),
        (
            env_for("DEL", "c1"),
            "[]".into(),
            6,
            "network config is a JSON array, not an object",
        ),
        (
            without("CNI_IFNAME"),
            config.clone(),
            4,
            "required env variables [CNI_IFNAME] missing",
        ),
        (
            env_for("ATTACH", "c1"),
            config.clone(),
            4,
            "unknown CNI_COMMAND: ATTACH",
        ),
        (
            env_for("DEL", "c1"),
            config.replace("1.1.0", "0.3.1"),
            1,
            "incompatible CNI versions",
        ),
        (
            env_for("DEL", "c1"),
            config.replace("\"spoolDir\":\"", "\"spoolDir\":\"rel"),
            7,
            "ipam.spoolDir must be an absolute path",
        ),
    ];
    for (env, stdin, want, msg) in cases {
        let run = plugin_with(&env, &stdin);
        let (code, got, version) = error_of(&run);
        assert_eq!((code, got.as_str()), (want, msg), "{stdin}");
        assert_eq!(version, "1.1.0");
    }
    assert!(agent.requests().is_empty(), "bad input was forwarded");
    assert!(node.spool_files().is_empty(), "bad input changed the spool");
}

/// Plugin start + one ADD round trip against the fake agent, 200 runs. Run with
/// `cargo test -p tidepool-agent --release --test cni_plugin -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn measure_start_and_round_trip() {
    let node = Node::new();
    let _agent = node.agent(|_| Answer::Reply(200, RESULT.to_owned()));
    let config = node.config("1.1.0", "");
    let env = env_for("ADD", "c1");
    for _ in 0..10 {
        assert_eq!(plugin_with(&env, &config).code, 0); // warm the page cache
    }
    let mut times: Vec<Duration> = (0..200)
        .map(|_| {
            let run = plugin_with(&env, &config);
            assert_eq!(run.code, 0);
            run.took
        })
        .collect();
    times.sort();
    let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    let size = std::fs::metadata(BIN).map(|m| m.len()).unwrap_or_default();
    println!(
        "tidepool-cni ADD, start + round trip, 200 runs: p50 {:?}, p99 {:?}, max {:?} (binary {} KB)",
        pct(50),
        pct(99),
        times[times.len() - 1],
        size / 1024
    );
}
