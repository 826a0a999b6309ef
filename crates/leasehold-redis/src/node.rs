//! One Redis server: a lazily connected, auto-reconnecting, multiplexed connection and the
//! single-instance lock primitive that both backends build on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt as _;
use leasehold_core::{Error, ErrorKind, FencingToken, LockKey, Owner};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, Script, Value};
use tokio::sync::OnceCell;

use crate::error::redis_error;
use crate::eviction;
use crate::fence::FenceExpiry;
use crate::keys::Names;
use crate::scripts::{
    ACQUIRE_FAIR, ACQUIRE_FENCED, ACQUIRE_OR_WAIT, EXTEND_MANY, EXTEND_MANY_CROSS_SLOT, holder,
};
use crate::sentinel::{SentinelConn, SentinelConnector};

/// What one `SET NX` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// We hold it now (with the fencing token, when asked for one).
    Granted(Option<FencingToken>),
    /// Someone else holds it.
    Held,
}

/// How to reach a Redis deployment: one server, or a Redis Cluster through its seed nodes.
pub(crate) enum Connector {
    /// One server, through an auto-reconnecting connection manager.
    Single(Client, ConnectionManagerConfig),
    /// A Redis Cluster; redis-rs routes each command to the master of its slot.
    Cluster(ClusterClient),
    /// The master Redis Sentinel names, found again after a failover.
    Sentinel(Arc<SentinelConnector>),
}

/// The shared, multiplexed connection of a [`Node`].
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Sentinel(c) => c.get_db(),
        }
    }
}

/// A Redis deployment (one server or one cluster) and our connection to it.
pub(crate) struct Node {
    connector: Connector,
    /// `host:port` (or the socket path, or the seed list), never with credentials.
    pub(crate) name: String,
    conn: OnceCell<Conn>,
    /// A first connect was tried and failed (or did not finish within its bound): from then
    /// on a request's own bound covers connecting again (see
    /// [`first_connect`](Self::first_connect)).
    first_failed: AtomicBool,
    backend: &'static str,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish()
    }
}

impl Node {
    pub(crate) fn new(backend: &'static str, connector: Connector, name: String) -> Arc<Self> {
        Arc::new(Self {
            connector,
            name,
            conn: OnceCell::new(),
            first_failed: AtomicBool::new(false),
            backend,
        })
    }

    /// The backend's name, for errors.
    pub(crate) fn backend(&self) -> &'static str {
        self.backend
    }

    /// Whether this is a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.connector, Connector::Cluster(_))
    }

    /// The shared connection, connecting on first use (and again after a failed first connect);
    /// once made, it reconnects by itself.
    pub(crate) async fn conn(&self) -> Result<Conn, Error> {
        // The connected case without the connect's state machine (over 3 KiB) in this future,
        // and so in every request's future that awaits it: those are moved (copied) into
        // their FuturesUnordered tasks, several per lock cycle.
        if let Some(c) = self.conn.get() {
            return Ok(c.clone());
        }
        self.connect().boxed().await
    }

    /// Waits, within `bound`, for the first connect to this node, unless it is made or one
    /// already failed. Redlock calls it before a request's per-node timer starts: that timer
    /// (milliseconds) bounds a request, and a new backend's first request would otherwise have
    /// to connect within it too (a fresh-clone test run saw 3 of 5 nodes time out that way).
    /// A node that never answered costs its first requests this bound once; after that, its
    /// requests' own timers cover the reconnects. A dropped wait (the round decided without
    /// this node) counts as not tried.
    pub(crate) async fn first_connect(&self, bound: Duration) {
        if self.conn.get().is_some() || self.first_failed.load(Ordering::Relaxed) {
            return;
        }
        // Boxed, as in `conn`: every Redlock request's future awaits this one, and would
        // otherwise carry the connect's state machine (over 3 KiB) even when connected.
        if !matches!(
            tokio::time::timeout(bound, self.connect().boxed()).await,
            Ok(Ok(_))
        ) {
            self.first_failed.store(true, Ordering::Relaxed);
        }
    }

    /// [`conn`](Self::conn)'s first connect (or a retry after a failed one).
    async fn connect(&self) -> Result<Conn, Error> {
        self.conn
            .get_or_try_init(|| async {
                let conn = match &self.connector {
                    Connector::Single(client, config) => {
                        ConnectionManager::new_with_config(client.clone(), config.clone())
                            .await
                            .map(Conn::Single)
                    }
                    Connector::Cluster(client) => {
                        client.get_async_connection().await.map(Conn::Cluster)
                    }
                    Connector::Sentinel(s) => s.connect().await.map(Conn::Sentinel),
                }?;
                // Once per node, beside the first requests rather than before them.
                tokio::spawn(eviction::check(conn.clone(), self.name.clone()));
                Ok(conn)
            })
            .await
            .cloned()
            .map_err(|e| self.error(&e, "connect"))
    }

    /// `SET lock owner NX PX ttl`, and with a `fence`, the next token of the fence counter: one
    /// round trip either way.
    ///
    /// On one server, with the counter kept for ever (the default), the fenced form is the two
    /// plain commands pipelined on the shared connection, the cheapest way to mint the token (a
    /// script or a `MULTI` / `EXEC` costs the server several times an `INCR`). The `INCR` runs
    /// whether or not the `SET` took the lock (tokens skip numbers, never go back). Tokens still
    /// follow the order of grants: another client's `SET` can come between ours and our `INCR`
    /// only once our key is gone, and our key can only be gone by expiring (only we know the
    /// owner value), so our answer then arrives more than the TTL after we sent the request:
    /// past the grant's validity, which the `Locker` never hands out. A Redis Cluster, and a
    /// counter with an expiry ([`FenceExpiry`]: it may have to start again at the server's
    /// clock), run [`ACQUIRE_FENCED`] (one script).
    pub(crate) async fn take(
        &self,
        names: &Names,
        owner: &Owner,
        ttl: Duration,
        fence: Option<FenceExpiry>,
    ) -> Result<Taken, Error> {
        let ms = ttl_ms(ttl);
        if let Some(fence) = fence
            && (self.is_cluster() || fence.0.is_some())
        {
            let mut cmd = evalsha(&ACQUIRE_FENCED, 2, 3);
            cmd.arg(names.lock())
                .arg(names.fence())
                .arg(owner.as_str())
                .arg(ms)
                .arg(fence.arg());
            let token: Option<u64> = self.eval(&ACQUIRE_FENCED, &cmd, "acquire").await?;
            return Ok(token.map_or(Taken::Held, |t| Taken::Granted(Some(FencingToken::new(t)))));
        }
        let set = take_call(names, owner, ttl);
        if fence.is_some() {
            let mut conn = self.conn().await?;
            let mut tx = redis::pipe();
            tx.add_command(set).cmd("INCR").arg(names.fence());
            let (taken, token): (Option<redis::Value>, u64) = tx
                .query_async(&mut conn)
                .await
                .map_err(|e| self.error(&e, "acquire"))?;
            return Ok(match taken {
                Some(redis::Value::Nil) | None => Taken::Held,
                Some(_) => Taken::Granted(Some(FencingToken::new(token))),
            });
        }
        self.run_take(&set).await
    }

    /// Runs a [`take_call`] (no token).
    pub(crate) async fn run_take(&self, call: &Cmd) -> Result<Taken, Error> {
        let mut conn = self.conn().await?;
        let taken: Option<redis::Value> = call
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(&e, "acquire"))?;
        Ok(match taken {
            Some(redis::Value::Nil) | None => Taken::Held,
            Some(_) => Taken::Granted(None),
        })
    }

    /// A waiting attempt in plain mode: `SET NX PX` (and with a `fence` the next token), or
    /// the claim of a lock a release handed us, or, when the lock is held, the waiter goes on
    /// the wait list for `announce`, in the order of its `ticket` (`None`: the server's time at
    /// its first announcement); a release hands the lock to the first waiter of that list, and
    /// publishes nothing when it is empty. One script: one round trip.
    pub(crate) async fn take_or_wait(
        &self,
        names: &Names,
        owner: &Owner,
        ttl: Duration,
        fence: Option<FenceExpiry>,
        announce: Duration,
        ticket: Option<u64>,
    ) -> Result<Taken, Error> {
        let mut cmd = evalsha(&ACQUIRE_OR_WAIT, 4, 5);
        cmd.arg(names.lock())
            .arg(names.fence())
            .arg(names.wait_list())
            .arg(names.waiters())
            .arg(owner.as_str())
            .arg(ttl_ms(ttl));
        match fence {
            Some(fence) => cmd.arg(fence.arg()),
            None => cmd.arg("-"),
        };
        cmd.arg(ttl_ms(announce));
        match ticket {
            Some(t) => cmd.arg(t),
            None => cmd.arg("-"),
        };
        let token: Option<u64> = self.eval(&ACQUIRE_OR_WAIT, &cmd, "acquire").await?;
        Ok(match token {
            None => Taken::Held,
            Some(t) if fence.is_some() => Taken::Granted(Some(FencingToken::new(t))),
            Some(_) => Taken::Granted(None),
        })
    }

    /// Fair mode: take the lock if it is free and nobody is ahead of us in line; with `enqueue`,
    /// otherwise join the line (or refresh our place) for `grace`.
    pub(crate) async fn take_fair(
        &self,
        names: &Names,
        owner: &Owner,
        ttl: Duration,
        enqueue: bool,
        grace: Duration,
        fence: FenceExpiry,
    ) -> Result<Taken, Error> {
        let mut cmd = evalsha(&ACQUIRE_FAIR, 4, 5);
        cmd.arg(names.lock())
            .arg(names.fence())
            .arg(names.queue())
            .arg(names.waiters())
            .arg(owner.as_str())
            .arg(ttl_ms(ttl))
            .arg(if enqueue { "1" } else { "0" })
            .arg(ttl_ms(grace))
            .arg(fence.arg());
        let token: Option<u64> = self.eval(&ACQUIRE_FAIR, &cmd, "acquire").await?;
        Ok(token.map_or(Taken::Held, |t| Taken::Granted(Some(FencingToken::new(t)))))
    }

    /// Compare-and-pexpire of one lock.
    pub(crate) async fn extend(
        &self,
        names: &Names,
        owner: &Owner,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let call = ExtendCall::new(&[(names.lock(), owner.as_str())], ttl, false);
        Ok(self.extend_many(&call).await?.first() == Some(&true))
    }

    /// Runs `call` (compare-and-pexpire of many locks in one script call): one answer per
    /// lock, in order.
    pub(crate) async fn extend_many(&self, call: &ExtendCall) -> Result<Vec<bool>, Error> {
        let answer: Vec<u8> = self.eval(call.script, &call.cmd, "extend").await?;
        extend_answers(&answer, call.locks).ok_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                self.backend,
                format!(
                    "extend on {}: an answer of {} bytes for {} locks",
                    self.name,
                    answer.len(),
                    call.locks
                ),
            )
        })
    }

    /// Redis Cluster: the slot ranges and the master (`host:port`) serving each, from
    /// `CLUSTER SLOTS`.
    pub(crate) async fn slot_masters(&self) -> Result<Vec<(u16, u16, String)>, Error> {
        let mut conn = self.conn().await?;
        let ranges: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(&e, "cluster slots"))?;
        ranges
            .iter()
            .map(slot_range)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    self.backend,
                    format!("cluster slots on {}: an answer of unknown shape", self.name),
                )
            })
    }

    /// The holder's owner value, remaining TTL and the lock's fence counter.
    pub(crate) async fn inspect(
        &self,
        names: &Names,
    ) -> Result<Option<(Owner, Option<Duration>, Option<u64>)>, Error> {
        let mut conn = self.conn().await?;
        let (owner, pttl, fence): (Option<String>, i64, Option<u64>) = redis::pipe()
            .get(names.lock())
            .pttl(names.lock())
            .get(names.fence())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.error(&e, "inspect"))?;
        Ok(owner.map(|o| (Owner::from_raw(holder(&o)), remaining(pttl), fence)))
    }

    /// Subscribes the shared connection to a wake-up channel (RESP3 push; sharded pub/sub on a
    /// cluster, so the channel lives on the lock's slot).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), Error> {
        let r = match self.conn().await? {
            Conn::Single(mut c) => c.subscribe(channel).await,
            Conn::Cluster(mut c) => c.ssubscribe(channel).await,
            Conn::Sentinel(c) => c.subscribe(channel).await,
        };
        r.map_err(|e| self.error(&e, "subscribe"))
    }

    /// Drops a subscription.
    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<(), Error> {
        let r = match self.conn().await? {
            Conn::Single(mut c) => c.unsubscribe(channel).await,
            Conn::Cluster(mut c) => c.sunsubscribe(channel).await,
            Conn::Sentinel(c) => c.unsubscribe(channel).await,
        };
        r.map_err(|e| self.error(&e, "unsubscribe"))
    }

    /// Counts the keys matching `pattern` (SCAN), for leak checks.
    pub(crate) async fn count_keys(&self, pattern: &str) -> Result<usize, Error> {
        let mut conn = self.conn().await?;
        let mut cursor: u64 = 0;
        let mut count = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.error(&e, "scan"))?;
            count += keys.len();
            if next == 0 {
                return Ok(count);
            }
            cursor = next;
        }
    }

    /// Runs a script command built by [`evalsha`] on the shared connection.
    pub(crate) async fn eval<T: FromRedisValue>(
        &self,
        script: &Script,
        cmd: &Cmd,
        op: &str,
    ) -> Result<T, Error> {
        let mut conn = self.conn().await?;
        run_script(&mut conn, script, cmd)
            .await
            .map_err(|e| self.error(&e, op))
    }

    pub(crate) fn error(&self, e: &RedisError, op: &str) -> Error {
        redis_error(self.backend, &self.name, e, op)
    }
}

/// One compare-and-pexpire script call over many locks, encoded once: sent as is to one
/// server, or to every Redlock node.
pub(crate) struct ExtendCall {
    script: &'static Script,
    cmd: Cmd,
    /// How many locks it re-arms.
    locks: usize,
}

impl ExtendCall {
    /// The call re-arming `locks` (lock name, owner value) for `ttl`. On a Redis Cluster the
    /// locks must share one slot, or with `cross_slot` one master (the call goes to the master
    /// of the first lock's slot).
    pub(crate) fn new(locks: &[(&str, &str)], ttl: Duration, cross_slot: bool) -> Self {
        let n = locks.len();
        let ms = ttl_ms(ttl);
        if cross_slot {
            let mut cmd = evalsha(&EXTEND_MANY_CROSS_SLOT, 1, 1 + 2 * n);
            if let Some((first, _)) = locks.first() {
                cmd.arg(*first);
            }
            cmd.arg(ms);
            for (name, owner) in locks {
                cmd.arg(*name).arg(*owner);
            }
            Self {
                script: &EXTEND_MANY_CROSS_SLOT,
                cmd,
                locks: n,
            }
        } else {
            let mut cmd = evalsha(&EXTEND_MANY, n, 1 + n);
            for (name, _) in locks {
                cmd.arg(*name);
            }
            cmd.arg(ms);
            for (_, owner) in locks {
                cmd.arg(*owner);
            }
            Self {
                script: &EXTEND_MANY,
                cmd,
                locks: n,
            }
        }
    }
}

/// An `EVALSHA` of `script` with `keys` keys to follow, with room for them and `args` arguments.
pub(crate) fn evalsha(script: &Script, keys: usize, args: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + 64 * (keys + args));
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}

/// The answers of an [`ExtendCall`] over `locks` locks, from its reply (one character per lock,
/// `1` if extended, `0` if not); `None` for a reply of another shape.
pub(crate) fn extend_answers(reply: &[u8], locks: usize) -> Option<Vec<bool>> {
    if reply.len() != locks || reply.iter().any(|b| !matches!(b, b'0' | b'1')) {
        return None;
    }
    Some(reply.iter().map(|&b| b == b'1').collect())
}

/// What a `PTTL` answer says is left of a lock's TTL (`None`: no TTL, or no key).
pub(crate) fn remaining(pttl: i64) -> Option<Duration> {
    u64::try_from(pttl).ok().map(Duration::from_millis)
}

/// One entry of a `CLUSTER SLOTS` answer: its first and last slot and its master's
/// `host:port`; `None` for an answer of another shape.
pub(crate) fn slot_range(v: &Value) -> Option<(u16, u16, String)> {
    let Value::Array(r) = v else { return None };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Some(Value::Array(master)) = r.get(2) else {
        return None;
    };
    let host: String = redis::from_redis_value_ref(master.first()?).ok()?;
    let port = int(master.get(1))?;
    Some((int(r.first())?, int(r.get(1))?, format!("{host}:{port}")))
}

/// Runs an `EVALSHA` built by [`evalsha`]; on `NOSCRIPT` (a restarted or flushed server) loads
/// the script and sends it once more. The same as redis-rs' `ScriptInvocation::invoke_async`,
/// without copying every key and argument into an invocation first and then into the command.
async fn run_script<T: FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    cmd: &Cmd,
) -> Result<T, RedisError> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            // Boxed: the rare path's state stays out of every script call's future.
            async {
                script.load_async(conn).await?;
                cmd.query_async(conn).await
            }
            .boxed()
            .await
        }
        other => other,
    }
}

/// A TTL in whole milliseconds, at least 1.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// `SET <lock> <owner> NX PX <ttl>`: [`Node::take`] without a token. Built once for a
/// Redlock round and sent to every node, as a [`ReleaseCall`](crate::release::ReleaseCall) is.
pub(crate) fn take_call(names: &Names, owner: &Owner, ttl: Duration) -> Cmd {
    let mut set = redis::cmd("SET");
    set.arg(names.lock())
        .arg(owner.as_str())
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms(ttl));
    set
}

/// The lock names of `key` under `prefix`.
pub(crate) fn names(prefix: &str, key: &LockKey) -> Names {
    Names::new(prefix, key)
}

/// Escapes glob metacharacters for SCAN MATCH.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The futures every request awaits stay small: a Redlock round moves each node's request
    /// into a task of its own (several per lock cycle), so a connect's state machine (over
    /// 3 KiB) carried unboxed in them was copied and allocated on every cycle, connected or not.
    #[test]
    fn request_futures_do_not_carry_the_connect() -> Result<(), RedisError> {
        let client = Client::open("redis://127.0.0.1:1")?;
        let node = Node::new(
            "test",
            Connector::Single(client, ConnectionManagerConfig::new()),
            "127.0.0.1:1".into(),
        );
        let first = node.first_connect(Duration::from_secs(1));
        assert!(size_of_val(&first) < 1024, "{} bytes", size_of_val(&first));
        let conn = node.conn();
        assert!(size_of_val(&conn) < 1024, "{} bytes", size_of_val(&conn));
        Ok(())
    }
}
