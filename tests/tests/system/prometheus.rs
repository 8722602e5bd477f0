//! Prometheus as the tests meet it: plain HTTP GETs on loopback (scraping `/metrics`,
//! asking probes), promtool's check of an exposition, and a real Prometheus
//! (`/usr/bin/prometheus`, Debian package `prometheus`) on a loopback port scraping the
//! targets a test names, read through its HTTP API. The Prometheus process and its data
//! directory go when the [`Prometheus`] is dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::KillOnDrop;

/// Where Debian's `prometheus` package puts the server (promtool comes with it).
pub const PROMETHEUS_BIN: &str = "/usr/bin/prometheus";

/// A loopback address nothing listens on right now (for a process's listen flag).
pub fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

pub type Http = Client<HttpConnector, Empty<Bytes>>;

pub fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `GET http://{addr}{path}`: status and body; `None` while nothing answers.
pub async fn get(client: &Http, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let uri = format!("http://{addr}{path}").parse().expect("uri");
    let resp = tokio::time::timeout(Duration::from_secs(5), client.get(uri))
        .await
        .ok()?
        .ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8(body.to_vec()).expect("utf-8")))
}

/// Percent-encodes everything but unreserved characters (a query string value).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether Debian's `prometheus` (server and promtool) is installed.
pub fn installed() -> bool {
    Path::new(PROMETHEUS_BIN).is_file()
}

/// promtool's findings on an exposition (`promtool check metrics`): `Ok` when it accepts
/// the text without a finding, else its words.
pub fn promtool_check_metrics(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("promtool: {e} (install Debian's prometheus)"))?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && findings.trim().is_empty() {
        Ok(())
    } else {
        Err(findings)
    }
}

/// One scrape target: its job, its address, and the target labels service discovery
/// would attach (`namespace`, `node`), as Prometheus's `static_configs` labels.
pub struct Target {
    pub job: &'static str,
    pub addr: SocketAddr,
    pub labels: Vec<(&'static str, String)>,
}

/// One sample of an instant query's result: the series' labels and its value.
#[derive(Debug, Clone)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus server the test started; killed (and its data removed) when dropped.
pub struct Prometheus {
    pub web: SocketAddr,
    client: Http,
    // the process first, then its data directory (fields drop in order)
    process: KillOnDrop,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on a loopback port, scraping `targets` every `interval`.
    /// Panics when it is not installed (the caller decides whether to skip).
    pub fn start(targets: &[Target], interval: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, config_yaml(targets, interval)).expect("config");
        let web = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(PROMETHEUS_BIN)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {PROMETHEUS_BIN}: {e}"));
        Prometheus {
            web,
            client: http(),
            process: KillOnDrop(child),
            dir,
        }
    }

    /// Its log so far (for a failure message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/{path}`: the `data` of a success; the error Prometheus gave (a query
    /// that does not parse is one) or `None` while it does not answer.
    async fn api(&self, path: &str) -> Option<Result<Value, String>> {
        let (code, body) = get(&self.client, self.web, &format!("/api/v1/{path}")).await?;
        let v: Value = serde_json::from_str(&body).ok()?;
        if code == 200 && v["status"] == "success" {
            Some(Ok(v["data"].clone()))
        } else {
            Some(Err(format!("{code}: {} {}", v["errorType"], v["error"])))
        }
    }

    /// An instant query at the current time: its samples (a scalar result is one sample
    /// without labels), or Prometheus's error.
    pub async fn query(&self, q: &str) -> Result<Vec<Sample>, String> {
        let data = self
            .api(&format!("query?query={}", percent_encode(q)))
            .await
            .ok_or_else(|| format!("Prometheus at {} does not answer", self.web))??;
        let number = |v: &Value| -> f64 {
            // "NaN", "+Inf", "-Inf" and plain numbers, as strings
            v[1].as_str()
                .and_then(|s| s.parse().ok())
                .expect("a sample's value")
        };
        Ok(match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .expect("a vector")
                .iter()
                .map(|s| Sample {
                    labels: labels(&s["metric"]),
                    value: number(&s["value"]),
                })
                .collect(),
            Some("scalar") => vec![Sample {
                labels: BTreeMap::new(),
                value: number(&data["result"]),
            }],
            other => return Err(format!("unexpected result type {other:?} for {q}")),
        })
    }

    /// The label sets of every series `selector` matches in the whole TSDB (`/api/v1/series`).
    pub async fn series(&self, selector: &str) -> Result<Vec<BTreeMap<String, String>>, String> {
        let data = self
            .api(&format!("series?match[]={}", percent_encode(selector)))
            .await
            .ok_or_else(|| format!("Prometheus at {} does not answer", self.web))??;
        Ok(data
            .as_array()
            .expect("a list of series")
            .iter()
            .map(labels)
            .collect())
    }

    /// The values `label` takes on the series of `metric` (Grafana's `label_values`).
    pub async fn label_values(&self, metric: &str, label: &str) -> Result<Vec<String>, String> {
        let data = self
            .api(&format!(
                "label/{label}/values?match[]={}",
                percent_encode(metric)
            ))
            .await
            .ok_or_else(|| format!("Prometheus at {} does not answer", self.web))??;
        Ok(data
            .as_array()
            .expect("a list of values")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// Polls `q` until its result satisfies `ok` (60 s at most: Prometheus starts, then
    /// scrapes at its interval, on a loaded machine); returns that result.
    pub async fn until(&self, what: &str, q: &str, ok: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = self.query(q).await;
            if let Ok(samples) = &r
                && ok(samples)
            {
                return samples.clone();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {q} gave {r:?}\nPrometheus' log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn labels(metric: &Value) -> BTreeMap<String, String> {
    metric
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The configuration: one job per target, its labels as static target labels. The
/// evaluation interval is the scrape interval too: it is the step of a subquery that names
/// none (`x[6h:]`, the exhaustion forecast alert's), which at the default minute would
/// have no two points in a run this short.
fn config_yaml(targets: &[Target], interval: &str) -> String {
    let mut out = format!(
        "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  \
         evaluation_interval: {interval}\nscrape_configs:\n"
    );
    for t in targets {
        out += &format!(
            "  - job_name: {}\n    static_configs:\n      - targets: ['{}']\n",
            t.job, t.addr
        );
        if !t.labels.is_empty() {
            out += "        labels:\n";
            for (k, v) in &t.labels {
                out += &format!(
                    "          {k}: {}\n",
                    serde_json::to_string(v).expect("a string")
                );
            }
        }
    }
    out
}
