//! How a [`LockKey`] maps to Redis keys (documented in the crate docs; stable).

use std::fmt;
use std::io::Write as _;

use leasehold_core::{Error, ErrorKind, LockKey, Owner};
use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

/// The default prefix of every Redis key leasehold writes.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// The Redis names of one lock: `<prefix>{<key>}`, `<prefix>{<key>}:fence` and the wake-up
/// channel `<prefix>{<key>}:released`. The braces make them one hash tag, so on a Redis Cluster
/// all three live on one slot.
///
/// A key beginning with `}` would make that tag empty (`<prefix>{}…`), and Redis Cluster hashes
/// a name with an empty tag whole: the lock and its fence counter would land on different
/// slots (`CROSSSLOT`). Such a key is named `<prefix>~{~}<key>}` instead: the tag is `~`, and
/// no other key's name starts with `<prefix>~`, so the mapping stays one-to-one. Every other
/// key (braces inside it included: the tag then ends at its first `}`, never empty) keeps the
/// plain form.
///
/// Only the lock name is stored; the others are written straight into a command's buffer from
/// it ([`Derived`]), so naming a lock costs one allocation per request, not five.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    lock: String,
}

/// Suffixes of the derived names.
const FENCE: &str = ":fence";
const CHANNEL: &str = ":released";
const QUEUE: &str = ":queue";
const WAITERS: &str = ":waiters";
const WAIT_LIST: &str = ":waitlist";
/// Semaphores: the holders (a sorted set), their token counter, their limit, their wake-ups.
/// No semaphore suffix contains `}`, so no lock name (`<prefix>{<key>}` plus a lock suffix,
/// whatever braces the key holds) ever equals a semaphore name.
const PERMITS: &str = ":sem";
const PERMIT_FENCE: &str = ":sem:fence";
const PERMIT_LIMIT: &str = ":sem:limit";
const PERMIT_CHANNEL: &str = ":sem:released";
const ELECT: &str = ":elect";
const LEADER: &str = ":leader";
/// What follows the prefix instead of `{` for a key beginning with `}` (see [`Names`]).
const EMPTY_TAG: &str = "~{~}";

impl Names {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let mut lock =
            String::with_capacity(prefix.len() + key.as_str().len() + EMPTY_TAG.len() + 1);
        write_lock(&mut lock, prefix, key);
        Self { lock }
    }

    /// The names of election `key`: the leadership is a lock named `<prefix>{<key>}:elect`
    /// (`<prefix>~{~}<key>}:elect` for a key beginning with `}`, as for locks; its fence
    /// counter, channel and queues derive from that name as a lock's do), on the same hash slot
    /// as the lock of `key` and never one of its names.
    pub(crate) fn election(prefix: &str, key: &LockKey) -> Self {
        let mut names = Self::new(prefix, key);
        names.lock.push_str(ELECT);
        names
    }

    /// Elections: the leader's owner value and candidate value, `<owner>\n<value>`.
    pub(crate) fn leader(&self) -> Derived<'_> {
        self.derived(LEADER)
    }

    /// The lock: a string holding the owner value, with a TTL.
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }

    /// The fence counter (single node).
    pub(crate) fn fence(&self) -> Derived<'_> {
        self.derived(FENCE)
    }

    /// The wake-up channels' common part: a release publishes on `<channel>:<owner>`, the
    /// channel of the one waiter it wakes ([`Self::waiter_channel`]).
    pub(crate) fn channel(&self) -> Derived<'_> {
        self.derived(CHANNEL)
    }

    /// The wake-up channel of the waiter `owner`: `<prefix>{<key>}:released:<owner>`, on the
    /// lock's hash slot.
    pub(crate) fn waiter_channel(&self, owner: &Owner) -> String {
        format!("{}:{}", self.channel(), owner.as_str())
    }

    /// Fair mode: the list of queued owner values, in arrival order.
    pub(crate) fn queue(&self) -> Derived<'_> {
        self.derived(QUEUE)
    }

    /// Owner value → server time (ms) until which that waiter counts as alive (each attempt
    /// that finds the lock held moves it on), in either mode.
    pub(crate) fn waiters(&self) -> Derived<'_> {
        self.derived(WAITERS)
    }

    /// Plain mode: owner value → ticket, set by a waiting attempt that found the lock held
    /// and kept for the rest of its wait. A release hands the lock to the live waiter with the
    /// lowest ticket and takes it off; with the set empty or gone, a release publishes nothing.
    pub(crate) fn wait_list(&self) -> Derived<'_> {
        self.derived(WAIT_LIST)
    }

    /// Semaphore: owner value → server time (ms) at which that permit expires.
    pub(crate) fn permits(&self) -> Derived<'_> {
        self.derived(PERMITS)
    }

    /// Semaphore: the permit token counter.
    pub(crate) fn permit_fence(&self) -> Derived<'_> {
        self.derived(PERMIT_FENCE)
    }

    /// Semaphore: the limit its holders agreed on (expires with the last permit).
    pub(crate) fn permit_limit(&self) -> Derived<'_> {
        self.derived(PERMIT_LIMIT)
    }

    /// Semaphore: the wake-up channel its release script publishes on.
    pub(crate) fn permit_channel(&self) -> Derived<'_> {
        self.derived(PERMIT_CHANNEL)
    }

    fn derived(&self, suffix: &'static str) -> Derived<'_> {
        Derived {
            lock: &self.lock,
            suffix,
        }
    }
}

/// Appends the lock name of `key` under `prefix` to `out`.
fn write_lock(out: &mut String, prefix: &str, key: &LockKey) {
    let key = key.as_str();
    out.push_str(prefix);
    out.push_str(if key.starts_with('}') { EMPTY_TAG } else { "{" });
    out.push_str(key);
    out.push('}');
}

/// The lock names of many keys (a renewal batch's) in one buffer: one allocation for the
/// batch, not one per lease.
#[derive(Debug, Default)]
pub(crate) struct NameList {
    text: String,
    ends: Vec<usize>,
}

impl NameList {
    /// The lock names of `keys` under `prefix`, or with `election` their elections' names.
    pub(crate) fn new<'a>(
        prefix: &str,
        keys: impl ExactSizeIterator<Item = &'a LockKey>,
        election: bool,
    ) -> Self {
        let mut list = Self {
            text: String::with_capacity(keys.len() * (prefix.len() + 24)),
            ends: Vec::with_capacity(keys.len()),
        };
        for key in keys {
            write_lock(&mut list.text, prefix, key);
            if election {
                list.text.push_str(ELECT);
            }
            list.ends.push(list.text.len());
        }
        list
    }

    /// The name of the `i`-th key.
    pub(crate) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }

    /// How many names it holds.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

/// A name derived from a lock name (`<lock><suffix>`), written into a command without an
/// intermediate `String`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Derived<'a> {
    lock: &'a str,
    suffix: &'static str,
}

impl fmt::Display for Derived<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.lock)?;
        f.write_str(self.suffix)
    }
}

impl ToRedisArgs for Derived<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into a command's in-memory buffer cannot fail.
        let _ = arg.write_all(self.lock.as_bytes());
        let _ = arg.write_all(self.suffix.as_bytes());
    }
}

impl ToSingleRedisArg for Derived<'_> {}

/// Checks a prefix: braces would move the hash tag, so they are refused.
pub(crate) fn check_prefix(backend: &'static str, prefix: String) -> Result<String, Error> {
    if prefix.contains(['{', '}']) {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!("key prefix {prefix:?} must not contain braces: they would move the hash tag"),
        ));
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag() -> Result<(), leasehold_core::KeyError> {
        let n = Names::new("leasehold:", &LockKey::new("jobs/nightly")?);
        assert_eq!(n.lock(), "leasehold:{jobs/nightly}");
        assert_eq!(n.fence().to_string(), "leasehold:{jobs/nightly}:fence");
        assert_eq!(n.channel().to_string(), "leasehold:{jobs/nightly}:released");
        assert_eq!(n.queue().to_string(), "leasehold:{jobs/nightly}:queue");
        assert_eq!(n.waiters().to_string(), "leasehold:{jobs/nightly}:waiters");
        assert_eq!(
            n.wait_list().to_string(),
            "leasehold:{jobs/nightly}:waitlist"
        );
        assert_eq!(
            n.waiter_channel(&Owner::from_raw("0a1b")),
            "leasehold:{jobs/nightly}:released:0a1b"
        );
        // Written into a command, a derived name is one argument with the same bytes.
        let mut args: Vec<Vec<u8>> = Vec::new();
        n.fence().write_redis_args(&mut args);
        n.channel().write_redis_args(&mut args);
        assert_eq!(
            args,
            [
                b"leasehold:{jobs/nightly}:fence".to_vec(),
                b"leasehold:{jobs/nightly}:released".to_vec()
            ]
        );
        assert!(check_prefix("redis", "a{b".to_owned()).is_err());
        // A batch's list holds the same names.
        let keys = ["jobs/nightly", "}a", "a}b", "x"].map(|k| LockKey::new(k).unwrap());
        for election in [false, true] {
            let list = NameList::new("leasehold:", keys.iter(), election);
            assert_eq!(list.len(), keys.len());
            for (i, key) in keys.iter().enumerate() {
                let one = if election {
                    Names::election("leasehold:", key)
                } else {
                    Names::new("leasehold:", key)
                };
                assert_eq!(list.get(i), one.lock());
            }
        }
        Ok(())
    }

    /// Every name of a semaphore differs from every name of every lock and election, even of
    /// those whose keys hold braces and the semaphore suffixes.
    #[test]
    fn semaphore_names_never_collide_with_lock_names() -> Result<(), leasehold_core::KeyError> {
        let n = Names::new("p:", &LockKey::new("a")?);
        assert_eq!(n.permits().to_string(), "p:{a}:sem");
        let sem = |n: &Names| {
            [
                n.permits(),
                n.permit_fence(),
                n.permit_limit(),
                n.permit_channel(),
            ]
            .map(|d| d.to_string())
        };
        let lock = |n: &Names| {
            let mut v = vec![n.lock().to_owned()];
            v.extend(
                [
                    n.fence(),
                    n.channel(),
                    n.queue(),
                    n.waiters(),
                    n.wait_list(),
                ]
                .map(|d| d.to_string()),
            );
            v
        };
        let others = |k: &str| -> Result<Vec<String>, leasehold_core::KeyError> {
            let key = LockKey::new(k)?;
            let (e, mut v) = (Names::election("p:", &key), lock(&Names::new("p:", &key)));
            v.extend(lock(&e));
            v.push(e.leader().to_string());
            Ok(v)
        };
        let keys = [
            "a",
            "a}",
            "a}:sem",
            "a}:sem:fence",
            "a}:sem}",
            "a}:elect",
            "a}:elect:sem",
            "{a}",
            "a:sem",
            "}:sem",
        ];
        for k in keys {
            let kn = Names::new("p:", &LockKey::new(k)?);
            for j in keys {
                let names = others(j)?;
                for s in sem(&kn) {
                    assert!(!names.contains(&s), "{s} is also a name of lock {j:?}");
                }
            }
        }
        Ok(())
    }

    /// The hash tag as Redis Cluster reads it: between the first `{` and the first `}` after
    /// it, if not empty; else the whole name.
    fn hash_tag(name: &str) -> &str {
        if let Some(open) = name.find('{')
            && let Some(len) = name[open + 1..].find('}')
            && len > 0
        {
            return &name[open + 1..open + 1 + len];
        }
        name
    }

    #[test]
    fn brace_edge_cases_keep_one_tag_per_lock_and_stay_one_to_one() {
        let keys = [
            "}", "}}", "}a", "}a}", "a}", "a}b", "{", "{}", "{a}", "a{b}c", "}{", "~{~}", "~",
            "}:fence", ":fence", "}a:fence",
        ];
        let mut seen = std::collections::HashSet::new();
        for key in keys {
            let n = Names::new("p:", &LockKey::new(key).unwrap());
            let tag = hash_tag(n.lock());
            assert!(
                tag.len() < n.lock().len(),
                "{key:?}: no hash tag in {}",
                n.lock()
            );
            for derived in [
                n.fence(),
                n.channel(),
                n.queue(),
                n.waiters(),
                n.wait_list(),
            ] {
                let name = derived.to_string();
                assert_eq!(hash_tag(&name), tag, "{key:?}: {name} vs {}", n.lock());
                assert!(seen.insert(name), "{key:?}: a name is shared");
            }
            assert!(
                seen.insert(n.lock().to_owned()),
                "{key:?}: {} is shared",
                n.lock()
            );
            // An election's names follow the same rule: on the lock's slot, never its names.
            let e = Names::election("p:", &LockKey::new(key).unwrap());
            assert_eq!(hash_tag(e.lock()), tag, "{key:?}: {}", e.lock());
            for derived in [
                e.fence(),
                e.channel(),
                e.queue(),
                e.waiters(),
                e.wait_list(),
                e.leader(),
            ] {
                let name = derived.to_string();
                assert_eq!(hash_tag(&name), tag, "{key:?}: {name} vs {}", e.lock());
                assert!(seen.insert(name), "{key:?}: a name is shared");
            }
            assert!(
                seen.insert(e.lock().to_owned()),
                "{key:?}: {} is shared",
                e.lock()
            );
            // A semaphore's names too.
            for derived in [
                n.permits(),
                n.permit_fence(),
                n.permit_limit(),
                n.permit_channel(),
            ] {
                let name = derived.to_string();
                assert_eq!(hash_tag(&name), tag, "{key:?}: {name} vs {}", n.lock());
                assert!(seen.insert(name), "{key:?}: a name is shared");
            }
        }
        assert_eq!(
            Names::new("p:", &LockKey::new("}a").unwrap()).lock(),
            "p:~{~}}a}"
        );
        assert_eq!(
            Names::new("p:", &LockKey::new("a}").unwrap()).lock(),
            "p:{a}}"
        );
    }
}
