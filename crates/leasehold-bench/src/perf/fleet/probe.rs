//! What the fleet scenario reads: the servers' own request counters, PostgreSQL's sessions,
//! and this process's CPU time, resident memory and TCP connections.
//!
//! - Redis (every node): the top-level script calls of `INFO commandstats` (`eval`,
//!   `evalsha`, `fcall` and their `_ro` forms; commands a script runs inside are counted by
//!   Redis under their own names and left out), and the round trips: the reads the server
//!   served (`total_reads_processed` of `INFO stats`; commands pipelined together on a
//!   connection arrive in one read; the probe's own `INFO` calls included).
//! - PostgreSQL: transactions committed in the database (`pg_stat_database.xact_commit`: every
//!   statement outside a transaction block is one), and the rows of `pg_stat_activity` with
//!   the backend's `application_name` (its sessions).
//! - etcd: gRPC messages the member received (`grpc_server_msg_received_total` of its
//!   `/metrics`, every method: a keep-alive on a stream counts once per message).

use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::harness::BoxError;

/// The script commands Redis counts a top-level script call under.
const SCRIPT_CALLS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// One node's counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct NodeCount {
    /// Top-level script calls (Redis only).
    pub(super) scripts: u64,
    /// The requests (round trips) the node served.
    pub(super) requests: u64,
}

/// The servers a backend talks to, reached directly.
pub(super) enum Probe {
    Redis(Vec<redis::aio::MultiplexedConnection>),
    Postgres {
        client: tokio_postgres::Client,
        app: String,
    },
    Etcd(Vec<String>),
}

impl Probe {
    /// Connects to every Redis node of `urls`.
    pub(super) async fn redis(urls: &[String]) -> Result<Self, BoxError> {
        let mut conns = Vec::new();
        for u in urls {
            let c = redis::Client::open(u.as_str())?;
            conns.push(c.get_multiplexed_async_connection().await?);
        }
        Ok(Self::Redis(conns))
    }

    /// Connects to PostgreSQL, to watch the sessions named `app`.
    pub(super) async fn postgres(conninfo: &str, app: &str) -> Result<Self, BoxError> {
        let (client, conn) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
        drop(tokio::spawn(conn));
        Ok(Self::Postgres {
            client,
            app: app.to_owned(),
        })
    }

    /// Reads etcd's `/metrics` on these endpoints (`host:port`).
    pub(super) fn etcd(endpoints: &[String]) -> Self {
        Self::Etcd(endpoints.to_vec())
    }

    /// Every node's counters now.
    pub(super) async fn counts(&mut self) -> Result<Vec<NodeCount>, BoxError> {
        match self {
            Self::Redis(conns) => {
                let mut out = Vec::with_capacity(conns.len());
                for c in conns.iter_mut() {
                    let stats: String = redis::cmd("INFO")
                        .arg("commandstats")
                        .query_async(c)
                        .await?;
                    let general: String = redis::cmd("INFO").arg("stats").query_async(c).await?;
                    out.push(NodeCount {
                        scripts: script_calls(&stats),
                        requests: info_field(&general, "total_reads_processed").unwrap_or(0),
                    });
                }
                Ok(out)
            }
            Self::Postgres { client, .. } => {
                let row = client
                    .query_one(
                        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
                        &[],
                    )
                    .await?;
                let n: i64 = row.try_get(0)?;
                Ok(vec![NodeCount {
                    scripts: 0,
                    requests: u64::try_from(n)?,
                }])
            }
            Self::Etcd(endpoints) => {
                let mut out = Vec::with_capacity(endpoints.len());
                for e in endpoints.iter() {
                    let text = http_get(e, "/metrics").await?;
                    out.push(NodeCount {
                        scripts: 0,
                        requests: metric_sum(&text, "grpc_server_msg_received_total"),
                    });
                }
                Ok(out)
            }
        }
    }

    /// The backend's PostgreSQL sessions now (`pg_stat_activity` rows with its
    /// `application_name`); `None` for other servers.
    pub(super) async fn sessions(&self) -> Result<Option<u64>, BoxError> {
        let Self::Postgres { client, app } = self else {
            return Ok(None);
        };
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[app],
            )
            .await?
            .try_get(0)?;
        Ok(Some(u64::try_from(n)?))
    }
}

/// Sum of the top-level script calls in an `INFO commandstats` answer.
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| SCRIPT_CALLS.contains(name))
        .filter_map(|(_, fields)| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .sum()
}

/// A numeric `name:value` field of an `INFO` answer.
fn info_field(info: &str, name: &str) -> Option<u64> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The sum of every sample of metric `name` in a Prometheus text exposition.
fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The body of `GET path` on `host:port` (plain HTTP/1.0, as etcd serves `/metrics`).
async fn http_get(addr: &str, path: &str) -> Result<String, BoxError> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf);
    let (_, body) = text
        .split_once("\r\n\r\n")
        .ok_or("no HTTP body in the /metrics answer")?;
    Ok(body.to_owned())
}

/// User + system CPU time of this process so far (`getrusage`).
pub(crate) fn cpu_time() -> Result<Duration, BoxError> {
    usage(UsageWho::RUSAGE_SELF)
}

/// User + system CPU time of `who` so far.
fn usage(who: UsageWho) -> Result<Duration, BoxError> {
    let u = getrusage(who)?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
    };
    Ok(tv(u.user_time()) + tv(u.system_time()))
}

/// [`connections_to`], adding the CPU time the calling thread spent on it to `spent`: the
/// count runs synchronously on this thread, so the thread's own `getrusage` delta is exactly
/// its cost (the process-wide one would also take out what other threads did meanwhile).
pub(super) fn connections_counted(ports: &[u16], spent: &mut Duration) -> Result<usize, BoxError> {
    let before = thread_cpu_time()?;
    let n = connections_to(ports)?;
    *spent += thread_cpu_time()?.saturating_sub(before);
    Ok(n)
}

/// User + system CPU time of the calling thread so far (`getrusage(RUSAGE_THREAD)`).
fn thread_cpu_time() -> Result<Duration, BoxError> {
    usage(UsageWho::RUSAGE_THREAD)
}

/// Resident memory of this process now, in bytes (`VmRSS` of `/proc/self/status`).
pub(super) fn rss_bytes() -> Result<u64, BoxError> {
    status_bytes("VmRSS:")
}

/// A field of `/proc/self/status` given in kB, in bytes.
fn status_bytes(field: &str) -> Result<u64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no {field} in /proc/self/status"))?;
    Ok(kb * 1024)
}

/// The peak of resident memory over a stretch of work (a burst release), above the resident
/// memory at its start: the kernel's high-water mark (`VmHWM`), reset at the start by writing
/// `5` to `/proc/self/clear_refs`.
pub(super) struct Peak {
    start: u64,
}

impl Peak {
    pub(super) fn start() -> Result<Self, BoxError> {
        std::fs::write("/proc/self/clear_refs", "5")?;
        Ok(Self {
            start: rss_bytes()?,
        })
    }

    /// The peak's growth over the start, per lease of `n`.
    pub(super) fn per_lease(&self, n: usize) -> Result<f64, BoxError> {
        let peak = status_bytes("VmHWM:")?;
        Ok(peak.saturating_sub(self.start) as f64 / n.max(1) as f64)
    }
}

/// This process's established TCP connections to any of `ports` (its socket inodes in
/// `/proc/self/fd`, matched against `/proc/self/net/tcp` and `tcp6`).
///
/// Those tables list every socket of the network namespace and are read in pages: a socket
/// another process opens or closes meanwhile can make a read skip (or repeat) others. Seen with
/// the fleet's quick runs, five processes at once: a Redis Cluster client counted 1 of its 3
/// connections. So each table is read three times and a socket counts once if any read saw it.
pub(super) fn connections_to(ports: &[u16]) -> Result<usize, BoxError> {
    let mut ours = std::collections::HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd")? {
        let Ok(target) = std::fs::read_link(fd?.path()) else {
            continue;
        };
        if let Some(inode) = target
            .to_str()
            .and_then(|t| t.strip_prefix("socket:["))
            .and_then(|t| t.strip_suffix(']'))
        {
            ours.insert(inode.to_owned());
        }
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
                let (Some(rem), Some(st), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else {
                    continue;
                };
                let port = rem
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                if *st == "01" && port.is_some_and(|p| ports.contains(&p)) && ours.contains(*inode)
                {
                    seen.insert((*inode).to_owned());
                }
            }
        }
    }
    Ok(seen.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_the_servers_texts() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_pexpire:calls=900,usec=1\r\ncmdstat_fcall_ro:calls=3,usec=1\r\n\
                    cmdstat_eval:calls=1,usec=1\r\n";
        assert_eq!(script_calls(info), 16, "pexpire runs inside the scripts");
        assert_eq!(
            info_field(
                "total_commands_processed:42\r\nx:1",
                "total_commands_processed"
            ),
            Some(42)
        );
        let metrics = "# HELP grpc_server_msg_received_total x\n\
                       grpc_server_msg_received_total{grpc_method=\"Txn\"} 7\n\
                       grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\"} 3\n\
                       grpc_server_msg_received_total_other 100\n";
        assert_eq!(metric_sum(metrics, "grpc_server_msg_received_total"), 10);
    }

    #[test]
    fn the_process_reads_its_own_usage() {
        assert!(rss_bytes().unwrap() > 0);
        let peak = Peak::start().unwrap();
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        drop(block);
        assert!(
            peak.per_lease(1).unwrap() >= (32 << 20) as f64,
            "a 64 MiB block touched and freed shows in the peak"
        );
        let _ = cpu_time().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let before = connections_to(&[port]).unwrap();
        let _c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        assert_eq!(connections_to(&[port]).unwrap(), before + 1);
    }
}
