//! The Lua scripts, shared by the single-node and Redlock backends. They run by SHA
//! (`EVALSHA`), and are loaded again on `NOSCRIPT` (see `node::run_script`).

use std::sync::LazyLock;

use redis::Script;

/// `KEYS[1]` lock, `KEYS[2]` fence counter; `ARGV[1]` owner, `ARGV[2]` ttl in ms, `ARGV[3]`
/// the fence counter's expiry in ms (`0`: kept for ever; see [`NEXT_TOKEN_FN`]).
/// Sets the lock if absent and returns the next fencing token; nil if the lock is held.
pub(crate) static ACQUIRE_FENCED: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NEXT_TOKEN_FN}
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return next_token(KEYS[2], ARGV[3])
end
return false
"
    ))
});

/// The next fencing token from a counter. Kept for ever (`ttl` `0`): `INCR`, from 1. With an
/// expiry (`RedisConfig::with_fence_ttl`), a missing counter first starts at the server's clock
/// in microseconds, so that a counter that expired and starts again still gives tokens above
/// every earlier one (one key cannot be taken a million times a second), then the expiry is
/// re-armed at every acquisition.
const NEXT_TOKEN_FN: &str = r"local function next_token(key, ttl)
  if ttl == '0' then
    return redis.call('INCR', key)
  end
  if redis.call('EXISTS', key) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local n = redis.call('INCR', key)
  redis.call('PEXPIRE', key, ttl)
  return n
end";

/// Fair mode, a waiting attempt. `KEYS[1]` lock, `KEYS[2]` fence counter, `KEYS[3]` queue
/// (list of owner values), `KEYS[4]` waiters (zset: owner value → server time in ms until which
/// the waiter counts as alive); `ARGV[1]` owner, `ARGV[2]` ttl in ms, `ARGV[3]` `1` to join
/// the queue, `ARGV[4]` how long (ms) a waiter stays in line without asking again, `ARGV[5]`
/// the fence counter's expiry (as in [`ACQUIRE_FENCED`]).
///
/// A lock that [`RELEASE`] handed to us (it holds our owner value, marked or not) is claimed:
/// re-armed for our TTL, with the next fencing token. Else drops waiters at the head of the
/// line that stopped asking; grants a free lock (and the next token) only if nobody is ahead
/// of us in line, marked (`~`) if others are behind; else, when asked, joins the line or
/// refreshes our place, and marks the holder's value ([`MARK_HOLDER`]). Time is the server's
/// (`TIME`), never a client clock. The uncontended path never runs this script: a try is a
/// plain `SET NX`, which cannot jump the line because a release hands the lock to the head
/// instead of freeing it.
pub(crate) static ACQUIRE_FAIR: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NEXT_TOKEN_FN}
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] or cur == ARGV[1] .. '~' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[1])
  return next_token(KEYS[2], ARGV[5])
end
{NOW_MS}
if not cur then
  while true do
    local head = redis.call('LINDEX', KEYS[3], 0)
    if not head then break end
    local alive = redis.call('ZSCORE', KEYS[4], head)
    if alive and tonumber(alive) > now then break end
    redis.call('LPOP', KEYS[3])
    redis.call('ZREM', KEYS[4], head)
  end
  local head = redis.call('LINDEX', KEYS[3], 0)
  if (not head) or head == ARGV[1] then
    if head then
      redis.call('LPOP', KEYS[3])
      redis.call('ZREM', KEYS[4], ARGV[1])
    end
    local value = ARGV[1]
    if redis.call('EXISTS', KEYS[3]) == 1 then
      value = value .. '~'
    end
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    return next_token(KEYS[2], ARGV[5])
  end
end
if ARGV[3] == '1' then
  local grace = tonumber(ARGV[4])
  if redis.call('ZADD', KEYS[4], now + grace, ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[3], grace * 2)
  redis.call('PEXPIRE', KEYS[4], grace * 2)
  {MARK_HOLDER}
end
return false
"
    ))
});

/// A waiting acquire (plain mode, single node and Redlock). `KEYS[1]` lock, `KEYS[2]` fence
/// counter, `KEYS[3]` wait list (zset: owner value → ticket, the order in which a release
/// hands the lock on), `KEYS[4]` waiters (zset: owner value → server time in ms until which the
/// waiter counts as alive); `ARGV[1]` owner, `ARGV[2]` ttl in ms, `ARGV[3]` `-` for no fencing
/// token, else the fence counter's expiry (as in [`ACQUIRE_FENCED`]), `ARGV[4]` how long (ms)
/// the waiter counts as alive without asking again, `ARGV[5]` the waiter's ticket (Redlock: the
/// same on every node, so that the nodes agree on the order), or `-` for the server's time.
///
/// Sets the lock if absent, or claims it if [`RELEASE`] handed it to us (it holds our owner
/// value: re-armed for our TTL), takes us off the wait list and returns the next fencing token
/// (0 unfenced), marked (`~`) if others still wait; else announces the waiter (puts it on the
/// wait list and marks the holder's value ([`MARK_HOLDER`]), in the same atomic step as the
/// failed attempt, so a release that follows always sees it) and returns nil. A waiter
/// keeps its ticket for its whole wait: one woken that lost the lock after all (a Redlock
/// round short of a quorum) goes back to its place, not to the end of the list.
pub(crate) static ACQUIRE_OR_WAIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{NEXT_TOKEN_FN}
local cur = false
local granted = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if not granted then
  cur = redis.call('GET', KEYS[1])
  granted = (cur == ARGV[1] or cur == ARGV[1] .. '~')
    and redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 1
end
if granted then
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('SET', KEYS[1], ARGV[1] .. '~', 'KEEPTTL')
  end
  if ARGV[3] == '-' then
    return 0
  end
  return next_token(KEYS[2], ARGV[3])
end
{NOW_MS}
local grace = tonumber(ARGV[4])
local ticket = now
if ARGV[5] ~= '-' then
  ticket = ARGV[5]
end
redis.call('ZADD', KEYS[3], 'NX', ticket, ARGV[1])
redis.call('ZADD', KEYS[4], now + grace, ARGV[1])
redis.call('PEXPIRE', KEYS[3], grace)
redis.call('PEXPIRE', KEYS[4], grace)
{MARK_HOLDER}
return false
"
    ))
});

/// `KEYS[1]` lock; `ARGV[1]` owner. A release's first call: deletes the lock if it holds our
/// owner value bare (nobody marked it: nobody waits), as a raw compare-and-delete does; 1 if
/// so, else 0, and then [`RELEASE`] follows (see the `release` module).
pub(crate) static RELEASE_FAST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
",
    )
});

/// `KEYS[1]` lock, `KEYS[2]` wake-up channels' common part, `KEYS[3]` and `KEYS[4]` the
/// waiters: in plain mode the wait list and the waiters' liveness that [`ACQUIRE_OR_WAIT`]
/// keeps, in fair mode the waiters' liveness and the fair queue; `ARGV[1]` owner, `ARGV[2]` `S`
/// to publish on the sharded channel (Redis Cluster: the channel lives on the lock's slot),
/// `ARGV[3]` `F` in fair mode (also leave the line, if queued: a cancelled waiter is cleaned up
/// by this release), or `K` for a Redlock waiter's give-back after a round short of a quorum
/// (plain mode: deletes the lock and hands it to nobody: the majority went to another, or a
/// split vote leaves every contender to the next release or its backoff, instead of a chain of
/// waiters woken one by one to find the lock held elsewhere), `ARGV[4]` how long (ms) a lock
/// handed to a waiter stays reserved for it (fair mode: the grace period).
///
/// It runs after [`RELEASE_FAST`] found the lock's value marked (`~`) or not ours: it checks
/// everything again, since the lock may have changed hands in between.
///
/// A release of a lock we do not hold is a waiter that gives up (or whose acquisition was
/// cancelled): it leaves the fair line or the wait list, so that no release hands it the lock
/// or spends its one wake-up on it; a holder is never on either (its grant took it off).
/// Except with `K`: that waiter goes on waiting and keeps its place (a round's give-back goes
/// to nodes that had not answered when the others decided; taking the waiter off their lists
/// could make the nodes' lists name different waiters, and hand the lock to different ones).
///
/// Only if the lock holds our owner value (bare, or marked), hands it to one waiter and wakes
/// that waiter alone: in fair mode the first in line still alive; in plain mode the first on
/// the wait list still alive (taken off the list; it goes back on, to its place, if it loses
/// the lock after all, as a Redlock waiter can). Handing means setting the lock to that
/// waiter's owner value (marked if others still wait) for `ARGV[4]`, in which the waiter claims
/// it ([`ACQUIRE_FAIR`], [`ACQUIRE_OR_WAIT`]) and nobody else can take it: not even the
/// releaser, asking again at once, jumps ahead of the waiter it woke. A waiter that does not
/// claim it in time (it died) leaves the lock to expire, and the others then come by their
/// backoff. With no waiter the lock is deleted and nothing is published. One waiter per
/// release: no herd of attempts, however many wait. 1 if it held our value, else 0.
///
/// The message is best effort (`redis.pcall`): an ACL that refuses the channel must not fail
/// a release whose hand-over is already written (a script's writes stay when it fails); the
/// waiter, which could not subscribe either, claims the lock at its next poll.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
local fair = ARGV[3] == 'F'
if fair then
  if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[4], 1, ARGV[1])
  end
end
if cur ~= ARGV[1] .. '~' then
  if not fair and ARGV[3] ~= 'K' then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  return 0
end
local woken = false
if fair and redis.call('EXISTS', KEYS[4]) == 1 then
  {NOW_MS}
  while true do
    local head = redis.call('LPOP', KEYS[4])
    if not head then break end
    local alive = redis.call('ZSCORE', KEYS[3], head)
    if alive and tonumber(alive) > now then
      local value = head
      if redis.call('EXISTS', KEYS[4]) == 1 then
        value = head .. '~'
      end
      redis.call('SET', KEYS[1], value, 'PX', ARGV[4])
      woken = head
      break
    end
    redis.call('ZREM', KEYS[3], head)
  end
end
if (not fair) and ARGV[3] ~= 'K' and redis.call('EXISTS', KEYS[3]) == 1 then
  {NOW_MS}
  while true do
    local head = redis.call('ZPOPMIN', KEYS[3])[1]
    if not head then break end
    local alive = redis.call('ZSCORE', KEYS[4], head)
    redis.call('ZREM', KEYS[4], head)
    if alive and tonumber(alive) > now then
      local value = head
      if redis.call('EXISTS', KEYS[3]) == 1 then
        value = head .. '~'
      end
      redis.call('SET', KEYS[1], value, 'PX', ARGV[4])
      woken = head
      break
    end
  end
end
if not woken then
  redis.call('DEL', KEYS[1])
end
if woken then
  local channel = KEYS[2] .. ':' .. woken
  if ARGV[2] == 'S' then
    redis.pcall('SPUBLISH', channel, woken)
  else
    redis.pcall('PUBLISH', channel, woken)
  end
end
return 1
"
    ))
});

/// Lua, after a waiter announced itself on a held lock: marks the holder's value (`cur`),
/// appending `~`, so that its release looks for waiters ([`RELEASE`]); a release that finds
/// its own value unmarked deletes the lock at once, without reading the wait list, as a bare
/// compare-and-delete does. Only a value of leasehold's form (an owner value: 40 lower-case
/// hex digits) is marked: the value of a holder by hand, compared and deleted by that holder,
/// is never changed.
const MARK_HOLDER: &str = r"if cur and #cur == 40 and not string.find(cur, '[^0-9a-f]') then
    redis.call('SET', KEYS[1], cur .. '~', 'KEEPTTL')
  end";

/// The holder's owner value in a lock's `value`: without the mark a waiter appends to an
/// owner value of leasehold's form (`~` after 40 lower-case hex digits; see [`MARK_HOLDER`]).
/// Any other value is a by-hand holder's, read as it is.
pub(crate) fn holder(value: &str) -> &str {
    match value.strip_suffix('~') {
        Some(owner)
            if owner.len() == 2 * leasehold_core::OWNER_BYTES
                && owner
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) =>
        {
            owner
        }
        _ => value,
    }
}

/// Lua: `local now`, the server's time in ms (`TIME`), never a client clock. Spliced into a
/// script as text rather than defined as a function: a local function costs a closure at
/// every call.
pub(crate) const NOW_MS: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)";

/// `KEYS[1..n]` locks; `ARGV[1]` the ttl in ms they are all re-armed for, then the owner of
/// lock `i` in `ARGV[i+1]`.
/// Re-arms each lock's TTL only if it exists and holds its owner value: a missing key is never
/// created, so an extend still in flight when the lease is released (Redlock sends both to
/// every node, in any order) cannot bring the lock back. Returns one string with a character
/// per lock, in order: `1` if extended, else `0` (one bulk string is far cheaper for the
/// client to read than an array of integers). The renewal engine sends many locks at once;
/// a single extend is the case n = 1.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{RENEW_FN}
for i, key in ipairs(KEYS) do
  out[i] = renew(key, ARGV[i + 1])
end
return table.concat(out)
"
    ))
});

/// Redis Cluster, Redis 7: [`EXTEND_MANY`] over locks of many slots served by one master,
/// flagged `allow-cross-slot-keys`. A cluster refuses declared keys of different slots, so
/// `KEYS[1]` is only the first lock (it routes the call to its master) and the locks come in
/// `ARGV`: `ARGV[1]` the ttl in ms as above, then for lock `i` its name `ARGV[2i]` and owner
/// `ARGV[2i+1]`. Same answer as [`EXTEND_MANY`].
///
/// Also flagged `allow-oom`: a script that declares flags is refused whole by a server at its
/// `maxmemory` unless it allows that, where [`EXTEND_MANY`] (no flags) runs, since `PEXPIRE`
/// never grows memory. Without it, every batch on a full cluster was refused (`OOM command not
/// allowed`) and fell back to one call per slot.
pub(crate) static EXTEND_MANY_CROSS_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "#!lua flags=allow-cross-slot-keys,allow-oom
{RENEW_FN}
for i = 1, (#ARGV - 1) / 2 do
  out[i] = renew(ARGV[2 * i], ARGV[2 * i + 1])
end
return table.concat(out)
"
    ))
});

/// The compare-and-pexpire of one lock for `ARGV[1]` ms, shared by the batch scripts.
const RENEW_FN: &str = r"local ttl = ARGV[1]
local function renew(key, owner)
  local cur = redis.call('GET', key)
  if cur == owner or (cur and cur == owner .. '~') then
    return redis.call('PEXPIRE', key, ttl)
  end
  return 0
end
local out = {}";

#[cfg(test)]
mod tests {
    use leasehold_core::{OWNER_BYTES, Owner};

    use super::*;

    /// The scripts mark only a value of an owner's length, and the mark read back names the
    /// owner; a by-hand holder's value reads back as it is, `~` or not.
    #[test]
    fn the_waiters_mark_fits_owner_values_only() {
        assert!(MARK_HOLDER.contains(&format!("#cur == {} ", 2 * OWNER_BYTES)));
        let owner = Owner::random().unwrap();
        assert_eq!(holder(&format!("{owner}~")), owner.as_str());
        assert_eq!(holder(owner.as_str()), owner.as_str());
        assert_eq!(holder("by-hand~"), "by-hand~");
        assert_eq!(holder("by-hand"), "by-hand");
        let upper = format!("{}~", owner.as_str().to_uppercase());
        assert_eq!(holder(&upper), upper);
    }
}
