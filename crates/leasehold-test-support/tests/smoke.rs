//! Smoke tests: every service that `scripts/services up` starts is reachable
//! through `leasehold_test_support::services`.
//!
//! Locally a missing service skips its test (with a `SKIPPED:` line); under
//! `CI=true` it fails the test.

use std::error::Error;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, NodeAction, Service};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;

type TestResult = Result<(), Box<dyn Error>>;

/// Upper bound for any single exchange with a healthy local server.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a PING to a hung server gets before we call it hung.
const HANG_TIMEOUT: Duration = Duration::from_millis(500);

/// Serializes the tests that touch `redlock5`, which one of them pauses.
static REDLOCK5: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sends a RESP `PING` and expects `+PONG`, within `limit`.
async fn redis_ping(addr: SocketAddr, limit: Duration) -> io::Result<()> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 64];
        while !reply.ends_with(b"\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{addr} closed the connection after {reply:?}"),
                ));
            }
            reply.extend_from_slice(&buf[..n]);
        }
        if reply == b"+PONG\r\n" {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{addr} answered PING with {:?}",
                String::from_utf8_lossy(&reply)
            )))
        }
    };
    timeout(limit, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("PING {addr} timed out")))?
}

/// `GET /health` over plain HTTP/1.1 on an etcd client port; returns the body.
async fn etcd_health(addr: SocketAddr) -> io::Result<String> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| {
            io::Error::other(format!("{addr}: malformed HTTP response {response:?}"))
        })?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(io::Error::other(format!(
                "{addr}: /health returned {head:?}"
            )));
        }
        Ok(body.to_owned())
    };
    timeout(OP_TIMEOUT, exchange).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("GET {addr}/health timed out"),
        )
    })?
}

async fn assert_etcd_healthy(addr: SocketAddr) -> TestResult {
    let body = etcd_health(addr).await?;
    assert!(
        body.contains(r#""health":"true""#),
        "etcd at {addr} is not healthy: {body}"
    );
    Ok(())
}

/// Connects with `config` (URL or key=value string), runs `SELECT 1` and
/// returns `current_user`.
async fn postgres_select(config: &str) -> Result<String, Box<dyn Error>> {
    let (client, connection) = timeout(
        OP_TIMEOUT,
        tokio_postgres::connect(config, tokio_postgres::NoTls),
    )
    .await??;
    let driver = tokio::spawn(connection);
    let one: i32 = timeout(OP_TIMEOUT, client.query_one("SELECT 1", &[]))
        .await??
        .try_get(0)?;
    assert_eq!(one, 1);
    let user: String = timeout(OP_TIMEOUT, client.query_one("SELECT current_user", &[]))
        .await??
        .try_get(0)?;
    drop(client);
    let _ = timeout(OP_TIMEOUT, driver).await;
    Ok(user)
}

#[tokio::test]
async fn redis_answers_ping() -> TestResult {
    let redis = require_service!(Service::Redis, Ok(()));
    assert!(redis.url().starts_with("redis://"), "{}", redis.url());
    let addr = redis.addr().ok_or("redis has no TCP address")?;
    redis_ping(addr, OP_TIMEOUT).await?;
    Ok(())
}

#[tokio::test]
async fn every_redlock_node_answers_ping() -> TestResult {
    let nodes = require_service!(Service::Redlock, Ok(()));
    let _serial = REDLOCK5.lock().await;
    assert_eq!(nodes.urls().len(), 5, "expected 5 Redlock nodes: {nodes:?}");
    assert_eq!(nodes.addrs().len(), 5);
    let mut distinct = nodes.addrs().to_vec();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "Redlock nodes must be distinct servers");
    for &addr in nodes.addrs() {
        redis_ping(addr, OP_TIMEOUT).await?;
    }
    Ok(())
}

#[tokio::test]
async fn every_redis_cluster_node_answers_ping() -> TestResult {
    let nodes = require_service!(Service::RedisCluster, Ok(()));
    assert_eq!(
        nodes.addrs().len(),
        3,
        "expected 3 cluster masters: {nodes:?}"
    );
    for &addr in nodes.addrs() {
        redis_ping(addr, OP_TIMEOUT).await?;
    }
    Ok(())
}

#[tokio::test]
async fn postgres_over_tcp() -> TestResult {
    let pg = require_service!(Service::Postgres, Ok(()));
    let expected_user = pg
        .url()
        .parse::<tokio_postgres::Config>()?
        .get_user()
        .ok_or("postgres URL has no user")?
        .to_owned();
    let user = postgres_select(pg.url()).await?;
    assert_eq!(user, expected_user);
    Ok(())
}

#[tokio::test]
async fn postgres_over_unix_socket() -> TestResult {
    let pg = require_service!(Service::PostgresSocket, Ok(()));
    assert!(
        pg.url().starts_with("host=/"),
        "socket conninfo should name the socket directory: {}",
        pg.url()
    );
    let config: tokio_postgres::Config = pg.url().parse()?;
    assert!(
        config
            .get_hosts()
            .iter()
            .any(|h| matches!(h, tokio_postgres::config::Host::Unix(_))),
        "conninfo does not select a unix socket: {}",
        pg.url()
    );
    let user = postgres_select(pg.url()).await?;
    assert_eq!(Some(user.as_str()), config.get_user());
    Ok(())
}

#[tokio::test]
async fn etcd_single_member_is_healthy() -> TestResult {
    let etcd = require_service!(Service::Etcd, Ok(()));
    assert!(!etcd.addrs().is_empty());
    for &addr in etcd.addrs() {
        assert_etcd_healthy(addr).await?;
    }
    Ok(())
}

#[tokio::test]
async fn every_etcd_cluster_member_is_healthy() -> TestResult {
    let cluster = require_service!(Service::EtcdCluster, Ok(()));
    assert_eq!(
        cluster.addrs().len(),
        3,
        "expected 3 cluster members: {cluster:?}"
    );
    for &addr in cluster.addrs() {
        assert_etcd_healthy(addr).await?;
    }
    Ok(())
}

#[tokio::test]
async fn proxy_in_front_of_redis_blackholes_ping() -> TestResult {
    let redis = require_service!(Service::Redis, Ok(()));
    let proxy = FaultProxy::start(redis.addr().ok_or("redis has no TCP address")?).await?;
    redis_ping(proxy.addr(), OP_TIMEOUT).await?;

    proxy.blackhole();
    let err = redis_ping(proxy.addr(), HANG_TIMEOUT)
        .await
        .err()
        .ok_or("PING through a black-holed proxy succeeded")?;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");

    proxy.pass();
    redis_ping(proxy.addr(), OP_TIMEOUT).await?;
    assert_eq!(proxy.accepted(), 3);
    Ok(())
}

#[tokio::test]
async fn node_ctl_pauses_and_resumes_redlock5() -> TestResult {
    let nodes = require_service!(Service::Redlock, Ok(()));
    let _serial = REDLOCK5.lock().await;
    let addr = *nodes.addrs().get(4).ok_or("no fifth Redlock node")?;
    redis_ping(addr, OP_TIMEOUT).await?;

    timeout(
        OP_TIMEOUT,
        services::node_ctl("redlock5", NodeAction::Pause),
    )
    .await??;
    let while_paused = redis_ping(addr, HANG_TIMEOUT).await;
    // Resume before asserting anything, so a failure cannot leave it paused.
    timeout(
        OP_TIMEOUT,
        services::node_ctl("redlock5", NodeAction::Resume),
    )
    .await??;

    let err = while_paused
        .err()
        .ok_or("paused redlock5 still answered PING")?;
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    redis_ping(addr, OP_TIMEOUT).await?;
    Ok(())
}

#[tokio::test]
async fn node_ctl_rejects_unknown_nodes() {
    let err = services::node_ctl("redlock6", NodeAction::Pause).await;
    assert!(
        matches!(&err, Err(e) if e.kind() == io::ErrorKind::InvalidInput),
        "{err:?}"
    );
}

/// The pid a Redis node reports in `INFO server`.
async fn redis_pid(addr: SocketAddr) -> Result<u32, Box<dyn Error>> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            .await?;
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let text = String::from_utf8_lossy(&reply);
            if let Some(rest) = text.split("process_id:").nth(1)
                && let Some((pid, _)) = rest.split_once("\r\n")
            {
                return Ok::<_, Box<dyn Error>>(pid.trim().parse()?);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err("INFO reply ended without process_id".into());
            }
            reply.extend_from_slice(&buf[..n]);
        }
    };
    timeout(OP_TIMEOUT, exchange).await?
}

/// The CPUs a process may run on, as /proc says (`Cpus_allowed_list`).
fn cpus_allowed(pid: u32) -> Result<String, Box<dyn Error>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .ok_or("no Cpus_allowed_list in /proc/PID/status")?;
    Ok(line.trim().to_owned())
}

#[tokio::test]
async fn pin_node_sets_and_restores_the_cpu_affinity() -> TestResult {
    let nodes = require_service!(Service::Redlock, Ok(()));
    let _serial = REDLOCK5.lock().await;
    let addr = *nodes.addrs().get(4).ok_or("no fifth Redlock node")?;
    let pid = redis_pid(addr).await?;
    let all = cpus_allowed(pid)?;

    timeout(OP_TIMEOUT, services::pin_node("redlock5", "0")).await??;
    let pinned = cpus_allowed(pid);
    // Restore before asserting anything.
    timeout(OP_TIMEOUT, services::pin_node("redlock5", "all")).await??;
    assert_eq!(pinned?, "0");
    // The services run on every CPU unless a benchmark pinned them.
    assert_eq!(
        cpus_allowed(pid)?,
        all,
        "`all` did not restore the affinity"
    );
    redis_ping(addr, OP_TIMEOUT).await?;

    let bad = services::pin_node("redlock5", "zero").await;
    assert!(
        matches!(&bad, Err(e) if e.to_string().contains("bad CPU list")),
        "{bad:?}"
    );
    Ok(())
}

/// Another port base over the same state dir cannot work (etcd members keep their peer URLs);
/// the script refuses it before touching anything, and says how to get out.
#[tokio::test]
async fn services_refuse_another_port_base_over_the_same_state() -> TestResult {
    let redis = require_service!(Service::Redis, Ok(()));
    let base = redis.addr().ok_or("no Redis address")?.port();
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(services::services_script())
        .args(["start", "redis"])
        .env("LEASEHOLD_PORT_BASE", (base + 1000).to_string())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(dir) = services::var(services::SERVICES_DIR_VAR) {
        cmd.env(services::SERVICES_DIR_VAR, dir);
    }
    let out = timeout(OP_TIMEOUT, cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted another base: {stderr}");
    assert!(
        stderr.contains(&format!("made with LEASEHOLD_PORT_BASE={base}"))
            && stderr.contains("clean"),
        "{stderr}"
    );
    redis_ping(redis.addr().ok_or("no Redis address")?, OP_TIMEOUT).await?;
    Ok(())
}

/// The throwaway CA of the harness's TLS servers: configured, and a PEM certificate.
fn assert_tls_ca() -> TestResult {
    let ca =
        services::tls_ca().ok_or(format!("{} is not set or not a file", services::TLS_CA_VAR))?;
    let pem = std::fs::read_to_string(&ca)?;
    assert!(
        pem.starts_with("-----BEGIN CERTIFICATE-----"),
        "{} is not a PEM certificate",
        ca.display()
    );
    Ok(())
}

#[tokio::test]
async fn pgbouncer_runs_select_in_transaction_pooling() -> TestResult {
    let bouncer = require_service!(Service::PgBouncer, Ok(()));
    assert!(
        bouncer.url().starts_with("postgres://"),
        "{}",
        bouncer.url()
    );
    // The simple query protocol: named prepared statements do not survive
    // transaction pooling (pgbouncer < 1.21 does not track them).
    let (client, connection) = timeout(
        OP_TIMEOUT,
        tokio_postgres::connect(bouncer.url(), tokio_postgres::NoTls),
    )
    .await??;
    let driver = tokio::spawn(connection);
    let rows = timeout(OP_TIMEOUT, client.simple_query("SELECT 1")).await??;
    let one = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    assert_eq!(one.as_deref(), Some("1"));
    drop(client);
    let _ = timeout(OP_TIMEOUT, driver).await;

    // The admin console confirms the pooling mode.
    let mut admin: tokio_postgres::Config = bouncer.url().parse()?;
    admin.dbname("pgbouncer");
    let (client, connection) = timeout(OP_TIMEOUT, admin.connect(tokio_postgres::NoTls)).await??;
    let driver = tokio::spawn(connection);
    let rows = timeout(OP_TIMEOUT, client.simple_query("SHOW CONFIG")).await??;
    let pool_mode = rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) if row.get(0) == Some("pool_mode") => {
            row.get(1).map(str::to_owned)
        }
        _ => None,
    });
    assert_eq!(pool_mode.as_deref(), Some("transaction"));
    drop(client);
    let _ = timeout(OP_TIMEOUT, driver).await;
    Ok(())
}

#[tokio::test]
async fn redis_tls_listens_and_refuses_plaintext() -> TestResult {
    let redis = require_service!(Service::RedisTls, Ok(()));
    assert!(redis.url().starts_with("rediss://"), "{}", redis.url());
    assert_tls_ca()?;
    let addr = redis.addr().ok_or("redis-tls has no TCP address")?;
    timeout(OP_TIMEOUT, TcpStream::connect(addr)).await??;
    // A plaintext PING must not get a PONG from a TLS-only port.
    let plain = redis_ping(addr, OP_TIMEOUT).await;
    assert!(plain.is_err(), "plaintext PING to {addr} got PONG");
    Ok(())
}

#[tokio::test]
async fn etcd_secure_listens_with_tls_and_has_credentials() -> TestResult {
    let etcd = require_service!(Service::EtcdSecure, Ok(()));
    assert_tls_ca()?;
    assert!(services::var(services::ETCD_USER_VAR).is_some());
    assert!(services::var(services::ETCD_PASSWORD_VAR).is_some());
    let addr = etcd.addr().ok_or("etcd-secure has no TCP address")?;
    timeout(OP_TIMEOUT, TcpStream::connect(addr)).await??;
    // Plain HTTP to the https client port is refused (etcd answers 400).
    let plain = etcd_health(addr).await;
    assert!(plain.is_err(), "plain HTTP /health on {addr} succeeded");
    Ok(())
}
