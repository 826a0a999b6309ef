//! Redis backends for leasehold: [`RedisBackend`] (one server) and [`RedlockBackend`] (the
//! Redlock algorithm over N independent servers). Both are **efficiency** locks: use them to
//! avoid duplicate work, not to protect data that a second holder would corrupt.
//!
//! # What they guarantee, and what they don't
//!
//! | | [`RedisBackend`] | [`RedlockBackend`] |
//! |---|---|---|
//! | safety | one server decides; a failover or a restart without persistence can hand the lock to a second holder | a majority decides; safe only under bounded network delay, process pauses and clock drift |
//! | fencing token | best effort: a per-key counter, `INCR`ed with each acquisition; it **goes back** if the server loses its data | none (a quorum cannot mint a strictly increasing number without consensus) |
//! | waiting | a release hands the lock to the first waiter on the key's wait list (in the order they came) and wakes it alone, with a message on that waiter's own channel, with jittered backoff as a fallback; waiters of one process queue in order; opt-in [fair mode](#fair-mode) for a strict line | each node hands its lock to the first waiter of its own wait list, ordered alike on every node by the waiter's ticket, and wakes it; jittered backoff as a fallback |
//! | holder crash | the key expires after its TTL | the keys expire after their TTL |
//!
//! Requires Redis ≥ 6 (RESP3: release wake-ups are pushed on the shared connection); a Redis
//! Cluster needs Redis ≥ 7 (sharded pub/sub keeps a lock's wake-up channel on its slot).
//!
//! **Eviction.** A server with a `maxmemory` and any `maxmemory-policy` but `noeviction`
//! deletes keys under memory pressure, lock keys included (they all carry a TTL, so the
//! `volatile-*` policies take them too): another client can then take a lock that is still
//! held, and its holder hears of it only at its next renewal. Managed services often default
//! to such a policy. No client can prevent it: each server (each node of a cluster, each
//! Redlock node) is asked once after its first connect (`INFO memory`), and one that may evict
//! is named in a warning (target `leasehold.redis.eviction`). Give the servers that hold locks
//! `noeviction`.
//!
//! # Connecting
//!
//! - `redis://[user:password@]host[:port][/db]`, `redis+unix:///path/to/socket`: one server.
//! - `rediss://…`: the same over TLS (rustls with the *ring* provider). The system's roots are
//!   trusted unless [`RedisConfig::with_tls_ca_file`] names a CA; the certificate must name the
//!   URL's host. redis-rs's `#insecure` fragment turns verification off: for tests only.
//! - `redis-cluster://[user:password@]host:port,host:port,…`: a Redis Cluster by its seed nodes
//!   (or [`RedisConfig::cluster`]); each command goes to the master of its slot.
//!   `rediss-cluster://…` is the same over TLS (the nodes' TLS ports, as `CLUSTER SLOTS`
//!   tells a TLS client).
//! - `redis+sentinel://[user:password@]host:port,host:port,…/SERVICE[/db]`: the master that the
//!   Redis Sentinels at those addresses (port 26379 when left out) name for `SERVICE`, found
//!   again after a failover (see [Redis Sentinel](#redis-sentinel)). The userinfo logs in to the
//!   master (and its replicas), `sentinel_user` / `sentinel_password` to the sentinels;
//!   `rediss+sentinel://` speaks TLS to both (the `ca` option as for `rediss://`).
//! - `redlock://[user:password@]host:port,host:port,…[/db]`: N ≥ 3 independent servers.
//!
//! | URL option | what | default |
//! |---|---|---|
//! | `prefix=P` | key prefix (a `LockConfig` `key_prefix` wins) | `leasehold:` |
//! | `ca=PATH` | trust this PEM CA file for `rediss://` | the system's roots |
//! | `fair_queue_ms=GRACE` | [fair mode](#fair-mode) with this grace period (ms, at least 100); not for `redlock://` | off |
//! | `connect_timeout_ms=N`, `response_timeout_ms=N` | connect and response timeouts; not for `redlock://` | 1000, 1000 |
//! | `wait_initial_ms=N`, `wait_max_ms=N` | waiters' fallback backoff (they are woken by the release message first); not for `redlock://` | 50, 1000 |
//! | `fence_ttl_ms=N` | fence counters expire N ms after their key's latest acquisition (see [what keys leave behind](#what-keys-leave-behind)); not for `redlock://` | kept for ever |
//! | `sentinel_user=U`, `sentinel_password=P` | `redis+sentinel://` only: the sentinels' login (the URL's userinfo is the master's) | none |
//! | `replica_sync=N`, `replica_sync_timeout_ms=T` | [replica-sync check](#the-replica-sync-check): a grant counts once `N` replicas have it, waiting up to `T` ms; not for `redis-cluster://` or `redlock://` | off; 200 |
//! | `node_timeout_ms=N` | `redlock://` only: bound on each request to one node (renewal batches: at least `ttl / 10`; releases: at least 1 s) | `ttl / 200`, within 5–50 |
//! | `connect_timeout_ms=N` | `redlock://`: each node's connect timeout | 1000 |
//! | `min_validity_ms=N` | `redlock://` only: validity an acquisition must have left | 1 |
//! | redis-rs's own (`protocol`, `db`, …) | passed to redis-rs | |
//!
//! Every option is also a [`RedisConfig`] or [`RedlockConfig`] method, so a URL — and with it
//! `LockConfig` and the CLI — reaches everything code can set. Passwords never appear in
//! `Debug` output or errors.
//!
//! The crate's surface is that of every leasehold driver: the backends, their configurations,
//! [`SCHEMES`], [`DEFAULT_PREFIX`] and [`DRIVER`], the entry the `leasehold` facade's registry
//! opens URLs with.
//!
//! # Key mapping
//!
//! With the default prefix `leasehold:` and the key `jobs/nightly`:
//!
//! | Redis name | what |
//! |---|---|
//! | `leasehold:{jobs/nightly}` | the lock: a string holding the owner value, with a TTL; followed by `~` once a waiter announced itself (see [the scripts](#the-scripts)) |
//! | `leasehold:{jobs/nightly}:fence` | the fencing counter (single node only; never deleted unless `fence_ttl_ms` is set, so tokens don't restart while the server keeps its data) |
//! | `leasehold:{jobs/nightly}:released:<owner>` | a waiter's own pub/sub channel: the release that chose it as the waiter to wake publishes there |
//! | `leasehold:{jobs/nightly}:waitlist` | the wait list (sorted set: owner value → ticket, the server's time in ms when the waiter went on the list; on Redlock the client's when its wait began, the same on every node), put there by a waiting attempt that found the lock held and kept for the rest of its wait; a release takes the first live waiter off and hands it the lock, and publishes nothing while the list is empty |
//! | `leasehold:{jobs/nightly}:waiters` | the waiters' liveness (sorted set: owner value → server time in ms until which it counts as alive), moved on by each of its attempts; a waiter that stopped asking (it crashed) is passed over |
//!
//! The braces are a hash tag: on a Redis Cluster they all share one slot. A key beginning
//! with `}` would leave that tag empty (Redis Cluster then hashes each name whole, and the lock
//! and its counter would sit on different slots): such a key, e.g. `}x`, is named
//! `leasehold:~{~}}x}` (tag `~`) and its counter `leasehold:~{~}}x}:fence`. Any client that sets
//! the lock key with `SET` `NX` excludes leasehold, and the other way round:
//!
//! ```text
//! redis-cli SET 'leasehold:{jobs/nightly}' by-hand NX PX 30000    # take it
//! redis-cli EVAL "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0" 1 'leasehold:{jobs/nightly}' by-hand   # give it back
//! ```
//!
//! A leasehold waiter never changes such a value: it marks only a value of leasehold's own form
//! (40 lower-case hex digits; see [the scripts](#the-scripts)). Hold by hand with any other
//! value, or a waiter's mark makes your compare-and-delete fail until the key's TTL.
//!
//! # What keys leave behind
//!
//! A released lock deletes its key; the fair line's keys, the `:waitlist` and `:waiters` expire by
//! themselves (a waiter that gives up takes itself off at once); the fence counter
//! `<lock>:fence` stays: **keys must come from a bounded set** (job names, not request ids), or
//! counters pile up without end (`leasehold-bench perf` measures the bytes one key leaves).
//! Deleting a counter by hand restarts its tokens at 1: a token below ones already handed out.
//! [`RedisConfig::with_fence_ttl`] (`fence_ttl_ms=N`) makes each counter expire N ms after its
//! key's latest acquisition instead; a counter that starts again starts at the server's clock in
//! microseconds, above every token the old counter gave (one key is never taken a million
//! times a second), so tokens keep increasing, even past a holder that still writes, as long as
//! the server's clock never steps back by more than N. Choose N well above any clock step you
//! can imagine (an hour or a day), and set it on every client of the keys (one without it would
//! restart an expired counter at 1). The token stays what it is on one server anyway: best
//! effort, gone backwards if the server loses its data.
//!
//! # Fair mode
//!
//! With plain `SET NX`, the task that releases a lock usually takes it straight back, and waiters
//! in other processes can starve for seconds (the benchmark's contention rows measure how
//! often, and how long). The default mode already avoids that: a release with waiters hands
//! the lock to the first of them still alive, in the order they first found it held (sets it to
//! that waiter's owner value for 250 ms, in which the woken waiter claims it), so neither the
//! releaser asking again at once nor any newcomer can take it first. What it leaves open: a lock
//! that nobody was waiting for when it was freed (or that expired, or whose woken waiter did not
//! claim it in time) goes to whoever asks first, and a waiter that loses the lock that way waits
//! for the next release.
//! Within one process, waiters for a key always queue locally and are served in order. Across
//! processes, [`RedisConfig::with_fair_queue`] (or `?fair_queue_ms=GRACE` in the URL) turns on
//! a strict line kept on the server, as Redisson's fair lock does:
//!
//! - `<lock>:queue` (a list of owner values, in arrival order) and `<lock>:waiters` (a sorted
//!   set: owner value → server time until which that waiter counts as alive) share the lock's
//!   hash tag. A waiting acquire joins the line and asks again (on the release message, or at
//!   least every third of the grace period), which keeps its place.
//! - A free lock is granted only to the head of the line (or to anyone when the line is empty).
//!   A release does not free a lock with a line: it hands it to the first waiter still alive
//!   (sets it to that waiter's owner value for the grace period) and publishes on that waiter's
//!   own channel, so only that waiter hears of it; it claims the lock (re-armed for its TTL, with the
//!   next fencing token) in its next attempt.
//! - `try_acquire` never joins the line. It is the plain `SET NX` of the uncontended path, so
//!   fair mode costs the server no more than plain mode until someone waits; since a lock with a
//!   line is handed over rather than freed, a try can only take it ahead of the line after its
//!   holder let it expire.
//! - Mutual exclusion is exactly that of plain mode (the lock is still `SET` only when absent);
//!   the line only decides *who* may take a free lock. Time is the server's (`TIME` in the
//!   script), never a client clock.
//! - A waiter that stops asking (it crashed) is dropped from the head of the line once its grace
//!   period runs out, so a dead waiter delays the others by at most the grace period. A waiter
//!   that gives up, or whose acquire future is dropped, leaves the line at once. The line's keys
//!   expire after twice the grace period without waiters.
//!
//! The test `fair.rs` checks it with several backends contending on one key: at most one grant
//! in twenty goes straight back to the releaser, and no wait reaches a second. The price is
//! throughput (every handoff waits for the head of the line to ask).
//!
//! # Redis Sentinel
//!
//! `redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster` asks the sentinels
//! (the first that answers) which server is the master of `mymaster`, checks that the server
//! says so itself (`ROLE`), and connects to it. When a request to it then fails the way a
//! failover makes it fail (connection refused, dropped or timed out, or `READONLY` from a master
//! demoted to a replica), the sentinels are asked again, and requests go to the master they
//! name from then on, the release channels subscribed there again. The failed request returns a
//! retryable error; the `Locker` retries it. The test `sentinel_failover.rs` kills the master
//! and checks that the same backend works again once a replica is promoted.
//!
//! A failover is where a single Redis master loses locks: replication is asynchronous, so the
//! promoted replica may lack the last grants — and the fence counter's last `INCR`s, so fencing
//! tokens go back. The same test cuts the replicas off for the last 300 ms before the master
//! dies, and the promoted replica hands out again every grant it missed, each with a lower
//! token. Sentinel does not make Redis a correctness lock.
//!
//! ## The replica-sync check
//!
//! [`RedisConfig::with_replica_sync`] (`?replica_sync=N`) makes a grant count only once `N`
//! replicas have acknowledged it: after the grant, on a connection of its own (`WAIT` blocks its
//! connection, and the backend's connection is shared), the check writes a key of its own
//! (`<prefix>replica-sync`), reads the lock back and sends `WAIT N timeout`; since replication
//! keeps the master's order, a replica that has the check's write has the grant. When fewer
//! replicas answer in time, the grant is given back and the acquisition fails with a retryable
//! error. With `N` = every replica, the failover test loses no grant. It narrows the window, it
//! does not close it: a replica acknowledges what it received, not what it wrote to disk, and
//! an acquisition whose check failed leaves its write on the servers that had it until released.
//!
//! **Off by default**, unlike Redisson's `checkLockSyncedSlaves`: the right `N` depends on the
//! deployment (a master without replicas would fail every acquisition), the check costs a round
//! trip and the replication delay on every acquisition (`leasehold-bench perf` has the row) and
//! stalls acquisitions up to the timeout while a replica lags, and it does not change the safety
//! class: a lock that must not be lost belongs on etcd or PostgreSQL with fencing. Turn it on
//! with `N` = the number of replicas when a lost grant costs more than the latency.
//!
//! # The scripts
//!
//! Acquire is one round trip: `SET key owner NX PX ttl` and `INCR` of the fence counter,
//! pipelined (plain commands cost the server far less than a script; why the tokens still follow
//! the order of grants is said at `Node::take`; a Redis Cluster, or a counter with
//! `fence_ttl_ms`, runs them as one Lua script). An
//! `acquire` that finds the lock free costs the same one round trip (in fair mode, a script that
//! also yields to a line); only one that finds it held subscribes to its wake-up channel, and
//! its waiting attempts are one script each that also announces the waiter (the `:waitlist`,
//! or the fair line) when the lock is held, and claim a lock a release handed them. A waiter
//! that announces itself also **marks** the holder's value: it appends `~` to an owner value of
//! leasehold's form (40 lower-case hex digits), never to another value. So a release learns
//! whether anybody waits from the value it reads anyway: its first call is the bare
//! compare-and-delete of one key and one argument, the server work of a raw lock's release
//! (`leasehold-bench perf --groups redis-benchmark` measures the Redis CPU of a cycle against
//! a raw one's). Only a marked value (or one that is not ours) goes on to the full release
//! script, a round trip more: a hand-over to the first waiter still alive (the lock set to its
//! owner value, marked again if others still wait, which its next attempt claims) and a
//! `PUBLISH` to it alone; however many wait, a release wakes one, so handing the lock on costs
//! the same with 64 waiters as with one (`leasehold-bench perf --groups handoff` measures it).
//! A waiter that vanished without leaving the list (killed) costs at most one release's
//! hand-over (the lock stays reserved for it 250 ms): the others then come by their backoff.
//! Extend is compare-and-`PEXPIRE` (a marked value counts as the holder's). Scripts run by SHA
//! and are reloaded on `NOSCRIPT`.
//! All leases of one backend share one multiplexed, auto-reconnecting connection per server.
//!
//! # Renewal in batches
//!
//! The `Locker`'s renewal engine hands the backend every lease due within a window; the
//! backend re-arms them with one compare-and-`PEXPIRE` script over up to 250 keys per call
//! (each key with its own owner and its own answer, the keys of one call sharing a TTL; each
//! call encoded once, and sent as is to every Redlock node), the calls sent together on the
//! shared connection. 10,000 leases with a 3 s TTL cost about 50 script calls per renewal
//! period instead of 10,000. A key whose owner no longer matches makes only its lease lost; a
//! call that fails or times out leaves each of its leases to be retried before its own
//! deadline. On a Redis Cluster the leases are grouped by the master of their slot (`CLUSTER
//! SLOTS`, read once per batch) and each master gets the same script flagged
//! `allow-cross-slot-keys` (Redis 7; the keys travel in `ARGV`, as a cluster refuses declared
//! keys of several slots): per master the count of one server, about 50 calls per renewal
//! period for 10,000 leases on it. A group a master refuses (a slot moved while resharding)
//! falls back to one call per slot. Redlock sends the same batches to every node concurrently, each
//! bounded by the per-node timeout, and counts the majority per lease.
//!
//! # Redlock, as implemented
//!
//! - One fresh 160-bit owner value per acquisition; `SET NX PX` on every node **concurrently**,
//!   each bounded by a per-node timeout far below the TTL (default `ttl / 200`, between 5 ms
//!   and 50 ms, never more than the validity left) rather than a client library default.
//! - Success needs a majority (`N / 2 + 1`) **and** validity left: `ttl − elapsed − drift`, with
//!   elapsed measured on the monotonic clock from before the first request. The answer comes as
//!   soon as the outcome is decided, not after the slowest node.
//! - On failure, every node that did not answer "held" gets a compare-and-delete, in a spawned
//!   task, including those that timed out or have not answered yet: their requests are dropped
//!   first, so one already sent runs on its node before the give-back (same connection, in
//!   order) and one not sent never goes. A dropped acquire future gives back the same way. The
//!   node requests themselves run in the caller's future: a round that keeps its grant spawns
//!   nothing.
//! - Extend re-arms, on every node, the key that still holds our owner value (compare and
//!   `PEXPIRE`), and never sets a missing key again: an extend still in flight when the lease
//!   is released (both go to every node, in any order) cannot bring the lock back. A node that
//!   restarted empty stays without our key, and the extend needs a majority of the others.
//! - A release waits for each node up to the longer of the per-node timeout and 1 s (a tenth of
//!   its 10 s bound: releases come in bursts that queue on a node's connection, and waiting
//!   costs them only time); a request still unanswered then, or at the decision, goes on in a
//!   spawned task. Renewal batches wait up to the longer of the per-node timeout and `ttl / 10`.
//! - An extend that has no majority yet when its per-node timeouts expire, while the nodes that
//!   timed out could still make one, waits up to 1 s more (never past its validity) for their
//!   late answers (their requests go on in the background): a grant held on a bare majority,
//!   one of whose nodes is slow, is not reported as lost because of that node alone.
//! - A waiting acquire subscribes to its own wake-up channel on every node it can reach (RESP3
//!   pushes on the node's shared connection), puts itself on the wait list of each node that
//!   finds the key held (the `:waitlist`, as on one server), and starts the next round on the
//!   first release message from any node, with jittered backoff (50 ms to 1 s) as the
//!   fallback. Each node's release hands its lock to the first waiter of its list and wakes
//!   it. The lists are ordered by the waiter's ticket, the client's clock when its wait began,
//!   sent to every node and kept for the whole wait: the nodes order their lists alike (their
//!   own clocks, or the order in which concurrent rounds reach them, would not), so they hand
//!   the lock to the same waiter, the releaser asking again at once cannot take it first, and
//!   the waiters never all start a round at once (which split the nodes' votes round after
//!   round). Across processes the order follows their clocks: one running S behind moves its
//!   waiters S ahead. A waiter whose round falls short of a quorum anyway gives its nodes back
//!   without handing them on (another holds the majority, or the next release decides), and
//!   keeps its place.
//! - Nodes connect lazily: a node that is down does not stop the backend, and is used again when
//!   it returns.
//!
//! **The crash-recovery hazard.** A node that restarts without the keys it had (no persistence,
//! or `appendfsync everysec` losing the last second) can let a second client reach a majority
//! while the first still holds the lock. Mitigations: keep a restarted node out for longer than
//! the longest TTL (delayed restart), or run with `appendonly yes` and `appendfsync always`. The
//! tests show the hazard with real servers, and the delayed restart preventing it.
//!
//! # Cancellation and drop
//!
//! redis-rs does not send a request whose future is dropped before it goes out, so nothing that
//! must happen is left to a future the caller can drop: Redlock's give-backs and its release
//! requests (all of them, started at once in one spawned task rather than left to the caller's
//! future, for a process that exits right after its release) run in spawned tasks; `Lease` drops release in a spawned task (see
//! `leasehold_core::Lease`); an acquire dropped mid-flight is cleaned up by owner value.
//!
//! Connection trouble, timeouts and the server's "not now" answers (`BUSY`, `LOADING`,
//! `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `NOREPLICAS`) are `Unavailable` errors, which leasehold-core
//! retries: a release within its 5 s budget, then in the background until the key's TTL has
//! passed (it is gone by then). The server refusing the user (`NOPERM` from an ACL, `NOAUTH`,
//! a wrong password) is an `InvalidConfig` error. Other server errors are `Backend` errors;
//! neither is retried.
//!
//! An ACL user that may not subscribe to the wake-up channels (Redis 7 gives new users no
//! channel unless `acl-pubsub-default allchannels` is set) still waits: its waiters poll with
//! the backoff instead of being woken by releases, and a warning (target
//! `leasehold.redis.wake`) names the channel. Grant the user the prefix's channels
//! (`&<prefix>*`) as well as its keys (`~<prefix>*`).
//!
//! A server at its `maxmemory` that may not evict (policy `noeviction`, the default) refuses
//! what could grow its memory: an acquisition fails with a `Backend` error carrying the
//! server's `OOM command not allowed` (not retried: memory comes back only when keys go). Held
//! leases keep renewing and releases go through, in the same calls as otherwise: their scripts
//! only re-arm or delete keys (the Redis Cluster batch script is flagged `allow-oom` for this).
//! `tests/server_settings.rs` checks both, on one server and on a cluster.

mod config;
mod election;
mod error;
mod eviction;
mod fence;
mod keys;
mod node;
mod options;
mod quorum;
mod redlock;
mod release;
mod renew;
mod replica;
mod round;
mod scripts;
pub mod semaphore;
mod sentinel;
mod single;
mod wake;

use leasehold_core::Error;
use leasehold_core::driver::{Driver, Opening, Target, connecting, ready};

pub use config::{
    DEFAULT_REPLICA_SYNC_TIMEOUT, REDLOCK_SCHEMES, RedisConfig, RedlockConfig, SCHEMES,
};
pub use keys::DEFAULT_PREFIX;
pub use redlock::RedlockBackend;
pub use single::RedisBackend;

/// The driver's entry for a registry (the `leasehold` facade's): opens every scheme of
/// [`SCHEMES`], and a list of `redis://` nodes as Redlock.
pub static DRIVER: Driver = Driver::new(config::REDIS, SCHEMES, open);

fn open(target: &Target<'_>) -> Result<Opening, Error> {
    let redlock = target
        .scheme()
        .is_some_and(|s| REDLOCK_SCHEMES.contains(&s));
    if redlock || !target.nodes.is_empty() {
        let config = if target.nodes.is_empty() {
            RedlockConfig::from_url(target.url)?
        } else {
            RedlockConfig::from_nodes(target.nodes)?
        };
        let config = target.prefixed(config, |c, p| c.with_prefix(p))?;
        // Redlock nodes connect lazily: nothing to wait for.
        return Ok(ready(RedlockBackend::new(config.with_drift(target.drift))?));
    }
    let config = target.prefixed(RedisConfig::from_url(target.url)?, |c, p| c.with_prefix(p))?;
    Ok(connecting(RedisBackend::connect(config)))
}

#[doc(hidden)]
pub mod fuzzing {
    //! Internal entry points for the fuzz targets in `fuzz/`; not part of the API.

    use leasehold_core::{FencingToken, LockKey};
    use redis::Value;

    /// The Redis names of a lock under `prefix`: the lock, its fence counter, its wake-up
    /// channels' common part, its fair queue, its fair waiters and its wait list.
    pub fn names(prefix: &str, key: &LockKey) -> [String; 6] {
        let n = crate::keys::Names::new(prefix, key);
        [
            n.lock().to_owned(),
            n.fence().to_string(),
            n.channel().to_string(),
            n.queue().to_string(),
            n.waiters().to_string(),
            n.wait_list().to_string(),
        ]
    }

    /// Decodes the RESP bytes `resp` as every reply the driver reads from a server (script
    /// answers, `inspect`'s pipeline, `CLUSTER SLOTS`); `false` if they are not one RESP value.
    pub fn replies(resp: &[u8]) -> bool {
        let Ok(v) = redis::parse_redis_value(resp) else {
            return false;
        };
        let token = redis::from_redis_value_ref::<Option<u64>>(&v);
        let _ = token.map(|t| t.map(FencingToken::new));
        let _ = redis::from_redis_value_ref::<i64>(&v).map(|n| n == 1);
        if let Ok(extended) = redis::from_redis_value_ref::<Vec<u8>>(&v) {
            let _ = crate::node::extend_answers(&extended, extended.len());
        }
        // The pipelined `SET NX` + `INCR` of a fenced acquire.
        let _ = redis::from_redis_value_ref::<(Option<Value>, u64)>(&v);
        let inspect = redis::from_redis_value_ref::<(Option<String>, i64, Option<u64>)>(&v);
        let _ = inspect.map(|(_, pttl, _)| crate::node::remaining(pttl));
        if let Ok(ranges) = redis::from_redis_value_ref::<Vec<Value>>(&v) {
            let _ = ranges
                .iter()
                .map(crate::node::slot_range)
                .collect::<Option<Vec<_>>>();
        }
        true
    }
}
