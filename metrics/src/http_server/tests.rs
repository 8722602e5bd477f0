use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

const SHORT: Duration = Duration::from_millis(300);

/// A server under `limits` answering "ok" to everything, on a loopback port.
async fn start(limits: Limits) -> SocketAddr {
    let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, limits, |_req| async {
        text(StatusCode::OK, "ok\n", "text/plain")
    }));
    addr
}

/// Reads until the server closes the stream (EOF or reset), bounded; how long it took.
async fn closed_after(s: &mut TcpStream) -> Duration {
    let start = Instant::now();
    let mut buf = [0u8; 256];
    let read_to_end = async { while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {} };
    tokio::time::timeout(Duration::from_secs(10), read_to_end)
        .await
        .expect("the server never closed the connection");
    start.elapsed()
}

/// Whether the stream is still open `after` (nothing to read, no EOF).
async fn still_open(s: &mut TcpStream, after: Duration) -> bool {
    let mut buf = [0u8; 1];
    tokio::time::timeout(after, s.read(&mut buf)).await.is_err()
}

const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n";

async fn read_response(s: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    let limits = Limits {
        header_read_timeout: SHORT,
        max_connections: 8,
    };
    let addr = start(limits).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let took = closed_after(&mut s).await;
    assert!(
        took >= SHORT - Duration::from_millis(50),
        "closed too early: {took:?}"
    );
    assert!(took < SHORT * 10, "closed late: {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_head_and_an_idle_kept_alive_connection_are_closed_too() {
    let limits = Limits {
        header_read_timeout: SHORT,
        max_connections: 8,
    };
    let addr = start(limits).await;
    // a head trickled in, never finished
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /x HTTP/1.1\r\n").await.unwrap();
    // one request answered, then nothing on the kept-alive connection
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(GET).await.unwrap();
    assert!(read_response(&mut idle).await.starts_with("HTTP/1.1 200"));
    let (a, b) = tokio::join!(closed_after(&mut slow), closed_after(&mut idle));
    assert!(
        a < SHORT * 10 && b < SHORT * 10,
        "closed late: {a:?}, {b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_new_connection_closes_the_oldest_silent_one_and_is_answered() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(60),
        max_connections: 3,
    };
    let addr = start(limits).await;
    let settle = || tokio::time::sleep(Duration::from_millis(200));
    let mut silent_old = TcpStream::connect(addr).await.unwrap();
    settle().await;
    let mut talking = TcpStream::connect(addr).await.unwrap();
    talking.write_all(b"GET /x HTTP/1.1\r\n").await.unwrap();
    settle().await;
    let mut silent_new = TcpStream::connect(addr).await.unwrap();
    settle().await;
    // at the cap: the prober gets in, the oldest silent connection goes
    let mut prober = TcpStream::connect(addr).await.unwrap();
    prober.write_all(GET).await.unwrap();
    assert!(read_response(&mut prober).await.starts_with("HTTP/1.1 200"));
    assert!(closed_after(&mut silent_old).await < Duration::from_secs(2));
    assert!(
        still_open(&mut talking, SHORT).await,
        "a talking connection went first"
    );
    assert!(
        still_open(&mut silent_new, SHORT).await,
        "not the oldest silent one went"
    );
    // at the cap with the prober: the next one closes the other silent one
    let mut next = TcpStream::connect(addr).await.unwrap();
    assert!(closed_after(&mut silent_new).await < Duration::from_secs(2));
    assert!(still_open(&mut talking, SHORT).await);
    // when every open connection has sent something, the oldest goes
    next.write_all(b"GET").await.unwrap();
    settle().await;
    let _last = TcpStream::connect(addr).await.unwrap();
    assert!(closed_after(&mut talking).await < Duration::from_secs(2));
}
