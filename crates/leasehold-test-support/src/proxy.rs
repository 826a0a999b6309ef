//! A fault-injecting TCP proxy for partition and latency tests.
//!
//! [`FaultProxy`] listens on `127.0.0.1:<random port>` and forwards every
//! accepted connection to one upstream address. Point the client under test
//! at [`FaultProxy::addr`] instead of the server, then switch the proxy's
//! [`Mode`] at runtime to simulate network trouble. A mode change affects
//! existing connections as well as new ones.
//!
//! ```no_run
//! # async fn demo(redis: std::net::SocketAddr) -> std::io::Result<()> {
//! use std::time::Duration;
//! use leasehold_test_support::proxy::FaultProxy;
//!
//! let proxy = FaultProxy::start(redis).await?;
//! let url = format!("redis://{}", proxy.addr());
//! // ... connect a client to `url` ...
//! proxy.latency(Duration::from_millis(200)); // slow network
//! proxy.blackhole(); // partition: the client hangs until its own timeout
//! proxy.pass(); // heal
//! proxy.cut(); // kill every connection and refuse new ones
//! # let _ = url;
//! # Ok(()) }
//! ```
//!
//! Dropping the proxy closes the listener and every proxied connection; no
//! task outlives it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Size of the buffer each direction reads into.
const CHUNK: usize = 16 * 1024;
/// Chunks a direction may hold in its delay queue before it stops reading.
const QUEUE: usize = 256;

/// What the proxy does with traffic; see the [`FaultProxy`] methods that set
/// each mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forward bytes unchanged in both directions.
    #[default]
    Pass,
    /// Forward bytes, each chunk delayed by this much (per direction).
    Latency(Duration),
    /// Accept connections and read from them, but forward nothing.
    Blackhole,
    /// Close new connections as soon as they are accepted; established
    /// connections keep forwarding as in [`Mode::Pass`].
    Refuse,
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    refused: AtomicU64,
    active: AtomicUsize,
}

/// A TCP proxy in front of one upstream server whose behaviour tests can
/// change at runtime. See the [module docs](self).
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    cut: watch::Sender<u64>,
    counters: Arc<Counters>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] on `127.0.0.1:0` forwarding to
    /// `upstream`. Must be called within a tokio runtime.
    ///
    /// The upstream is connected to once per accepted connection (except in
    /// [`Mode::Blackhole`], see [`FaultProxy::blackhole`]); if that fails, the
    /// client's connection is closed.
    pub async fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let (cut, cut_rx) = watch::channel(0u64);
        let counters = Arc::new(Counters::default());
        let accept_task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode_rx,
            cut_rx,
            Arc::clone(&counters),
        ));
        Ok(FaultProxy {
            addr,
            upstream,
            mode,
            cut,
            counters,
            accept_task,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// Sets the mode; it applies to existing and new connections at once.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Pass-through: forward everything unchanged (the initial mode).
    ///
    /// Connections that were accepted during [`blackhole`](Self::blackhole)
    /// stay black holes; clients should reconnect.
    pub fn pass(&self) {
        self.set_mode(Mode::Pass);
    }

    /// Delays each chunk of data, in both directions, by `delay`: a chunk read
    /// at time `t` is written at `t + delay` or later. Order within a
    /// direction is preserved, and reading goes on while earlier chunks wait,
    /// so throughput is not throttled beyond the added delay. A request /
    /// response round trip therefore takes at least `2 * delay` longer.
    pub fn latency(&self, delay: Duration) {
        self.set_mode(Mode::Latency(delay));
    }

    /// Partition: keep accepting connections and reading from them, but
    /// forward nothing (data is silently dropped, including data already
    /// queued by [`latency`](Self::latency)), and keep connections open, so
    /// clients hang until their own timeouts.
    ///
    /// Connections accepted in this mode are never connected upstream (as if
    /// the server were unreachable) and stay black holes after the mode
    /// changes; established connections resume forwarding when the mode
    /// changes back, but bytes dropped meanwhile are lost, so most protocols
    /// are out of step on them and clients should reconnect.
    pub fn blackhole(&self) {
        self.set_mode(Mode::Blackhole);
    }

    /// Refuse new connections (each is accepted and closed at once) while
    /// established connections keep working.
    pub fn refuse(&self) {
        self.set_mode(Mode::Refuse);
    }

    /// Closes every current connection, both the client and the upstream side,
    /// now. New connections are still accepted in the current mode.
    pub fn cut_connections(&self) {
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// Hard partition: [`refuse`](Self::refuse) new connections and
    /// [`cut_connections`](Self::cut_connections) the current ones. Undo
    /// with [`pass`](Self::pass).
    pub fn cut(&self) {
        self.refuse();
        self.cut_connections();
    }

    /// Connections accepted so far (including refused ones).
    pub fn accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once because the proxy was in [`Mode::Refuse`].
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn active(&self) -> usize {
        self.counters.active.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The accept task owns the listener and a `JoinSet` of every
        // connection task: aborting it drops both, which aborts the
        // connection tasks and closes their sockets.
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    cut: watch::Receiver<u64>,
    counters: Arc<Counters>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else {
                    // E.g. too many open files: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                counters.accepted.fetch_add(1, Ordering::SeqCst);
                let current = *mode.borrow();
                if current == Mode::Refuse {
                    counters.refused.fetch_add(1, Ordering::SeqCst);
                    drop(client);
                    continue;
                }
                let mut cut = cut.clone();
                cut.borrow_and_update();
                let guard = ActiveGuard::new(Arc::clone(&counters));
                let mode = mode.clone();
                connections.spawn(async move {
                    let _guard = guard;
                    tokio::select! {
                        _ = cut.changed() => {}
                        _ = connection(client, upstream, current, mode) => {}
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as active for as long as it lives (also when its task
/// is aborted).
struct ActiveGuard(Arc<Counters>);

impl ActiveGuard {
    fn new(counters: Arc<Counters>) -> ActiveGuard {
        counters.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(counters)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs one proxied connection until both directions are done or one fails.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    at_accept: Mode,
    mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    if at_accept == Mode::Blackhole {
        return drain(client).await;
    }
    let server = TcpStream::connect(upstream).await?;
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::try_join!(
        pump(client_read, server_write, mode.clone()),
        pump(server_read, client_write, mode),
    )?;
    Ok(())
}

/// A black-hole connection: read and discard until the client closes its
/// side, then close.
async fn drain(mut client: TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    while client.read(&mut buf).await? != 0 {}
    Ok(())
}

enum Chunk {
    Data(Instant, Vec<u8>),
    Eof(Instant),
}

/// Forwards one direction: a reader stamps each chunk with the time it may be
/// written (now + current latency), a writer writes chunks in order once
/// their time has come, dropping them in [`Mode::Blackhole`].
async fn pump(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Chunk>(QUEUE);
    let reader_mode = mode.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = src.read(&mut buf).await?;
            let current = *reader_mode.borrow();
            let due = match current {
                Mode::Latency(delay) => Instant::now() + delay,
                Mode::Pass | Mode::Refuse | Mode::Blackhole => Instant::now(),
            };
            let chunk = if n == 0 {
                Chunk::Eof(due)
            } else if current == Mode::Blackhole {
                continue;
            } else {
                Chunk::Data(due, buf[..n].to_vec())
            };
            let eof = matches!(chunk, Chunk::Eof(_));
            if tx.send(chunk).await.is_err() || eof {
                return Ok::<(), io::Error>(());
            }
        }
    };
    let writer = async move {
        while let Some(chunk) = rx.recv().await {
            match chunk {
                Chunk::Data(due, data) => {
                    tokio::time::sleep_until(due).await;
                    if *mode.borrow() != Mode::Blackhole {
                        dst.write_all(&data).await?;
                    }
                }
                Chunk::Eof(due) => {
                    tokio::time::sleep_until(due).await;
                    // Forward nothing while black-holed, not even the FIN;
                    // pass it on once the partition heals.
                    if mode.wait_for(|m| *m != Mode::Blackhole).await.is_err() {
                        return Ok(());
                    }
                    dst.shutdown().await?;
                    return Ok(());
                }
            }
        }
        Ok::<(), io::Error>(())
    };
    tokio::try_join!(reader, writer)?;
    Ok(())
}
