//! Tests of `FaultProxy` against an in-process echo server.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use leasehold_test_support::proxy::{FaultProxy, Mode};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::timeout;

/// How long a read may take before we call it hung.
const SHORT: Duration = Duration::from_millis(300);
/// Generous bound for things that should happen quickly.
const LONG: Duration = Duration::from_secs(2);

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// An echo server on 127.0.0.1:0; aborted on drop.
struct Echo {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo_server() -> io::Result<Echo> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            conns.spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Ok(Echo { addr, task })
}

/// Writes `msg` and reads back exactly as many bytes, within `limit`.
async fn roundtrip(stream: &mut TcpStream, msg: &[u8], limit: Duration) -> io::Result<Vec<u8>> {
    stream.write_all(msg).await?;
    let mut buf = vec![0u8; msg.len()];
    timeout(limit, stream.read_exact(&mut buf))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "echo timed out"))??;
    Ok(buf)
}

async fn setup() -> io::Result<(Echo, FaultProxy)> {
    let echo = echo_server().await?;
    let proxy = FaultProxy::start(echo.addr).await?;
    Ok((echo, proxy))
}

#[tokio::test]
async fn pass_through_forwards_both_ways() -> TestResult {
    let (echo, proxy) = setup().await?;
    assert_eq!(proxy.upstream(), echo.addr);
    assert_ne!(proxy.addr(), echo.addr);
    assert_eq!(proxy.mode(), Mode::Pass);

    let mut a = TcpStream::connect(proxy.addr()).await?;
    let mut b = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(roundtrip(&mut a, b"hello", LONG).await?, b"hello");
    assert_eq!(roundtrip(&mut b, b"world", LONG).await?, b"world");
    assert_eq!(proxy.accepted(), 2);
    assert_eq!(proxy.active(), 2);

    // A payload much larger than one chunk arrives intact and in order.
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut read, mut write) = a.into_split();
    let writer = tokio::spawn(async move { write.write_all(&big).await.map(|()| big) });
    let mut got = vec![0u8; 1_000_000];
    timeout(LONG, read.read_exact(&mut got)).await??;
    let big = writer.await??;
    assert!(got == big, "payload corrupted");

    // Dropping the write half sent a FIN; it travels through the proxy to the
    // echo server, which closes, and the proxy forwards that close back.
    let read_after = timeout(LONG, read.read(&mut got)).await??;
    assert_eq!(read_after, 0, "half-close not forwarded");
    wait_until(|| proxy.active() == 1).await?;
    assert_eq!(proxy.accepted(), 2);
    Ok(())
}

#[tokio::test]
async fn latency_delays_each_direction() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    // Warm up so connection setup is not measured.
    roundtrip(&mut conn, b"warm", LONG).await?;

    let delay = Duration::from_millis(150);
    proxy.latency(delay);
    assert_eq!(proxy.mode(), Mode::Latency(delay));
    let started = Instant::now();
    assert_eq!(roundtrip(&mut conn, b"slow", LONG).await?, b"slow");
    let rtt = started.elapsed();
    // Delayed on the way there and on the way back.
    assert!(rtt >= 2 * delay, "round trip {rtt:?} < 2 x {delay:?}");

    // Pipelined chunks are delayed together, not one after another.
    let started = Instant::now();
    for i in 0..5u8 {
        conn.write_all(&[i]).await?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut got = [0u8; 5];
    timeout(LONG, conn.read_exact(&mut got)).await??;
    let elapsed = started.elapsed();
    assert_eq!(got, [0, 1, 2, 3, 4], "order not preserved");
    assert!(elapsed >= 2 * delay, "{elapsed:?}");
    assert!(
        elapsed < 5 * 2 * delay,
        "chunks delayed serially: {elapsed:?}"
    );

    proxy.pass();
    let started = Instant::now();
    roundtrip(&mut conn, b"fast", LONG).await?;
    assert!(started.elapsed() < delay, "still slow after pass()");
    Ok(())
}

#[tokio::test]
async fn blackhole_hangs_then_pass_recovers_for_new_connections() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let mut existing = TcpStream::connect(proxy.addr()).await?;
    roundtrip(&mut existing, b"before", LONG).await?;

    proxy.blackhole();
    // Existing connection: written data vanishes, the read times out.
    let err = roundtrip(&mut existing, b"lost", SHORT)
        .await
        .err()
        .ok_or("read through a black hole succeeded")?;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);

    // New connection: accepted (connect succeeds) but nothing answers, and it
    // is not closed either.
    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    let err = roundtrip(&mut fresh, b"lost too", SHORT)
        .await
        .err()
        .ok_or("read through a black hole succeeded")?;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert_eq!(proxy.accepted(), 2);

    proxy.pass();
    let mut healed = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(roundtrip(&mut healed, b"after", LONG).await?, b"after");
    Ok(())
}

#[tokio::test]
async fn cut_closes_existing_connections_and_refuses_new_ones() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    roundtrip(&mut conn, b"ping", LONG).await?;
    assert_eq!(proxy.active(), 1);

    proxy.cut();
    assert_eq!(proxy.mode(), Mode::Refuse);
    let mut buf = [0u8; 16];
    let read = timeout(LONG, conn.read(&mut buf)).await?;
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "cut connection still readable: {read:?}"
    );

    // New connections are closed at once.
    let mut refused = TcpStream::connect(proxy.addr()).await?;
    let read = timeout(LONG, refused.read(&mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "not refused: {read:?}");
    assert_eq!(proxy.refused(), 1);
    wait_until(|| proxy.active() == 0).await?;

    proxy.pass();
    let mut again = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(roundtrip(&mut again, b"back", LONG).await?, b"back");
    Ok(())
}

#[tokio::test]
async fn cut_connections_keeps_accepting() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    roundtrip(&mut conn, b"ping", LONG).await?;

    proxy.cut_connections();
    assert_eq!(proxy.mode(), Mode::Pass);
    let mut buf = [0u8; 16];
    let read = timeout(LONG, conn.read(&mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "still open: {read:?}");

    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(roundtrip(&mut fresh, b"new", LONG).await?, b"new");
    Ok(())
}

#[tokio::test]
async fn refuse_keeps_established_connections() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    roundtrip(&mut conn, b"ping", LONG).await?;

    proxy.refuse();
    let mut refused = TcpStream::connect(proxy.addr()).await?;
    let mut buf = [0u8; 16];
    let read = timeout(LONG, refused.read(&mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "not refused: {read:?}");
    assert_eq!(roundtrip(&mut conn, b"still", LONG).await?, b"still");
    Ok(())
}

#[tokio::test]
async fn drop_stops_accepting_and_closes_connections() -> TestResult {
    let (_echo, proxy) = setup().await?;
    let addr = proxy.addr();
    let mut conn = TcpStream::connect(addr).await?;
    roundtrip(&mut conn, b"ping", LONG).await?;

    drop(proxy);
    let mut buf = [0u8; 16];
    let read = timeout(LONG, conn.read(&mut buf)).await?;
    assert!(matches!(read, Ok(0) | Err(_)), "still open: {read:?}");

    // Once the aborted accept task is gone, nothing listens on the port.
    let deadline = Instant::now() + LONG;
    loop {
        match TcpStream::connect(addr).await {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
                break;
            }
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(_) => return Err("proxy still accepting after drop".into()),
        }
    }
    Ok(())
}

async fn wait_until(mut cond: impl FnMut() -> bool) -> TestResult {
    let deadline = Instant::now() + LONG;
    while !cond() {
        if Instant::now() > deadline {
            return Err("condition not reached in time".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
