//! The Lua scripts, shared by the single-node and Redlock backends. They run by SHA
//! (`EVALSHA`), and redis-rs reloads them on `NOSCRIPT`.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock, `KEYS[2]` fence counter; `ARGV[1]` owner, `ARGV[2]` ttl in ms.
/// Sets the lock if absent and returns the next fencing token; nil if the lock is held.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return false
",
    )
});

/// `KEYS[1]` lock, `KEYS[2]` wake-up channel; `ARGV[1]` owner, `ARGV[2]` `S` to publish on the
/// sharded channel (Redis Cluster: the channel lives on the lock's slot).
/// Deletes the lock only if it holds our owner value, then wakes waiters. 1 if deleted, else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] == 'S' then
    redis.call('SPUBLISH', KEYS[2], ARGV[1])
  else
    redis.call('PUBLISH', KEYS[2], ARGV[1])
  end
  return 1
end
return 0
",
    )
});

/// `KEYS[1]` lock; `ARGV[1]` owner, `ARGV[2]` ttl in ms, `ARGV[3]` `1` to set the key again
/// when it is missing (Redlock: a node that restarted empty).
/// Re-arms the TTL only if the lock holds our owner value. 1 if extended (or set again), else 0.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not v and ARGV[3] == '1' then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
  end
end
return 0
",
    )
});
