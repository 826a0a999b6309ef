//! The "network partition" fault: the servers run in network namespaces of their own
//! (`leasehold_test_support::netns`), both clients in the root namespace, and A is cut off for
//! real (no RST, no ICMP: packets dropped) while it holds the lock.
//!
//! - etcd: a 3-member cluster; A reaches it only through the leader, B only through the
//!   followers; the leader's link goes down (A and the leader on the minority side).
//! - Redlock: three nodes; each has a second address that only A uses, and all of A's paths
//!   are blackholed both ways (B's stay up).
//! - PostgreSQL: a server of the trial's own (`initdb`) with `tcp_keepalives_idle = 1`,
//!   `tcp_keepalives_interval = 1`, `tcp_keepalives_count = 2` and `tcp_user_timeout = 3000`,
//!   which bound how long it keeps a vanished client's session and its advisory lock; A's path
//!   (a second address) is blackholed both ways.
//!
//! A fault that did nothing (no packet dropped) leaves A's grant alive, so B never takes the
//! lock: the takeover invariant catches it.

use std::time::{Duration, Instant};

use leasehold_test_support::etcd::leader_index;
use leasehold_test_support::netns::Net;

use super::check::Acquired;
use super::env::{Spec, Timing};
use super::trial::{Pair, Run, a_takes, contend};
use crate::harness::BoxError;

/// The PostgreSQL settings that bound how long the server keeps a cut client's session.
pub(super) const PG_SETTINGS: [(&str, &str); 4] = [
    ("tcp_keepalives_idle", "1"),
    ("tcp_keepalives_interval", "1"),
    ("tcp_keepalives_count", "2"),
    ("tcp_user_timeout", "3000"),
];

/// What to cut: one node's link, or the second paths of these nodes.
enum Cut {
    Link(usize),
    Paths(Vec<usize>),
}

impl Cut {
    fn apply(&self, net: &Net, cut: bool) -> Result<(), BoxError> {
        match (self, cut) {
            (Cut::Link(n), true) => net.cut(*n),
            (Cut::Link(n), false) => net.heal(*n),
            (Cut::Paths(nodes), _) => nodes.iter().try_for_each(|n| {
                if cut {
                    net.cut_path(*n)
                } else {
                    net.heal_path(*n)
                }
            }),
        }
    }
}

/// A's and B's specs on servers in `net`, and the cut that isolates A.
async fn specs(net: &Net, backend: &str) -> Result<(Spec, Spec, Cut), BoxError> {
    Ok(match backend {
        "etcd" => {
            let endpoints = net.etcd_cluster().await?;
            let urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
            let lead = leader_index(&urls).await?;
            let spec = |endpoints| Spec::Etcd {
                endpoints,
                session: Duration::from_secs(2),
            };
            let followers = (0..endpoints.len())
                .filter(|i| *i != lead)
                .map(|i| endpoints[i].clone());
            (
                spec(vec![endpoints[lead].clone()]),
                spec(followers.collect()),
                Cut::Link(lead + 1),
            )
        }
        "redlock" => {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for n in 1..=net.nodes() {
                let url = net.redis(n).await?;
                let alias = net.add_path(n)?;
                a.push(url.replace(&net.addr(n).to_string(), &alias.to_string()));
                b.push(url);
            }
            (
                Spec::Redlock(a),
                Spec::Redlock(b),
                Cut::Paths((1..=net.nodes()).collect()),
            )
        }
        "postgres" => {
            let url = net.postgres(1, &PG_SETTINGS).await?;
            let alias = net.add_path(1)?;
            let a = url.replace(&net.addr(1).to_string(), &alias.to_string());
            (Spec::Postgres(a), Spec::Postgres(url), Cut::Paths(vec![1]))
        }
        other => return Err(format!("no partition for {other}").into()),
    })
}

impl Run<'_> {
    /// A is cut off from the servers while it holds the lock; B, on the other side, tries to
    /// take it for a while; A writes (checking its lease first); then the cut heals.
    pub(super) async fn partition(
        &mut self,
        backend: &str,
        t: &Timing,
    ) -> Result<(Pair, bool), BoxError> {
        let nodes = if backend == "postgres" { 1 } else { 3 };
        let tag = format!("sf{}", &backend[..4]);
        let net = tokio::task::spawn_blocking(move || Net::create(&tag, nodes)).await??;
        let (a, b, cut) = specs(&net, backend).await?;
        // Kept until the trial ends, so that the clients' releases find their servers.
        self.net = Some(net);
        let pair = self.start(a, b, t.ttl).await?;
        a_takes(&pair.a, &self.key).await?;
        let net = self.net.as_ref().ok_or("the net is gone")?;
        cut.apply(net, true)?;
        // etcd: the session (2 s) runs out on the majority, after an election; PostgreSQL:
        // the server's 3 s bound; Redlock: the TTL.
        let within = match backend {
            "redlock" => Duration::from_secs(3),
            _ => Duration::from_secs(12),
        };
        let takeover = contend(&pair.b, &self.key, Instant::now() + within).await;
        let _ = pair.a.write().await;
        cut.apply(net, false)?;
        if pair.a.acquire(&format!("{}-healed", self.key)).await == Acquired::Held {
            pair.a.release().await;
        }
        Ok((pair, takeover))
    }
}
