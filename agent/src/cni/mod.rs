//! `tidepool-cni`, the CNI IPAM plugin (CNI spec 1.1.0, also 1.0.0): it checks what the runtime
//! passed, forwards the request to the agent over its unix socket and passes the answer through.
//!
//! Std only (no serde, no async runtime): the runtime starts one process per pod operation,
//! so start-up time is on every pod's critical path. [`run`] is the whole plugin as a function
//! of its environment and stdin; the binary only wires the process to it.
//!
//! When the agent cannot be reached (DESIGN.md, "Node agent"):
//! - DEL is spooled durably and succeeds; the agent replays it ([`spool`]).
//! - ADD retries connecting for `connectTimeout` (2 s), then fails with code 11.
//! - CHECK and GC fail with code 11.
//! - STATUS fails with code 50 only while the agent has not restored its state since boot (its
//!   marker on tmpfs is absent), or when the marker has not been refreshed (the agent touches
//!   it while it serves) for longer than `unreachableGrace` (10 min). Otherwise the agent is
//!   merely restarting, and a failure would make the node NotReady and, after 300 s, evict its
//!   pods.
//!
//! Every check on the input happens before anything is sent or written: bad input changes no
//! state.

pub mod config;
pub mod env;
pub mod http;
pub mod json;
pub mod proto;
pub mod spool;

use std::ffi::OsString;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use config::NetConf;
use env::{CniEnv, Command};
use http::HttpError;
use json::Value;
use proto::{CniError, Request, Verb, code};

/// What the process prints on stdout and stderr, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

impl Output {
    fn success(stdout: String) -> Output {
        Output {
            stdout,
            stderr: String::new(),
            exit_code: 0,
        }
    }

    fn error(e: &CniError, cni_version: &str) -> Output {
        Output {
            stdout: format!("{}\n", e.to_json(cni_version)),
            stderr: String::new(),
            exit_code: 1,
        }
    }

    /// Run by a person (no `CNI_COMMAND`): what the plugin is, its version and the CNI
    /// versions it speaks, on stderr, as the reference plugins (`skel`'s about string) print.
    fn about() -> Output {
        Output {
            stdout: String::new(),
            stderr: format!(
                "CNI tidepool-cni plugin v{}\nCNI protocol versions supported: {}\n",
                env!("CARGO_PKG_VERSION"),
                proto::SUPPORTED_VERSIONS.join(", ")
            ),
            exit_code: 0,
        }
    }
}

/// Runs the plugin once: `getenv` reads the environment, `stdin` holds the network config (not
/// read for VERSION, as in `skel`).
pub fn run(getenv: &dyn Fn(&str) -> Option<OsString>, stdin: &mut dyn Read) -> Output {
    if getenv("CNI_COMMAND").is_none_or(|c| c.is_empty()) {
        return Output::about();
    }
    let command = match Command::from_env(getenv) {
        Ok(c) => c,
        Err(e) => return Output::error(&e, proto::LATEST_VERSION),
    };
    if command == Command::Version {
        return Output::success(format!("{}\n", version_info()));
    }
    let mut input = Vec::new();
    // One byte more than the limit is enough to tell "too large".
    let read = stdin
        .take(config::MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut input);
    if let Err(e) = read {
        let e = CniError::new(
            code::IO_FAILURE,
            format!("reading the network config from stdin: {e}"),
        );
        return Output::error(&e, proto::LATEST_VERSION);
    }
    // The runtime's env is checked first (as skel does), then the config.
    let checked = CniEnv::from_env(command, getenv).and_then(|env| {
        let conf = NetConf::parse(&input)?;
        Ok((env, conf))
    });
    let (env, conf) = match checked {
        Ok(v) => v,
        Err(e) => return Output::error(&e, proto::LATEST_VERSION),
    };
    let version = match conf.supported_version() {
        Ok(v) => v.to_owned(),
        Err(e) => return Output::error(&e, proto::LATEST_VERSION),
    };
    match dispatch(&env, &conf, &version) {
        Ok(stdout) => Output::success(stdout),
        Err(e) => Output::error(&e, &version),
    }
}

/// The answer to VERSION.
pub fn version_info() -> Value {
    Value::object([
        ("cniVersion", Value::str(proto::LATEST_VERSION)),
        (
            "supportedVersions",
            Value::Array(
                proto::SUPPORTED_VERSIONS
                    .iter()
                    .map(|v| Value::str(*v))
                    .collect(),
            ),
        ),
    ])
}

fn dispatch(env: &CniEnv, conf: &NetConf, version: &str) -> Result<String, CniError> {
    let verb = match env.command {
        Command::Add => Verb::Add,
        Command::Del => Verb::Del,
        Command::Check => Verb::Check,
        Command::Gc => Verb::Gc,
        Command::Status => Verb::Status,
        Command::Version => return Ok(format!("{}\n", version_info())),
    };
    if matches!(verb, Verb::Gc | Verb::Status) && version == "1.0.0" {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "config version {version} does not allow {}",
                env.command.name()
            ),
        )
        .with_details("GC and STATUS need cniVersion 1.1.0"));
    }
    if verb == Verb::Gc {
        conf.check_valid_attachments()?;
    }
    let keyed = matches!(verb, Verb::Add | Verb::Del | Verb::Check);
    let req = Request {
        container_id: env.container_id.as_deref().filter(|_| keyed),
        ifname: env.ifname.as_deref().filter(|_| keyed),
        netns: env.netns.as_deref().filter(|_| keyed),
        pod_namespace: env.args.pod_namespace.as_deref(),
        pod_name: env.args.pod_name.as_deref(),
        pod_uid: env.args.pod_uid.as_deref(),
    };
    let body = proto::request_body(&req, version, &conf.raw);
    let ipam = &conf.ipam;
    // Only ADD waits for a restarting agent: DEL has the spool, STATUS the marker, and CHECK
    // and GC are retried by whoever calls them.
    let wait = if verb == Verb::Add {
        ipam.connect_timeout
    } else {
        Duration::ZERO
    };
    let answer = http::connect(&ipam.socket, wait).and_then(|stream| {
        http::post_json(
            stream,
            &ipam.socket,
            verb.path(),
            &body.to_string(),
            ipam.request_timeout,
        )
    });
    match answer {
        Ok(r) if r.status == 200 => success_output(verb, &r.body),
        Ok(r) => Err(CniError::from_agent(r.status, &r.body)),
        Err(e) => agent_unreachable(verb, env, conf, body, &e),
    }
}

/// A 200 answer: ADD prints the agent's result (checked to be a JSON object, so the runtime
/// never gets garbage as a success); the other verbs print nothing, as the spec says.
fn success_output(verb: Verb, body: &[u8]) -> Result<String, CniError> {
    if verb != Verb::Add {
        return Ok(String::new());
    }
    let invalid = |why: String| {
        CniError::new(
            code::GENERIC,
            "tidepool agent answered ADD with an invalid result",
        )
        .with_details(why)
    };
    let text = std::str::from_utf8(body).map_err(|_| invalid("not UTF-8".into()))?;
    let result = json::parse(text).map_err(|e| invalid(e.to_string()))?;
    if !result.is_object() {
        return Err(invalid(format!("a JSON {}, not an object", result.kind())));
    }
    Ok(format!("{}\n", text.trim()))
}

/// What each verb does when the agent could not be reached or the exchange broke.
fn agent_unreachable(
    verb: Verb,
    env: &CniEnv,
    conf: &NetConf,
    del_body: Value,
    e: &HttpError,
) -> Result<String, CniError> {
    let ipam = &conf.ipam;
    match verb {
        Verb::Del => {
            // DEL is idempotent on the agent, so spooling after a broken exchange that may have
            // reached it is safe.
            let (Some(id), Some(ifname)) = (env.container_id.as_deref(), env.ifname.as_deref())
            else {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    "DEL without CNI_CONTAINERID or CNI_IFNAME",
                ));
            };
            let record = proto::spool_record(del_body, unix_millis());
            spool::write(&ipam.spool_dir, id, ifname, &record.to_string()).map_err(|io| {
                CniError::new(
                    code::IO_FAILURE,
                    "tidepool agent unreachable and the DEL could not be spooled",
                )
                .with_details(format!("{e}; spool {}: {io}", ipam.spool_dir.display()))
            })?;
            Ok(String::new())
        }
        Verb::Status => status_while_unreachable(ipam, e),
        Verb::Add | Verb::Check | Verb::Gc => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            "tidepool agent unreachable, try again later",
        )
        .with_details(e.to_string())),
    }
}

/// STATUS without an agent: success while the agent restored its state since boot and
/// refreshed its marker within the grace (a restart or rollout); code 50 otherwise.
fn status_while_unreachable(ipam: &config::IpamConfig, e: &HttpError) -> Result<String, CniError> {
    let marker = &ipam.restored_marker;
    let unavailable = |why: String| {
        Err(CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            "the tidepool agent is not available",
        )
        .with_details(format!("{e}; and {why}")))
    };
    let refreshed = match std::fs::metadata(marker).and_then(|m| m.modified()) {
        Ok(t) => t,
        Err(_) => {
            return unavailable(format!(
                "it has not restored its state since boot ({} is absent)",
                marker.display()
            ));
        }
    };
    // A marker from the future (clock stepped back) counts as fresh.
    let silent = SystemTime::now()
        .duration_since(refreshed)
        .unwrap_or(Duration::ZERO);
    if silent > ipam.unreachable_grace {
        return unavailable(format!(
            "it has not refreshed {} for {} s (grace {} s)",
            marker.display(),
            silent.as_secs(),
            ipam.unreachable_grace.as_secs()
        ));
    }
    Ok(String::new())
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests;
