//! Elections on Redis (single node and Cluster): an *efficiency* election.
//!
//! The leadership is the lock mechanism itself under names of its own: the lock
//! `<prefix>{<key>}:elect` (with its fence counter `<prefix>{<key>}:elect:fence`, wake-up
//! channels, wait list and queues derived as a lock's), so it waits natively, renews,
//! expires and fences exactly as a lock does: a waiting candidate puts itself on the wait list
//! (`…:elect:waitlist`) and the leader's release wakes it on its own channel. The term is that fence counter: a **best-effort** token (it goes
//! back if the server loses its data). The leader's value lives beside it in
//! `<prefix>{<key>}:elect:leader` as `<owner>\n<value>`, written after the grant and removed
//! (compare-and-delete on the owner) on resignation; the leader is the lock's holder with the
//! value its owner wrote. All names share the hash tag `{<key>}`: one slot on a Cluster.
//! Observing polls every [`POLL`].

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Error, LeaderStore, LockKey, Owner, async_trait};

use crate::keys::Names;
use crate::node::Node;

/// How often an observer reads the leader.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Deletes the value if `ARGV[1]` wrote it.
const CLEAR: &str = "local v = redis.call('get', KEYS[1]) \
    if v and string.sub(v, 1, string.len(ARGV[1]) + 1) == ARGV[1] .. '\\n' then \
    return redis.call('del', KEYS[1]) end return 0";

/// Where the leader's value lives: `<prefix>{<key>}:elect:leader`.
#[derive(Clone)]
pub(crate) struct RedisLeaders {
    node: Arc<Node>,
    prefix: String,
}

impl std::fmt::Debug for RedisLeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLeaders")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLeaders {
    pub(crate) fn new(node: Arc<Node>, prefix: String) -> Self {
        Self { node, prefix }
    }

    fn name(&self, key: &LockKey) -> String {
        Names::election(&self.prefix, key).leader().to_string()
    }
}

#[async_trait]
impl LeaderStore for RedisLeaders {
    async fn publish(&self, key: &LockKey, owner: &Owner, value: &Candidate) -> Result<(), Error> {
        let mut conn = self.node.conn().await?;
        let stored = format!("{}\n{}", owner.as_str(), value.as_str());
        redis::cmd("SET")
            .arg(self.name(key))
            .arg(stored)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| self.node.error(&e, "publish the leader"))
    }

    async fn read(&self, key: &LockKey) -> Result<Option<(Owner, Candidate)>, Error> {
        let mut conn = self.node.conn().await?;
        let stored: Option<String> = redis::cmd("GET")
            .arg(self.name(key))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.node.error(&e, "read the leader"))?;
        let Some((owner, value)) = stored.as_deref().and_then(|s| s.split_once('\n')) else {
            return Ok(None);
        };
        Ok(Candidate::new(value)
            .ok()
            .map(|v| (Owner::from_raw(owner), v)))
    }

    async fn clear(&self, key: &LockKey, owner: &Owner) -> Result<(), Error> {
        let mut conn = self.node.conn().await?;
        redis::Script::new(CLEAR)
            .key(self.name(key))
            .arg(owner.as_str())
            .invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| self.node.error(&e, "clear the leader"))
    }
}
