//! The "Redis failover" faults, on the Sentinel topology of `scripts/services` (a master, two
//! replicas, three sentinels; `redis+sentinel://`): the replicas are cut off from the master
//! (paused, their links dropped by `CLIENT KILL TYPE replica`, so they miss every later write),
//! A takes the lock, the master is killed (SIGKILL) and the replicas resume; the sentinels
//! promote one of them, which never saw A's grant. B tries to take the lock, then A writes.
//!
//! Without the replica-sync check A's grant counts at once: B gets the lock again, with a
//! fencing token that went back (a finding: Redis is an efficiency lock). With it
//! (`replica_sync=2`), A's grant never counts, since no replica acknowledges it: no overlap.
//! A fault that did nothing is one in which the sentinels name the same master afterwards: the
//! trial fails. The topology is restored (`scripts/services failover-reset`) after each trial.

use std::time::{Duration, Instant};

use super::check::Acquired;
use super::env::{Spec, opt};
use super::faults::script;
use super::trial::{Pair, Run, contend};
use crate::harness::BoxError;

const REPLICAS: [&str; 2] = ["sreplica1", "sreplica2"];

/// `pid=` or `port=` of a running node, from `scripts/services status`.
async fn node_field(node: &str, field: &str) -> Result<String, BoxError> {
    let status = script(&["status"]).await?;
    let at = format!("{field}=");
    status
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(node))
        .flat_map(str::split_whitespace)
        .find_map(|w| w.strip_prefix(at.as_str()))
        .map(str::to_owned)
        .ok_or_else(|| format!("no {field} of {node} in {status:?}").into())
}

async fn run(program: &str, args: &[&str]) -> Result<(), BoxError> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into())
    }
}

impl Run<'_> {
    /// The failover trial (see the module docs); `wait` turns the replica-sync check on for A.
    pub(super) async fn failover(&mut self, wait: bool) -> Result<(Pair, bool), BoxError> {
        let url = opt(&self.env.sentinel, "redis sentinel")?.clone();
        let spec = |url: String| Spec::Redis {
            url,
            response_timeout: Duration::from_secs(1),
        };
        let a_url = if wait {
            format!("{url}?replica_sync=2&replica_sync_timeout_ms=200")
        } else {
            url.clone()
        };
        let outcome = self.failover_steps(spec(a_url), spec(url)).await;
        let reset = script(&["failover-reset"]).await;
        let pair = outcome?;
        reset?;
        Ok(pair)
    }

    async fn failover_steps(&mut self, a: Spec, b: Spec) -> Result<(Pair, bool), BoxError> {
        // Long enough that A's lease outlives the failover.
        let pair = self.start(a, b, Duration::from_secs(10)).await?;
        // Some history on the key, so that a token that went back shows.
        for _ in 0..2 {
            if pair.b.acquire(&self.key).await == Acquired::Held {
                pair.b.release().await;
            }
        }
        let master = script(&["sentinel-master"]).await?;
        for r in REPLICAS {
            script(&["pause", r]).await?;
        }
        let port = node_field(&master, "port").await?;
        run(
            "redis-cli",
            &["-p", &port, "client", "kill", "type", "replica"],
        )
        .await?;
        // A's grant reaches no replica (with the check on, it never counts).
        let until = Instant::now() + Duration::from_millis(300);
        while pair.a.acquire(&self.key).await != Acquired::Held && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = pair.a.write().await;
        run("kill", &["-KILL", &node_field(&master, "pid").await?]).await?;
        for r in REPLICAS {
            script(&["resume", r]).await?;
        }
        let t0 = Instant::now();
        loop {
            let now = script(&["sentinel-master"]).await.unwrap_or_default();
            if !now.is_empty() && now != master {
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(format!("the fault did nothing: {master} is still master").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let takeover = contend(&pair.b, &self.key, Instant::now() + Duration::from_secs(15)).await;
        let _ = pair.a.write().await;
        Ok((pair, takeover))
    }
}
