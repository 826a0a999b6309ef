//! The etcd names of leasehold's primitives, one namespace each under the configured prefix.
//!
//! A key is escaped before it goes into a name: `%` becomes `%25` and `/` becomes `%2F`,
//! nothing else changes. So an escaped key never contains `/`, and the ranges
//! `"{prefix}{escaped}/"` of two different keys never contain each other: lock `a` never sees
//! the holders of lock `a/b`. Keys without `%` and `/` map unchanged, which keeps `etcdctl lock`
//! interop for them. The semaphore and election namespaces start with `%sem/` and `%elect/`,
//! which no escaped key can produce (an escaped `%` is always followed by `25` or `2F`), so a
//! lock, a semaphore and an election on the same key never collide.

use std::borrow::Cow;

use leasehold_core::LockKey;
use percent_encoding::{AsciiSet, utf8_percent_encode};

/// What is escaped in a key: the escape character and the separator.
const ESCAPED: &AsciiSet = &AsciiSet::EMPTY.add(b'%').add(b'/');

/// `key` as it appears in etcd names.
pub(crate) fn escape(key: &LockKey) -> Cow<'_, str> {
    utf8_percent_encode(key.as_str(), ESCAPED).into()
}

/// The range of lock `key`'s contenders: `"{prefix}{escaped key}/"` (the crate docs' key
/// mapping says how a key is escaped).
pub fn lock_prefix(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}{}/", escape(key))
}

/// The range of semaphore `key`'s holders and waiters: `"{prefix}%sem/{escaped key}/"`.
pub fn semaphore_prefix(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}%sem/{}/", escape(key))
}

/// The etcd key of semaphore `key`'s stored limit: `"{prefix}%sem/{escaped key}"` (its range
/// without the final `/`, so inside no range of any primitive).
pub fn semaphore_limit_key(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}%sem/{}", escape(key))
}

/// The etcd election name of election `key` (its candidates live under the name and a `/`, as
/// etcd's election recipe and `etcdctl elect` lay them out): `"{prefix}%elect/{escaped key}"`.
pub fn election_name(prefix: &str, key: &LockKey) -> String {
    format!("{prefix}%elect/{}", escape(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> LockKey {
        LockKey::new(s).expect("valid key")
    }

    #[test]
    fn plain_keys_map_unchanged_and_separators_are_escaped() {
        assert_eq!(
            lock_prefix("leasehold/", &key("export")),
            "leasehold/export/"
        );
        assert_eq!(lock_prefix("leasehold/", &key("a/b")), "leasehold/a%2Fb/");
        assert_eq!(lock_prefix("p/", &key("50%/x")), "p/50%25%2Fx/");
        assert_eq!(semaphore_prefix("p/", &key("a/b")), "p/%sem/a%2Fb/");
        assert_eq!(semaphore_limit_key("p/", &key("a/b")), "p/%sem/a%2Fb");
        assert_eq!(election_name("p/", &key("a/b")), "p/%elect/a%2Fb");
    }

    #[test]
    fn no_name_contains_another_keys_range() {
        let keys = [
            "a", "a/b", "a/", "/a", "%sem", "%sem/a", "%elect", "a%2Fb", "%", "%25", "b",
        ];
        let mut ranges = Vec::new();
        for k in keys.iter().map(|k| key(k)) {
            ranges.push(lock_prefix("p/", &k));
            ranges.push(semaphore_prefix("p/", &k));
            ranges.push(format!("{}/", election_name("p/", &k)));
        }
        for (i, a) in ranges.iter().enumerate() {
            for (j, b) in ranges.iter().enumerate() {
                assert!(i == j || !b.starts_with(a.as_str()), "{a:?} contains {b:?}");
            }
        }
        // Each semaphore's limit key lies in no range at all (its own included).
        for k in keys.iter().map(|k| key(k)) {
            let limit = semaphore_limit_key("p/", &k);
            for r in &ranges {
                assert!(!limit.starts_with(r.as_str()), "{r:?} contains {limit:?}");
            }
        }
    }
}
