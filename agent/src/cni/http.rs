//! A tiny HTTP/1.1 client over a unix socket: one request per connection, bounded in time.
//!
//! Why not a crate: the plugin is std-only (see `json.rs`). It needs exactly one exchange per run:
//! write a request with a `Content-Length`, read a status, headers and a body framed by
//! `Content-Length`, by chunked encoding, or by the agent closing the connection.
//!
//! Errors say whether the agent was never reached ([`HttpError::Connect`]: nothing was sent, so
//! retrying or spooling is safe) or the exchange broke after connecting ([`HttpError::Exchange`]:
//! the agent may or may not have acted on it).

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest response accepted; CNI results are a few hundred bytes.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Pause between connection attempts while waiting for the agent's socket.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// An HTTP response: status code and (de-chunked) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why an exchange failed (no `thiserror` here: the plugin is std-only).
#[derive(Debug)]
pub enum HttpError {
    /// Nothing was sent: the socket is missing, refuses, or cannot be opened.
    Connect { path: String, source: io::Error },
    /// Connected, then the request or the answer broke, timed out or made no sense.
    Exchange { path: String, reason: String },
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect { path, source } => write!(f, "cannot connect to {path}: {source}"),
            HttpError::Exchange { path, reason } => {
                write!(f, "exchange with {path} failed: {reason}")
            }
        }
    }
}

impl std::error::Error for HttpError {}

/// Connects to the unix socket at `path`, retrying for up to `wait` while the socket is missing
/// or refuses (the agent is starting or restarting). Other errors fail at once.
pub fn connect(path: &Path, wait: Duration) -> Result<UnixStream, HttpError> {
    let deadline = Instant::now() + wait;
    loop {
        match UnixStream::connect(path) {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                let retryable = matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
                );
                let now = Instant::now();
                if !retryable || now >= deadline {
                    return Err(HttpError::Connect {
                        path: path.display().to_string(),
                        source: e,
                    });
                }
                std::thread::sleep(RETRY_PAUSE.min(deadline - now));
            }
        }
    }
}

/// Sends `POST {target}` with the JSON `body` on `stream` and reads the answer, all within
/// `timeout`. `socket` only names the peer in errors.
pub fn post_json(
    mut stream: UnixStream,
    socket: &Path,
    target: &str,
    body: &str,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let deadline = Instant::now() + timeout;
    let fail = |reason: String| HttpError::Exchange {
        path: socket.display().to_string(),
        reason,
    };
    let request = format!(
        "POST {target} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: tidepool-cni/{}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        env!("CARGO_PKG_VERSION"),
        body.len(),
    );
    set_timeout(&stream, deadline, UnixStream::set_write_timeout).map_err(&fail)?;
    stream
        .write_all(request.as_bytes())
        .map_err(|e| fail(io_reason("sending the request", &e)))?;

    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(response) = parse_response(&buf, false).map_err(&fail)? {
            return Ok(response);
        }
        set_timeout(&stream, deadline, UnixStream::set_read_timeout).map_err(&fail)?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(fail(io_reason("reading the answer", &e))),
        };
        if n == 0 {
            return parse_response(&buf, true)
                .map_err(&fail)?
                .ok_or_else(|| fail("the agent closed the connection mid-answer".into()));
        }
        if buf.len() + n > MAX_RESPONSE_BYTES {
            return Err(fail(format!(
                "answer larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Sets a socket timeout to the time left before `deadline`; none left is a timeout.
fn set_timeout(
    stream: &UnixStream,
    deadline: Instant,
    set: fn(&UnixStream, Option<Duration>) -> io::Result<()>,
) -> Result<(), String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("timed out".into());
    }
    set(stream, Some(left)).map_err(|e| format!("setting a socket timeout: {e}"))
}

fn io_reason(doing: &str, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!("timed out {doing}"),
        _ => format!("{doing}: {e}"),
    }
}

/// Parses a complete response from `buf`; `Ok(None)` means more bytes are needed. With `eof`,
/// a body without `Content-Length` or chunking ends at the end of the input.
fn parse_response(buf: &[u8], eof: bool) -> Result<Option<Response>, String> {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| "response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = parse_status_line(status_line)?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| format!("bad Content-Length {value:?}"))?;
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .to_ascii_lowercase()
                .split(',')
                .any(|t| t.trim() == "chunked");
        }
    }
    let rest = &buf[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = content_length {
        if n > MAX_RESPONSE_BYTES {
            return Err(format!(
                "Content-Length {n} is larger than {MAX_RESPONSE_BYTES}"
            ));
        }
        (rest.len() >= n).then(|| rest[..n].to_vec())
    } else if status == 204 || status == 304 {
        Some(Vec::new())
    } else {
        eof.then(|| rest.to_vec())
    };
    Ok(body.map(|body| Response { status, body }))
}

fn parse_status_line(line: &str) -> Result<u16, String> {
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !(version == "HTTP/1.1" || version == "HTTP/1.0") || code.len() != 3 {
        return Err(format!("bad status line {line:?}"));
    }
    code.parse()
        .map_err(|_| format!("bad status line {line:?}"))
}

/// Decodes a chunked body; `Ok(None)` while the last chunk has not arrived.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&rest[..line_end]).map_err(|_| "bad chunk size line")?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            // Trailers (ignored) end with an empty line.
            return Ok(find(rest, b"\r\n").map(|_| body));
        }
        if size > MAX_RESPONSE_BYTES {
            return Err(format!(
                "chunk of {size} bytes is larger than {MAX_RESPONSE_BYTES}"
            ));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        if &rest[size..size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn resp(status: u16, body: &str) -> Option<Response> {
        Some(Response {
            status,
            body: body.as_bytes().to_vec(),
        })
    }

    #[test]
    fn content_length_bodies() {
        let full =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(full, false), Ok(resp(200, "{}")));
        assert_eq!(parse_response(&full[..full.len() - 1], false), Ok(None));
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\n", false), Ok(None));
        // Extra bytes after the body are not ours to read.
        let extra = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 1\r\n\r\nxy";
        assert_eq!(parse_response(extra, false), Ok(resp(503, "x")));
    }

    #[test]
    fn chunked_and_close_delimited_bodies() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked, false), Ok(resp(200, "{\"a\":1}")));
        assert_eq!(
            parse_response(&chunked[..chunked.len() - 2], false),
            Ok(None)
        );
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        assert_eq!(
            parse_response(bad, false),
            Err("bad chunk size \"zz\"".into())
        );
        let close = b"HTTP/1.1 500 Internal Server Error\r\n\r\noops";
        assert_eq!(parse_response(close, false), Ok(None));
        assert_eq!(parse_response(close, true), Ok(resp(500, "oops")));
        assert_eq!(
            parse_response(b"HTTP/1.1 204 No Content\r\n\r\n", false),
            Ok(resp(204, ""))
        );
    }

    #[test]
    fn malformed_heads_are_errors() {
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 2000 OK\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", false).is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false).is_err());
    }

    #[test]
    fn a_round_trip_over_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("a.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut req = Vec::new();
            let mut chunk = [0u8; 1024];
            while !req.ends_with(b"{\"x\":1}") {
                let n = conn.read(&mut chunk).expect("read");
                req.extend_from_slice(&chunk[..n]);
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n{\"y\":2")
                .expect("write");
            String::from_utf8(req).expect("utf-8")
        });
        let stream = connect(&sock, Duration::ZERO).expect("connect");
        let r = post_json(
            stream,
            &sock,
            "/v1/cni/add",
            "{\"x\":1}",
            Duration::from_secs(5),
        )
        .expect("exchange");
        assert_eq!(
            r,
            Response {
                status: 200,
                body: b"{\"y\":2".to_vec()
            }
        );
        let req = server.join().expect("server");
        assert!(
            req.starts_with("POST /v1/cni/add HTTP/1.1\r\nHost: localhost\r\n"),
            "{req}"
        );
        assert!(
            req.contains("\r\nContent-Length: 7\r\nConnection: close\r\n\r\n{\"x\":1}"),
            "{req}"
        );
    }

    #[test]
    fn a_silent_agent_times_out_and_a_missing_one_is_a_connect_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("a.sock");
        let started = Instant::now();
        let e = connect(&sock, Duration::from_millis(100)).expect_err("no socket");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(matches!(e, HttpError::Connect { .. }), "{e}");

        let listener = UnixListener::bind(&sock).expect("bind");
        let stream = connect(&sock, Duration::ZERO).expect("connect");
        let e =
            post_json(stream, &sock, "/", "{}", Duration::from_millis(100)).expect_err("silent");
        assert!(
            matches!(&e, HttpError::Exchange { reason, .. } if reason == "timed out reading the answer"),
            "{e}"
        );
        drop(listener);
    }
}
