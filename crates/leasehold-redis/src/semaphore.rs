//! Semaphores on one Redis server or a Redis Cluster: [`RedisPermits`].
//!
//! # Key mapping
//!
//! A semaphore on `key` lives next to the lock of the same name, under the same hash tag (so
//! on a Redis Cluster every name of one semaphore is on one slot), with names no lock ever has:
//!
//! | name | type | content |
//! |---|---|---|
//! | `<prefix>{<key>}:sem` | sorted set | owner value → server time (ms since the epoch) at which that permit expires |
//! | `<prefix>{<key>}:sem:fence` | string | the permit token counter (`INCR`ed per grant) |
//! | `<prefix>{<key>}:sem:limit` | string | the limit the current holders agreed on |
//! | `<prefix>{<key>}:sem:released` | channel | a message per release (sharded on a cluster) |
//!
//! Every script reads the server's clock (`TIME`) and first drops the members whose expiry has
//! passed, so a crashed holder's permit comes back after its TTL without any client's clock.
//! The sorted set and the limit expire (`PEXPIREAT`) with the latest permit, so a semaphore
//! nobody uses leaves only its token counter behind, as a lock leaves its fence counter.
//!
//! By hand: `redis-cli ZRANGE 'leasehold:{jobs}:sem' 0 -1 WITHSCORES` lists holders and expiry
//! times (compare with `redis-cli TIME`); `GET 'leasehold:{jobs}:sem:limit'` shows the limit.
//!
//! # Limits
//!
//! The limit is stored with the first grant and checked by every acquisition while any permit
//! is live: a client asking another limit is refused ([`limit_mismatch`]). Once every permit
//! has been released or has expired, the next client may set a new one.
//!
//! # Guarantees
//!
//! As for locks: one server decides, so a failover or a restart without persistence can lose
//! the set and admit more than N holders; tokens are best effort (the counter goes back with
//! lost data). Waiters are woken by the release message, with jittered backoff as a fallback
//! (an expired permit sends no message). Unlike a lock's release, which wakes one waiter from
//! its wait list and publishes nothing when nobody waits, every permit release publishes on
//! the key's channel and wakes every waiter: a permit cycle runs a script on the server's
//! clock anyway, and its waiters announce nothing. Renewal re-arms each permit with one script
//! call (`extend_each`).

use std::sync::Arc;
use std::sync::LazyLock;
use std::time::Duration;

use leasehold_core::{
    Backoff, Capabilities, Error, ExtendRequest, FencingToken, Grant, Held, HolderInfo,
    LockBackend, LockKey, LockRequest, Owner, PermitBackend, PermitLimit, ReleaseGate, Validity,
    Waited, async_trait, semaphore::limit_mismatch,
};
use redis::Script;
use tokio::time::Instant;

use crate::keys::Names;
use crate::node::{Node, evalsha, names, ttl_ms};
use crate::scripts::NOW_MS;
use crate::wake::{Subscription, WakeHub, wait_on};

/// Lua: `wake(channel, owner, mode)` publishes `owner` on `channel`, on the sharded channel
/// when `mode` is `S` (Redis Cluster: the channel lives on the key's slot). Best effort
/// (`redis.pcall`): an ACL that refuses the channel must not fail the release around it, whose
/// writes are done by then; waiters that could not subscribe poll.
const WAKE_FN: &str = r"local function wake(channel, owner, mode)
  if mode == 'S' then
    redis.pcall('SPUBLISH', channel, owner)
  else
    redis.pcall('PUBLISH', channel, owner)
  end
end
";

/// The sweep of expired permits from `KEYS[1]`, after [`NOW_MS`].
const SWEEP: &str = r"redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
";

/// Re-arms the expiry of the set `KEYS[1]` and the limit `KEYS[2]` to the latest permit's.
const REARM_FN: &str = r"local function rearm()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', KEYS[1], last[2])
    redis.call('PEXPIREAT', KEYS[2], last[2])
  end
end
";

/// `KEYS[1]` holders, `KEYS[2]` limit, `KEYS[3]` token counter; `ARGV[1]` owner, `ARGV[2]` ttl
/// in ms, `ARGV[3]` limit. `{1, token}` when granted, `{0, 0}` when all permits are taken,
/// `{-1, stored}` when live permits were taken with another limit.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
{SWEEP}{REARM_FN}
local n = redis.call('ZCARD', KEYS[1])
local stored = redis.call('GET', KEYS[2])
if n > 0 and stored and stored ~= ARGV[3] then
  return {{-1, tonumber(stored)}}
end
if n >= tonumber(ARGV[3]) then
  return {{0, 0}}
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('SET', KEYS[2], ARGV[3])
rearm()
return {{1, redis.call('INCR', KEYS[3])}}
"
    ))
});

/// `KEYS[1]` holders, `KEYS[2]` limit; `ARGV[1]` owner, `ARGV[2]` ttl in ms. Re-arms our
/// permit if it is live: 1, else 0.
static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
{SWEEP}{REARM_FN}
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
rearm()
return 1
"
    ))
});

/// `KEYS[1]` holders, `KEYS[2]` wake-up channel; `ARGV[1]` owner, `ARGV[2]` `S` to publish on
/// the sharded channel. Removes our permit and wakes waiters: 1 if it was live, else 0.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
{SWEEP}{WAKE_FN}
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
wake(KEYS[2], ARGV[1], ARGV[2])
return 1
"
    ))
});

/// `KEYS[1]` holders. The live permits, oldest expiry first: owner, ms left, owner, ms left…
static HOLDERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{NOW_MS}
local out = {{}}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  out[i] = live[i]
  out[i + 1] = tostring(tonumber(live[i + 1]) - now)
end
return out
"
    ))
});

/// Single-node Redis's (and Redis Cluster's) permit view: see the [module docs](self).
#[derive(Clone)]
pub struct RedisPermits {
    node: Arc<Node>,
    wake: Arc<WakeHub>,
    /// The lock backend's: its permits' releases and its locks' share the bound.
    releases: Arc<ReleaseGate>,
    prefix: String,
    backoff: Backoff,
    limit: PermitLimit,
    caps: Capabilities,
}

impl std::fmt::Debug for RedisPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPermits")
            .field("node", &self.node)
            .field("prefix", &self.prefix)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl RedisPermits {
    pub(crate) fn new(
        (node, wake, releases): (&Arc<Node>, &Arc<WakeHub>, &Arc<ReleaseGate>),
        prefix: String,
        backoff: Backoff,
        limit: PermitLimit,
        caps: Capabilities,
    ) -> Self {
        Self {
            node: Arc::clone(node),
            wake: Arc::clone(wake),
            releases: Arc::clone(releases),
            prefix,
            backoff,
            limit,
            caps: caps.without_primitives(),
        }
    }

    fn names(&self, key: &LockKey) -> Names {
        names(&self.prefix, key)
    }

    async fn attempt(&self, req: &LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let n = self.names(req.key);
        let mut cmd = evalsha(&ACQUIRE, 3, 3);
        cmd.arg(n.permits())
            .arg(n.permit_limit())
            .arg(n.permit_fence())
            .arg(req.owner.as_str())
            .arg(ttl_ms(req.ttl))
            .arg(self.limit.get());
        let (code, value): (i64, u64) = self.node.eval(&ACQUIRE, &cmd, "acquire permit").await?;
        match code {
            1 => Ok(Some(
                Grant::new(req.ttl_validity()).with_fencing(FencingToken::new(value)),
            )),
            0 => Ok(None),
            _ => Err(limit_mismatch(
                self.caps.name,
                req.key,
                u32::try_from(value).unwrap_or(u32::MAX),
                self.limit.get(),
            )),
        }
    }

    async fn live(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        let n = self.names(key);
        let mut cmd = evalsha(&HOLDERS, 1, 0);
        cmd.arg(n.permits());
        let flat: Vec<String> = self.node.eval(&HOLDERS, &cmd, "holders").await?;
        Ok(flat
            .chunks_exact(2)
            .map(|pair| {
                let left = pair[1].parse::<u64>().unwrap_or(0);
                HolderInfo::unknown()
                    .with_owner(Owner::from_raw(pair[0].clone()))
                    .with_remaining(Duration::from_millis(left))
            })
            .collect())
    }
}

#[async_trait]
impl LockBackend for RedisPermits {
    leasehold_core::refuse_primitives!("a permit view is already a semaphore");

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.attempt(&req).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let channel = self.names(req.key).permit_channel().to_string();
        let sub = Subscription::new(&self.node, &self.wake, &channel).await?;
        let pause = |attempts| self.backoff.delay(attempts);
        wait_on(std::slice::from_ref(&sub), deadline, pause, |started| {
            let attempt = LockRequest::new(req.key, req.owner, req.ttl, started, req.monitor);
            async move { self.attempt(&attempt).await }
        })
        .await
    }

    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        let n = self.names(held.key);
        let mut cmd = evalsha(&RELEASE, 2, 2);
        cmd.arg(n.permits())
            .arg(n.permit_channel())
            .arg(held.owner.as_str())
            .arg(if self.node.is_cluster() { "S" } else { "" });
        let n: i64 = self.node.eval(&RELEASE, &cmd, "release permit").await?;
        Ok(n == 1)
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        let n = self.names(req.held.key);
        let mut cmd = evalsha(&EXTEND, 2, 2);
        cmd.arg(n.permits())
            .arg(n.permit_limit())
            .arg(req.held.owner.as_str())
            .arg(ttl_ms(req.ttl));
        let n: i64 = self.node.eval(&EXTEND, &cmd, "extend permit").await?;
        Ok((n == 1).then(|| req.ttl_validity()))
    }

    /// One script call per permit.
    async fn extend_many(&self, reqs: &[ExtendRequest<'_>]) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Ok(self.live(key).await?.into_iter().next())
    }
}

#[async_trait]
impl PermitBackend for RedisPermits {
    fn limit(&self) -> PermitLimit {
        self.limit
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        self.live(key).await
    }
}
