//! Records how an API server answers every request shape tidepool's operator and agent send
//! (tests/README.md, "Contract: every request the binaries send"), one JSON fixture per row.
//!
//! `tidepool-contract --kubeconfig PATH --out DIR`
//!
//! Run it against a disposable cluster (kind, or envtest's kube-apiserver) where tidepool is
//! not running: it installs the CRDs of deploy/crds if they are absent (and leaves them),
//! creates its objects under a unique name prefix (`contract-…`), and deletes them again.
//! Answers are normalized (see `normalize.rs`) so that a fixture recorded on one cluster
//! compares with another's; `tests/tests/contract.rs` compares the in-process server's.

mod normalize;
mod rows;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http_body_util::BodyExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Request;
use serde_json::{Value, json};

use normalize::Normalizer;

/// An answer: its HTTP status code and its body (JSON, or the text as a string).
pub struct Answer {
    pub code: u16,
    pub body: Value,
}

impl Answer {
    /// The body's `metadata.resourceVersion`.
    pub fn rv(&self) -> String {
        self.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub fn uid(&self) -> String {
        self.body["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

pub struct Recorder {
    client: kube::Client,
    /// Every name this run creates starts with it.
    pub prefix: String,
    out: PathBuf,
}

impl Recorder {
    /// Sends `req` and reads the whole answer.
    pub async fn call(&self, req: http::Request<Vec<u8>>) -> anyhow::Result<Answer> {
        let resp = self.client.send(req.map(kube::client::Body::from)).await?;
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer { code, body })
    }

    /// Sends `req` (a step that is not a row) and requires a 2xx answer.
    pub async fn setup(&self, what: &str, req: http::Request<Vec<u8>>) -> anyhow::Result<Answer> {
        let a = self.call(req).await?;
        if !(200..300).contains(&a.code) {
            bail!("{what}: {} {}", a.code, a.body);
        }
        Ok(a)
    }

    /// One row: sends `req`, writes the request and the answer to `DIR/{name}.json`.
    pub async fn row(&self, name: &str, req: http::Request<Vec<u8>>) -> anyhow::Result<Answer> {
        self.row_after(name, req, Value::Null).await
    }

    /// A row whose fixture also keeps `before` (say, the object's resourceVersion before the
    /// request), normalized with the row.
    pub async fn row_after(
        &self,
        name: &str,
        req: http::Request<Vec<u8>>,
        before: Value,
    ) -> anyhow::Result<Answer> {
        let mut n = Normalizer::new(&self.prefix);
        let request = describe(&mut n, &req);
        let answer = self.call(req).await?;
        let before = n.value(&before);
        let summary = json!({ "code": answer.code, "body": summarize(&mut n, &answer.body) });
        self.write(name, request, before, summary)?;
        Ok(answer)
    }

    /// A watch row: reads events (bookmarks left out) until `deleted` DELETED events came or
    /// 15 s passed, then hangs up.
    pub async fn watch_row(
        &self,
        name: &str,
        req: http::Request<Vec<u8>>,
        deleted: usize,
    ) -> anyhow::Result<()> {
        let mut n = Normalizer::new(&self.prefix);
        let request = describe(&mut n, &req);
        let resp = self.client.send(req.map(kube::client::Body::from)).await?;
        let code = resp.status().as_u16();
        let mut body = std::pin::pin!(resp.into_body());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let (mut buf, mut events, mut seen) = (Vec::new(), Vec::new(), 0);
        while seen < deleted {
            let Ok(Some(frame)) = tokio::time::timeout_at(deadline, body.as_mut().frame()).await
            else {
                break;
            };
            if let Ok(data) = frame?.into_data() {
                buf.extend_from_slice(&data);
            }
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                let ev: Value = serde_json::from_slice(&line).context("a watch event")?;
                seen += usize::from(ev["type"] == "DELETED");
                if ev["type"] != "BOOKMARK" {
                    events.push(watch_event(&mut n, &ev));
                }
            }
        }
        let summary = json!({ "code": code, "events": events });
        self.write(name, request, Value::Null, summary)
    }

    fn write(
        &self,
        name: &str,
        request: Value,
        before: Value,
        answer: Value,
    ) -> anyhow::Result<()> {
        let mut row = json!({ "row": name, "request": request });
        if !before.is_null() {
            row["before"] = before;
        }
        row["answer"] = answer;
        let path = self.out.join(format!("{name}.json"));
        let text = serde_json::to_string_pretty(&row)? + "\n";
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("{name}: {}", row["answer"]["code"]);
        Ok(())
    }
}

/// Method, path, query, content type and body of a request, normalized.
fn describe(n: &mut Normalizer, req: &http::Request<Vec<u8>>) -> Value {
    let ctype = req.headers().get(http::header::CONTENT_TYPE);
    let body: Value = serde_json::from_slice(req.body()).unwrap_or(Value::Null);
    json!({
        "method": req.method().as_str(),
        "path": n.text(req.uri().path()),
        "query": n.query(req.uri().query().unwrap_or_default()),
        "contentType": ctype.and_then(|c| c.to_str().ok()),
        "body": n.value(&body),
    })
}

/// What of an answer is compared: a whole object or Status; of a list its kind, its
/// metadata and the names of this run's items (a real cluster has others); of `/version`
/// its keys.
fn summarize(n: &mut Normalizer, body: &Value) -> Value {
    let kind = body["kind"].as_str().unwrap_or_default();
    if kind.ends_with("List") {
        let prefix = n.prefix().to_string();
        let ours: Vec<Value> = (body["items"].as_array().into_iter().flatten())
            .filter_map(|i| i["metadata"]["name"].as_str())
            .filter(|name| name.starts_with(&prefix))
            .map(|name| Value::String(n.text(name)))
            .collect();
        let page = body["items"].as_array().map_or(0, Vec::len);
        return json!({
            "kind": kind,
            "metadata": n.value(&body["metadata"]),
            "pageLength": page,
            "items": ours,
        });
    }
    if body.get("kind").is_none()
        && let Some(m) = body.as_object()
    {
        return json!({ "keys": m.keys().collect::<Vec<_>>() });
    }
    n.value(body)
}

/// A watch event: its type and the object's name, resourceVersion, finalizers and
/// deletionTimestamp (an ERROR's Status whole).
fn watch_event(n: &mut Normalizer, ev: &Value) -> Value {
    let o = &ev["object"];
    if ev["type"] == "ERROR" {
        return json!({ "type": "ERROR", "object": n.value(o) });
    }
    let m = &o["metadata"];
    let meta = json!({
        "name": m["name"],
        "resourceVersion": m["resourceVersion"],
        "finalizers": m["finalizers"],
        "deletionTimestamp": m["deletionTimestamp"],
    });
    json!({ "type": ev["type"], "object": { "kind": o["kind"], "metadata": n.value(&meta) } })
}

fn usage() -> ! {
    eprintln!("usage: tidepool-contract --kubeconfig PATH --out DIR");
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (mut kubeconfig, mut out) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--kubeconfig" => kubeconfig = args.next().map(PathBuf::from),
            "--out" => out = args.next().map(PathBuf::from),
            _ => usage(),
        }
    }
    let (Some(kubeconfig), Some(out)) = (kubeconfig, out) else {
        usage()
    };
    let kc = Kubeconfig::read_from(&kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    std::fs::create_dir_all(&out)?;
    let r = Recorder {
        client: kube::Client::try_from(config)?,
        prefix: unique_prefix(),
        out,
    };
    rows::install_crds(&r).await?;
    let result = rows::run(&r).await;
    rows::clean_up(&r).await;
    result
}

/// `contract-` and six hex digits of the clock.
fn unique_prefix() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("contract-{:06x}", t.subsec_nanos() & 0xff_ffff)
}

/// Waits until `done` holds, polling every 200 ms, at most `timeout`.
pub async fn poll<F, Fut>(what: &str, timeout: Duration, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    while !done().await? {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A request builder for `path`.
pub fn at(path: &str) -> Request {
    Request::new(path)
}
