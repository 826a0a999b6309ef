//! How tests find the real servers that `scripts/services up` starts.
//!
//! `scripts/services up` starts Redis, five Redlock nodes, a Redis Cluster, a
//! TLS-only Redis, PostgreSQL (TLS and plain on one port) with pgbouncer in
//! front of it, and etcd (single member, a three-member cluster, and a member
//! with TLS and auth) on loopback ports and writes their addresses to an env
//! file of `KEY=VALUE` lines:
//!
//! * `$LEASEHOLD_SERVICES_DIR/env` if that variable is set, else
//! * `<workspace root>/target/services/env`.
//!
//! Variables of the same names in the process environment override the
//! file's values, so a developer can point a test at any server by hand.
//!
//! The TLS servers use a throwaway CA whose certificate is at [`tls_ca`]
//! (`LEASEHOLD_TEST_TLS_CA`); their certificate names `127.0.0.1` (IP SAN)
//! and `localhost`. The etcd member with auth takes the user and password in
//! `LEASEHOLD_TEST_ETCD_USER` / `LEASEHOLD_TEST_ETCD_PASSWORD` (see [`var`]).
//!
//! # The policy: [`require`] and [`require_service!`](crate::require_service)
//!
//! A test asks for the service it needs with [`require_service!`](crate::require_service):
//!
//! ```no_run
//! use leasehold_test_support::require_service;
//! use leasehold_test_support::services::Service;
//!
//! #[tokio::test]
//! async fn redis_roundtrip() {
//!     let redis = require_service!(Service::Redis);
//!     let url: &str = redis.url(); // "redis://127.0.0.1:17400"
//!     # let _ = url;
//!     // ... talk to Redis ...
//! }
//! ```
//!
//! * The service is **available** when its variable is set (file or process
//!   environment) and every address in it accepts a TCP (or, for the
//!   PostgreSQL socket, unix) connection within [`PROBE_TIMEOUT`]. A stale env
//!   file left behind by `scripts/services down` therefore counts as missing.
//! * When it is missing and `CI` is `true` or `1`, the test **panics** with a
//!   message saying to run `scripts/services up`: CI never silently skips.
//! * When it is missing locally, a line
//!   `SKIPPED: <service> not available (run scripts/services up)` is written
//!   straight to the process's stderr (past libtest's output capture, so it
//!   shows up in a plain `cargo test`) and the macro `return`s from the test.
//!
//! Tests returning a `Result` pass the value to return as a second argument:
//! `require_service!(Service::Postgres, Ok(()))`.
//!
//! # Fault injection
//!
//! [`node_ctl`] runs `scripts/services ACTION NODE` (e.g. pause `redlock5`) to
//! stop, start, restart, pause or resume one server. For faults between the
//! client and a server see [`crate::proxy::FaultProxy`].

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// How long a service's port gets to accept a connection before the service
/// counts as missing.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Name of the variable holding the state directory of `scripts/services`.
pub const SERVICES_DIR_VAR: &str = "LEASEHOLD_SERVICES_DIR";

/// Name of the variable holding the absolute path of `scripts/services`.
pub const SERVICES_SCRIPT_VAR: &str = "LEASEHOLD_SERVICES_SCRIPT";

/// Name of the variable holding the path of the throwaway CA certificate
/// (PEM) that signed the certificate of every TLS server of the harness.
pub const TLS_CA_VAR: &str = "LEASEHOLD_TEST_TLS_CA";

/// Name of the variable holding the user for [`Service::EtcdSecure`].
pub const ETCD_USER_VAR: &str = "LEASEHOLD_TEST_ETCD_USER";

/// Name of the variable holding the password for [`Service::EtcdSecure`].
pub const ETCD_PASSWORD_VAR: &str = "LEASEHOLD_TEST_ETCD_PASSWORD";

/// One of the services that `scripts/services up` provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// A single Redis server (`LEASEHOLD_TEST_REDIS_URL`, one `redis://` URL).
    Redis,
    /// Five independent Redis servers for Redlock
    /// (`LEASEHOLD_TEST_REDLOCK_URLS`, comma-separated `redis://` URLs).
    Redlock,
    /// A three-master Redis Cluster (`LEASEHOLD_TEST_REDIS_CLUSTER_URLS`, comma-separated
    /// `redis://` URLs of its nodes).
    RedisCluster,
    /// PostgreSQL over TCP (`LEASEHOLD_TEST_POSTGRES_URL`, one `postgres://` URL).
    Postgres,
    /// PostgreSQL over its unix socket (`LEASEHOLD_TEST_POSTGRES_SOCKET`, the
    /// socket directory). [`Endpoints::url`] gives a libpq key=value
    /// connection string (`host=<dir> port=… user=… password=… dbname=…`)
    /// that `tokio_postgres::connect` accepts; user, password, database and
    /// port are taken from `LEASEHOLD_TEST_POSTGRES_URL` when it is set.
    PostgresSocket,
    /// A single etcd member (`LEASEHOLD_TEST_ETCD_ENDPOINTS`, comma-separated
    /// `host:port` client endpoints).
    Etcd,
    /// A three-member etcd cluster (`LEASEHOLD_TEST_ETCD_CLUSTER_ENDPOINTS`,
    /// comma-separated `host:port` client endpoints).
    EtcdCluster,
    /// pgbouncer in `pool_mode = transaction` in front of the PostgreSQL
    /// database (`LEASEHOLD_TEST_PGBOUNCER_URL`, one `postgres://` URL; same
    /// user and password, SCRAM authentication, no TLS).
    PgBouncer,
    /// A Redis server that speaks TLS only, without client certificates or
    /// auth (`LEASEHOLD_TEST_REDIS_TLS_URL`, one `rediss://` URL); its
    /// certificate chains to [`tls_ca`].
    RedisTls,
    /// A single etcd member serving clients over TLS (https, certificate
    /// chains to [`tls_ca`]) with auth enabled
    /// (`LEASEHOLD_TEST_ETCD_SECURE_ENDPOINTS`, `host:port`; credentials in
    /// [`ETCD_USER_VAR`] / [`ETCD_PASSWORD_VAR`]).
    EtcdSecure,
}

impl Service {
    /// Every service, in a fixed order.
    pub const ALL: [Service; 10] = [
        Service::Redis,
        Service::Redlock,
        Service::RedisCluster,
        Service::Postgres,
        Service::PostgresSocket,
        Service::Etcd,
        Service::EtcdCluster,
        Service::PgBouncer,
        Service::RedisTls,
        Service::EtcdSecure,
    ];

    /// The variable (in the env file or the process environment) that holds
    /// this service's address(es).
    pub fn env_key(self) -> &'static str {
        match self {
            Service::Redis => "LEASEHOLD_TEST_REDIS_URL",
            Service::Redlock => "LEASEHOLD_TEST_REDLOCK_URLS",
            Service::RedisCluster => "LEASEHOLD_TEST_REDIS_CLUSTER_URLS",
            Service::Postgres => "LEASEHOLD_TEST_POSTGRES_URL",
            Service::PostgresSocket => "LEASEHOLD_TEST_POSTGRES_SOCKET",
            Service::Etcd => "LEASEHOLD_TEST_ETCD_ENDPOINTS",
            Service::EtcdCluster => "LEASEHOLD_TEST_ETCD_CLUSTER_ENDPOINTS",
            Service::PgBouncer => "LEASEHOLD_TEST_PGBOUNCER_URL",
            Service::RedisTls => "LEASEHOLD_TEST_REDIS_TLS_URL",
            Service::EtcdSecure => "LEASEHOLD_TEST_ETCD_SECURE_ENDPOINTS",
        }
    }

    /// A short human-readable name, as used in skip and failure messages.
    pub fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::Redlock => "redlock",
            Service::RedisCluster => "redis-cluster",
            Service::Postgres => "postgres",
            Service::PostgresSocket => "postgres-socket",
            Service::Etcd => "etcd",
            Service::EtcdCluster => "etcd-cluster",
            Service::PgBouncer => "pgbouncer",
            Service::RedisTls => "redis-tls",
            Service::EtcdSecure => "etcd-secure",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Service::Redis | Service::Redlock | Service::RedisCluster | Service::RedisTls => 6379,
            Service::Postgres | Service::PostgresSocket => 5432,
            Service::PgBouncer => 6432,
            Service::Etcd | Service::EtcdCluster | Service::EtcdSecure => 2379,
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The addresses of an available service, as returned by [`require`] and
/// [`lookup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    service: Service,
    raw: String,
    urls: Vec<String>,
    addrs: Vec<SocketAddr>,
}

impl Endpoints {
    /// The service these endpoints belong to.
    pub fn service(&self) -> Service {
        self.service
    }

    /// The variable's value exactly as configured (for
    /// [`Service::PostgresSocket`]: the socket directory).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The first (for single-server services: the only) URL or endpoint.
    pub fn url(&self) -> &str {
        // `lookup` never builds an `Endpoints` without at least one URL.
        self.urls.first().map_or("", String::as_str)
    }

    /// Every URL or endpoint, in configured order (five for
    /// [`Service::Redlock`], three for [`Service::EtcdCluster`]).
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The TCP address of the first endpoint, e.g. to put a
    /// [`FaultProxy`](crate::proxy::FaultProxy) in front of it. `None` only
    /// for [`Service::PostgresSocket`].
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addrs.first().copied()
    }

    /// The TCP addresses of every endpoint, in configured order (empty for
    /// [`Service::PostgresSocket`]).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

/// Why a service counts as missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The service that is missing.
    pub service: Service,
    /// What went wrong, for humans.
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not available: {}", self.service, self.reason)
    }
}

impl std::error::Error for Unavailable {}

/// The root of the cargo workspace (two levels above this crate's manifest).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// The env file written by `scripts/services up`:
/// `$LEASEHOLD_SERVICES_DIR/env` if set, else `<root>/target/services/env`.
pub fn env_file() -> PathBuf {
    match non_empty_var(SERVICES_DIR_VAR) {
        Some(dir) => PathBuf::from(dir).join("env"),
        None => workspace_root().join("target").join("services").join("env"),
    }
}

/// The merged service configuration: the env file's `KEY=VALUE` lines, with
/// process environment variables of the same names taking precedence. Read
/// afresh on each call (the file may appear while tests run).
pub fn config() -> BTreeMap<String, String> {
    let mut map = std::fs::read_to_string(env_file())
        .map(|text| parse_env(&text))
        .unwrap_or_default();
    let keys = Service::ALL.iter().map(|s| s.env_key()).chain([
        SERVICES_DIR_VAR,
        SERVICES_SCRIPT_VAR,
        TLS_CA_VAR,
        ETCD_USER_VAR,
        ETCD_PASSWORD_VAR,
    ]);
    for key in keys {
        if let Some(value) = non_empty_var(key) {
            map.insert(key.to_owned(), value);
        }
    }
    map
}

/// One configured value (see [`config`]); `None` when absent or empty.
pub fn var(key: &str) -> Option<String> {
    non_empty_var(key).or_else(|| config().remove(key).filter(|v| !v.is_empty()))
}

/// The throwaway CA certificate (PEM file) of the harness's TLS servers
/// ([`TLS_CA_VAR`]), if configured and the file exists.
pub fn tls_ca() -> Option<PathBuf> {
    var(TLS_CA_VAR).map(PathBuf::from).filter(|p| p.is_file())
}

/// Whether we run under CI: the `CI` variable is `true` or `1`.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true")
    })
}

/// Finds `service` and checks that it answers, without applying the skip/fail
/// policy (see [`require`] for that).
pub fn lookup(service: Service) -> Result<Endpoints, Unavailable> {
    let unavailable = |reason: String| Unavailable { service, reason };
    let cfg = config();
    let raw = cfg
        .get(service.env_key())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            unavailable(format!(
                "{} is not set (env file {})",
                service.env_key(),
                env_file().display()
            ))
        })?;

    if service == Service::PostgresSocket {
        return lookup_pg_socket(
            raw,
            cfg.get(Service::Postgres.env_key()).map(String::as_str),
        )
        .map_err(unavailable);
    }

    let urls: Vec<String> = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if urls.is_empty() {
        return Err(unavailable(format!("{} is empty", service.env_key())));
    }
    let mut addrs = Vec::with_capacity(urls.len());
    for url in &urls {
        let hostport = host_port(url, service.default_port());
        let addr = hostport
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .ok_or_else(|| unavailable(format!("cannot resolve {hostport:?} (from {url:?})")))?;
        addrs.push(addr);
    }
    probe_all(&addrs).map_err(unavailable)?;
    Ok(Endpoints {
        service,
        raw,
        urls,
        addrs,
    })
}

/// The policy for tests: returns the service's endpoints when it is
/// available; otherwise panics under CI (see [`is_ci`]) and, locally, writes
/// `SKIPPED: <service> not available (run scripts/services up)` to stderr and
/// returns `None` so the test can return early. See [`require_service!`](crate::require_service).
pub fn require(service: Service) -> Option<Endpoints> {
    match lookup(service) {
        Ok(endpoints) => Some(endpoints),
        Err(err) => {
            let test = std::thread::current()
                .name()
                .map(|n| format!(" in test `{n}`"))
                .unwrap_or_default();
            if is_ci() {
                panic!(
                    "{service} not available under CI{test}: {}; \
                     run `scripts/services up` before the tests",
                    err.reason
                );
            }
            // Written to the real stderr, not via `eprintln!`, which libtest
            // captures and shows only for failing tests.
            let _ = writeln!(
                io::stderr().lock(),
                "SKIPPED: {service} not available (run scripts/services up){test}: {}",
                err.reason
            );
            None
        }
    }
}

/// Gets a service's [`Endpoints`] or leaves the test early.
///
/// `require_service!(service)` evaluates to the [`Endpoints`] of `service`
/// when it is available. When it is not, it panics under CI and otherwise
/// prints a `SKIPPED: …` line and `return`s from the enclosing function; see
/// [`services::require`](crate::services::require).
///
/// In a function that returns a value, give the value to return on skip as
/// the second argument: `require_service!(Service::Redis, Ok(()))`.
///
/// ```no_run
/// use leasehold_test_support::require_service;
/// use leasehold_test_support::services::Service;
///
/// #[tokio::test]
/// async fn needs_redlock() -> Result<(), Box<dyn std::error::Error>> {
///     let nodes = require_service!(Service::Redlock, Ok(()));
///     assert_eq!(nodes.urls().len(), 5);
///     Ok(())
/// }
/// ```
#[macro_export]
macro_rules! require_service {
    ($service:expr $(,)?) => {
        match $crate::services::require($service) {
            ::std::option::Option::Some(endpoints) => endpoints,
            ::std::option::Option::None => return,
        }
    };
    ($service:expr, $on_skip:expr $(,)?) => {
        match $crate::services::require($service) {
            ::std::option::Option::Some(endpoints) => endpoints,
            ::std::option::Option::None => return $on_skip,
        }
    };
}

/// A random namespace for one test's keys, lock names, etc.:
/// `lh-test-<8 hex digits>-<test>`, different on every call, so runs (and
/// concurrent tests) never see each other's data.
pub fn unique_prefix(test: &str) -> String {
    let tag: u32 = rand::random();
    let test: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("lh-test-{tag:08x}-{test}")
}

/// What [`node_ctl`] does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeAction {
    /// Stop the server process (`scripts/services stop NODE`).
    Stop,
    /// Start a stopped server (`scripts/services start NODE`).
    Start,
    /// Stop then start it (`scripts/services restart NODE`).
    Restart,
    /// Freeze it with SIGSTOP: connections stay open, nothing answers
    /// (`scripts/services pause NODE`).
    Pause,
    /// Unfreeze a paused server with SIGCONT (`scripts/services resume NODE`).
    Resume,
}

impl NodeAction {
    /// The script's subcommand for this action.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeAction::Stop => "stop",
            NodeAction::Start => "start",
            NodeAction::Restart => "restart",
            NodeAction::Pause => "pause",
            NodeAction::Resume => "resume",
        }
    }
}

impl fmt::Display for NodeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node names that [`node_ctl`] accepts.
pub const NODES: [&str; 17] = [
    "redis",
    "redlock1",
    "redlock2",
    "redlock3",
    "redlock4",
    "redlock5",
    "rcluster1",
    "rcluster2",
    "rcluster3",
    "postgres",
    "etcd",
    "etcd-c1",
    "etcd-c2",
    "etcd-c3",
    "redis-tls",
    "pgbouncer",
    "etcd-secure",
];

/// The path of `scripts/services`: `LEASEHOLD_SERVICES_SCRIPT` (process
/// environment or env file), else `<root>/scripts/services`.
pub fn services_script() -> PathBuf {
    var(SERVICES_SCRIPT_VAR)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("scripts").join("services"))
}

/// Runs `scripts/services ACTION NODE` (e.g. `node_ctl("redlock5",
/// NodeAction::Pause)`), waiting for it to finish.
///
/// `node` is one of [`NODES`]. The script runs under `bash`, with
/// `LEASEHOLD_SERVICES_DIR` passed on when it is known, and is killed if the
/// returned future is dropped (e.g. by a timeout). A non-zero exit is an
/// error whose message includes the script's stderr.
pub async fn node_ctl(node: &str, action: NodeAction) -> io::Result<()> {
    run_script(node, &[action.as_str(), node]).await
}

/// Runs `scripts/services pin NODE CPUS`: sets the CPU affinity of the node's process, its
/// threads and its children (for postgres the postmaster and every backend; backends forked
/// later inherit it). `cpus` is a `taskset` list (`"1"`, `"0-1"`) or `"all"`. Benchmarks use
/// it so that the scheduler's placement of server processes does not decide a comparison.
pub async fn pin_node(node: &str, cpus: &str) -> io::Result<()> {
    run_script(node, &["pin", node, cpus]).await
}

/// Runs the services script with `args` (the first naming the subcommand) for `node`.
async fn run_script(node: &str, args: &[&str]) -> io::Result<()> {
    if !NODES.contains(&node) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown node {node:?}; expected one of {NODES:?}"),
        ));
    }
    let script = services_script();
    let what = args.join(" ");
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = var(SERVICES_DIR_VAR) {
        cmd.env(SERVICES_DIR_VAR, dir);
    }
    let output = cmd.output().await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {} {what}: {e}", script.display()),
        )
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{} {what} failed ({}): {}{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim(),
        stdout_suffix(&output.stdout),
    )))
}

fn stdout_suffix(stdout: &[u8]) -> String {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!(" (stdout: {text})")
    }
}

fn non_empty_var(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// Parses `KEY=VALUE` lines; blank lines and `#` comments are skipped, an
/// optional `export ` prefix and matching surrounding quotes are removed.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            let value = value.trim();
            let value = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(value);
            Some((key.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

/// `scheme://user:pass@host:port/path?query` (or plain `host:port`) to
/// `host:port`, adding `default_port` when there is none.
fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let has_port = if let Some(v6) = rest.strip_prefix('[') {
        v6.split_once(']').is_some_and(|(_, p)| p.starts_with(':'))
    } else {
        rest.contains(':')
    };
    if has_port {
        rest.to_owned()
    } else {
        format!("{rest}:{default_port}")
    }
}

/// Probes every address concurrently; the first failure is the error.
fn probe_all(addrs: &[SocketAddr]) -> Result<(), String> {
    std::thread::scope(|scope| {
        let probes: Vec<_> = addrs
            .iter()
            .map(|addr| {
                scope.spawn(move || {
                    TcpStream::connect_timeout(addr, PROBE_TIMEOUT)
                        .map(drop)
                        .map_err(|e| format!("nothing accepts connections on {addr}: {e}"))
                })
            })
            .collect();
        probes
            .into_iter()
            .map(|probe| {
                probe
                    .join()
                    .unwrap_or_else(|_| Err("connection probe panicked".to_owned()))
            })
            .collect::<Result<Vec<()>, String>>()
            .map(drop)
    })
}

/// The parts of a `postgres://user:password@host:port/dbname` URL.
#[derive(Debug, Default)]
struct PgUrl {
    user: Option<String>,
    password: Option<String>,
    port: Option<u16>,
    dbname: Option<String>,
}

fn parse_pg_url(url: &str) -> PgUrl {
    let mut out = PgUrl::default();
    let Some((_, rest)) = url.split_once("://") else {
        return out;
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hostport) = authority
        .rsplit_once('@')
        .map_or((None, authority), |(u, h)| (Some(u), h));
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo
            .split_once(':')
            .map_or((userinfo, None), |(u, p)| (u, Some(p)));
        out.user = Some(user.to_owned()).filter(|u| !u.is_empty());
        out.password = password.map(str::to_owned);
    }
    out.port = hostport
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok());
    let dbname = path.split(['?', '#']).next().unwrap_or("");
    out.dbname = Some(dbname.to_owned()).filter(|d| !d.is_empty());
    out
}

#[cfg(unix)]
fn lookup_pg_socket(dir: String, tcp_url: Option<&str>) -> Result<Endpoints, String> {
    use std::os::unix::net::UnixStream;

    let pg = tcp_url.map(parse_pg_url).unwrap_or_default();
    let port = match pg.port {
        Some(port) => port,
        None => find_pg_socket_port(Path::new(&dir))?,
    };
    let socket = Path::new(&dir).join(format!(".s.PGSQL.{port}"));
    UnixStream::connect(&socket)
        .map_err(|e| format!("nothing accepts connections on {}: {e}", socket.display()))?;

    let mut conninfo = format!("host={} port={port}", quote_conninfo(&dir));
    for (key, value) in [
        ("user", pg.user),
        ("password", pg.password),
        ("dbname", pg.dbname),
    ] {
        if let Some(value) = value {
            conninfo.push_str(&format!(" {key}={}", quote_conninfo(&value)));
        }
    }
    Ok(Endpoints {
        service: Service::PostgresSocket,
        raw: dir,
        urls: vec![conninfo],
        addrs: Vec::new(),
    })
}

#[cfg(not(unix))]
fn lookup_pg_socket(_dir: String, _tcp_url: Option<&str>) -> Result<Endpoints, String> {
    Err("unix sockets are not supported on this platform".to_owned())
}

#[cfg(unix)]
fn find_pg_socket_port(dir: &Path) -> Result<u16, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            name.to_str()?.strip_prefix(".s.PGSQL.")?.parse().ok()
        })
        .next()
        .ok_or_else(|| format!("no .s.PGSQL.<port> socket in {}", dir.display()))
}

/// Quotes a libpq key=value value when needed.
fn quote_conninfo(value: &str) -> String {
    if !value.is_empty() && !value.contains([' ', '\'', '\\']) {
        return value.to_owned();
    }
    let escaped = value.replace('\\', "\\\\").replace('\'', "\\'");
    format!("'{escaped}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_env_files() {
        let map = parse_env("# c\n\nA=1\nexport B = \"two\"\nC='x=y'\nbad line\n");
        assert_eq!(map.get("A").map(String::as_str), Some("1"));
        assert_eq!(map.get("B").map(String::as_str), Some("two"));
        assert_eq!(map.get("C").map(String::as_str), Some("x=y"));
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn extracts_host_and_port() {
        assert_eq!(
            host_port("redis://127.0.0.1:17400", 6379),
            "127.0.0.1:17400"
        );
        assert_eq!(host_port("redis://127.0.0.1/0", 6379), "127.0.0.1:6379");
        assert_eq!(
            host_port("postgres://u:p@127.0.0.1:17432/db?x=1", 5432),
            "127.0.0.1:17432"
        );
        assert_eq!(host_port("127.0.0.1:17479", 2379), "127.0.0.1:17479");
        assert_eq!(host_port("http://[::1]:2379", 2379), "[::1]:2379");
        assert_eq!(host_port("[::1]", 2379), "[::1]:2379");
    }

    #[test]
    fn parses_postgres_urls() {
        let pg = parse_pg_url("postgres://leasehold:secret@127.0.0.1:17432/leasehold");
        assert_eq!(pg.user.as_deref(), Some("leasehold"));
        assert_eq!(pg.password.as_deref(), Some("secret"));
        assert_eq!(pg.port, Some(17432));
        assert_eq!(pg.dbname.as_deref(), Some("leasehold"));
    }

    #[test]
    fn quotes_conninfo_values() {
        assert_eq!(quote_conninfo("/tmp/x"), "/tmp/x");
        assert_eq!(quote_conninfo("a b"), "'a b'");
        assert_eq!(quote_conninfo("it's"), "'it\\'s'");
        assert_eq!(quote_conninfo(""), "''");
    }

    #[test]
    fn unique_prefixes_differ() {
        let a = unique_prefix("my::test");
        let b = unique_prefix("my::test");
        assert_ne!(a, b);
        assert!(a.starts_with("lh-test-"), "{a}");
        assert!(a.ends_with("-my__test"), "{a}");
        assert_eq!(a.len(), "lh-test-".len() + 8 + "-my__test".len());
    }
}
