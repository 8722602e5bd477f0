//! The network config on stdin, and this plugin's IPAM section in it.
//!
//! As a delegated IPAM plugin we get the main plugin's whole config; ours is its `ipam` object:
//! `{"type": "tidepool-cni", "socket": "/run/tidepool/agent.sock"}`. Every other key is optional
//! and exists for tests and unusual layouts. Bytes that are not a JSON object, or a key of the
//! wrong JSON type, are a decoding failure (code 6, as Go's decoder would fail); well-typed but
//! unusable values (a relative path, a socket path too long for `sun_path`) are code 7.

use std::path::PathBuf;
use std::time::Duration;

use super::json::{self, Value};
use super::proto::{self, CniError, code};

/// Largest network config accepted; configs are a few KiB, this only bounds memory.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// How long ADD keeps trying to connect while the agent is down (IPAM key `connectTimeout`, ms).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take once connected (IPAM key `requestTimeout`, ms). Longer than
/// the agent's own wait for a block on an empty pool, so its code 11 reaches the runtime.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent may be unreachable, its restore marker not refreshed, before STATUS
/// fails (IPAM key `unreachableGrace`, ms). Far beyond a rollout restart (seconds) but
/// bounded: an agent that stays down cannot serve ADD, and a NotReady node gets no new pods.
pub const DEFAULT_UNREACHABLE_GRACE: Duration = Duration::from_secs(600);
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// The network config and what this plugin takes from it.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// The whole config object, forwarded to the agent as it came.
    pub raw: Value,
    /// `cniVersion`, or `None` when the config has none (libcni reads that as 0.1.0).
    pub cni_version: Option<String>,
    pub ipam: IpamConfig,
}

/// The plugin's own settings from the `ipam` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    pub socket: PathBuf,
    pub spool_dir: PathBuf,
    pub restored_marker: PathBuf,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub unreachable_grace: Duration,
}

impl NetConf {
    /// Decodes stdin. A config without an `ipam` object (the plugin called directly, not
    /// through a main plugin) gets the defaults.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        if stdin.len() > MAX_CONFIG_BYTES {
            return Err(decoding(format!(
                "network config is larger than {MAX_CONFIG_BYTES} bytes"
            )));
        }
        let text = std::str::from_utf8(stdin).map_err(|e| {
            decoding(format!(
                "network config is not UTF-8 (byte {})",
                e.valid_up_to()
            ))
        })?;
        let raw =
            json::parse(text).map_err(|e| decoding(format!("network config is not JSON: {e}")))?;
        if !raw.is_object() {
            return Err(decoding(format!(
                "network config is a JSON {}, not an object",
                raw.kind()
            )));
        }
        let cni_version = match raw.get("cniVersion") {
            None => None,
            Some(Value::String(v)) => Some(v.clone()),
            Some(v) => {
                return Err(decoding(format!(
                    "cniVersion must be a string, got {}",
                    v.kind()
                )));
            }
        };
        let ipam = match raw.get("ipam") {
            None => IpamConfig::default(),
            Some(v @ Value::Object(_)) => IpamConfig::parse(v)?,
            Some(v) => {
                return Err(decoding(format!(
                    "ipam must be an object, got {}",
                    v.kind()
                )));
            }
        };
        Ok(NetConf {
            raw,
            cni_version,
            ipam,
        })
    }

    /// The config's version if this plugin supports it; otherwise code 1 naming both sides.
    pub fn supported_version(&self) -> Result<&str, CniError> {
        let supported = proto::SUPPORTED_VERSIONS.join(", ");
        match self.cni_version.as_deref() {
            Some(v) if proto::SUPPORTED_VERSIONS.contains(&v) => Ok(v),
            Some(v) => Err(
                CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                    .with_details(format!("config is {v:?}, plugin supports {supported}")),
            ),
            None => Err(
                CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions")
                    .with_details(format!(
                        "config has no cniVersion (0.1.0), plugin supports {supported}"
                    )),
            ),
        }
    }

    /// GC's `cni.dev/valid-attachments`, checked: an array of `{containerID, ifname}` objects.
    /// Missing is an error, not an empty list: read as empty it would free every attachment.
    pub fn check_valid_attachments(&self) -> Result<(), CniError> {
        const KEY: &str = "cni.dev/valid-attachments";
        let list = match self.raw.get(KEY) {
            None => {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("GC config has no {KEY}"),
                ));
            }
            Some(v) => v
                .as_array()
                .ok_or_else(|| decoding(format!("{KEY} must be an array, got {}", v.kind())))?,
        };
        for (i, item) in list.iter().enumerate() {
            for field in ["containerID", "ifname"] {
                if item.get(field).and_then(Value::as_str).is_none() {
                    return Err(decoding(format!("{KEY}[{i}] has no string {field}")));
                }
            }
        }
        Ok(())
    }
}

impl Default for IpamConfig {
    fn default() -> Self {
        IpamConfig {
            socket: PathBuf::from(proto::DEFAULT_SOCKET),
            spool_dir: PathBuf::from(proto::DEFAULT_SPOOL_DIR),
            restored_marker: PathBuf::from(proto::DEFAULT_RESTORED_MARKER),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            unreachable_grace: DEFAULT_UNREACHABLE_GRACE,
        }
    }
}

impl IpamConfig {
    fn parse(ipam: &Value) -> Result<IpamConfig, CniError> {
        let mut cfg = IpamConfig::default();
        if let Some(p) = path(ipam, "socket")? {
            if p.len() > MAX_SOCKET_PATH {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("ipam.socket is longer than {MAX_SOCKET_PATH} bytes"),
                )
                .with_details(p));
            }
            cfg.socket = p.into();
        }
        if let Some(p) = path(ipam, "spoolDir")? {
            cfg.spool_dir = p.into();
        }
        if let Some(p) = path(ipam, "restoredMarker")? {
            cfg.restored_marker = p.into();
        }
        if let Some(d) = millis(ipam, "connectTimeout")? {
            cfg.connect_timeout = d;
        }
        if let Some(d) = millis(ipam, "requestTimeout")? {
            cfg.request_timeout = d;
        }
        if let Some(d) = millis(ipam, "unreachableGrace")? {
            cfg.unreachable_grace = d;
        }
        Ok(cfg)
    }
}

/// An absolute path under `ipam.<key>`: the plugin runs in the runtime's working directory, so a
/// relative one would mean something different on every node.
fn path(ipam: &Value, key: &str) -> Result<Option<String>, CniError> {
    match ipam.get(key) {
        None => Ok(None),
        Some(Value::String(p)) if p.starts_with('/') => Ok(Some(p.clone())),
        Some(Value::String(p)) => Err(CniError::new(
            code::INVALID_CONFIG,
            format!("ipam.{key} must be an absolute path"),
        )
        .with_details(p.clone())),
        Some(v) => Err(decoding(format!(
            "ipam.{key} must be a string, got {}",
            v.kind()
        ))),
    }
}

/// A duration in whole milliseconds under `ipam.<key>`.
fn millis(ipam: &Value, key: &str) -> Result<Option<Duration>, CniError> {
    match ipam.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|ms| Some(Duration::from_millis(ms)))
            .ok_or_else(|| {
                decoding(format!(
                    "ipam.{key} must be a non-negative integer (milliseconds), got {v}"
                ))
            }),
    }
}

fn decoding(msg: String) -> CniError {
    CniError::new(code::DECODING_FAILURE, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NetConf, CniError> {
        NetConf::parse(text.as_bytes())
    }

    #[test]
    fn defaults_and_overrides() {
        let conf = parse(
            r#"{"cniVersion":"1.1.0","name":"n","type":"ptp","ipam":{"type":"tidepool-cni"}}"#,
        )
        .expect("config");
        assert_eq!(conf.ipam, IpamConfig::default());
        assert_eq!(conf.ipam.socket, PathBuf::from("/run/tidepool/agent.sock"));
        assert_eq!(conf.supported_version(), Ok("1.1.0"));

        let conf = parse(
            r#"{"cniVersion":"1.0.0","ipam":{"type":"tidepool-cni","socket":"/tmp/a.sock",
                "spoolDir":"/tmp/spool","restoredMarker":"/tmp/m","connectTimeout":150,"requestTimeout":900,
                "unreachableGrace":60000}}"#,
        )
        .expect("config");
        assert_eq!(
            conf.ipam,
            IpamConfig {
                socket: "/tmp/a.sock".into(),
                spool_dir: "/tmp/spool".into(),
                restored_marker: "/tmp/m".into(),
                connect_timeout: Duration::from_millis(150),
                request_timeout: Duration::from_millis(900),
                unreachable_grace: Duration::from_secs(60),
            }
        );
        assert_eq!(conf.supported_version(), Ok("1.0.0"));
        // Called directly, without a main plugin's ipam section.
        assert_eq!(
            parse(r#"{"cniVersion":"1.1.0"}"#).expect("bare").ipam,
            IpamConfig::default()
        );
    }

    #[test]
    fn undecodable_configs_are_code_6_and_say_why() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"",
                "network config is not JSON: expected a JSON value, found the end of the input at byte 0",
            ),
            (
                b"{\"cniVersion\":",
                "network config is not JSON: expected a JSON value, found the end of the input at byte 14",
            ),
            (b"\xff{}", "network config is not UTF-8 (byte 0)"),
            (b"[1]", "network config is a JSON array, not an object"),
            (
                br#"{"cniVersion":1}"#,
                "cniVersion must be a string, got number",
            ),
            (
                br#"{"cniVersion":"1.1.0","ipam":"x"}"#,
                "ipam must be an object, got string",
            ),
            (
                br#"{"cniVersion":"1.1.0","ipam":{"socket":5}}"#,
                "ipam.socket must be a string, got number",
            ),
            (
                br#"{"cniVersion":"1.1.0","ipam":{"connectTimeout":"2s"}}"#,
                r#"ipam.connectTimeout must be a non-negative integer (milliseconds), got "2s""#,
            ),
            (
                br#"{"cniVersion":"1.1.0","ipam":{"requestTimeout":-1}}"#,
                "ipam.requestTimeout must be a non-negative integer (milliseconds), got -1",
            ),
        ];
        for (text, msg) in cases {
            let e = NetConf::parse(text).expect_err(msg);
            assert_eq!((e.code, e.msg.as_str()), (6, *msg));
        }
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert_eq!(NetConf::parse(&big).expect_err("big").code, 6);
    }

    #[test]
    fn unusable_values_are_code_7() {
        let e = parse(r#"{"cniVersion":"1.1.0","ipam":{"socket":"agent.sock"}}"#)
            .expect_err("relative");
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (7, "ipam.socket must be an absolute path", "agent.sock")
        );
        let long = format!(
            r#"{{"cniVersion":"1.1.0","ipam":{{"socket":"/{}"}}}}"#,
            "s".repeat(107)
        );
        let e = parse(&long).expect_err("too long for sun_path");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "ipam.socket is longer than 107 bytes")
        );
        let e =
            parse(r#"{"cniVersion":"1.1.0","ipam":{"spoolDir":"spool"}}"#).expect_err("relative");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "ipam.spoolDir must be an absolute path")
        );
    }

    #[test]
    fn versions_outside_1_0_and_1_1_are_code_1() {
        for v in ["0.4.0", "0.3.1", "1.2.0", "x"] {
            let conf = parse(&format!(r#"{{"cniVersion":"{v}"}}"#)).expect("decodes");
            let e = conf.supported_version().expect_err(v);
            assert_eq!((e.code, e.msg.as_str()), (1, "incompatible CNI versions"));
            assert_eq!(
                e.details,
                format!("config is {v:?}, plugin supports 1.0.0, 1.1.0")
            );
        }
        let e = parse("{}")
            .expect("decodes")
            .supported_version()
            .expect_err("none");
        assert_eq!(
            e.details,
            "config has no cniVersion (0.1.0), plugin supports 1.0.0, 1.1.0"
        );
    }

    #[test]
    fn gc_attachments_are_checked_and_never_defaulted() {
        let check = |text: &str| parse(text).expect("decodes").check_valid_attachments();
        assert_eq!(
            check(
                r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#
            ),
            Ok(())
        );
        assert_eq!(
            check(r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":[]}"#),
            Ok(())
        );
        let e = check(r#"{"cniVersion":"1.1.0"}"#).expect_err("missing");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (7, "GC config has no cni.dev/valid-attachments")
        );
        let e =
            check(r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":{}}"#).expect_err("object");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (6, "cni.dev/valid-attachments must be an array, got object")
        );
        let e =
            check(r#"{"cniVersion":"1.1.0","cni.dev/valid-attachments":[{"containerID":"a"}]}"#)
                .expect_err("no ifname");
        assert_eq!(
            (e.code, e.msg.as_str()),
            (6, "cni.dev/valid-attachments[0] has no string ifname")
        );
    }
}
