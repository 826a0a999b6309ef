//! `LockKey` and each driver's key mapping: validation, round trips where a mapping is
//! reversible, and injectivity (two different keys never share a server name), checked on
//! pairs of keys.
#![no_main]

use arbitrary::Arbitrary;
use leasehold_core::{KeyError, LockKey, MAX_KEY_LEN};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    a: String,
    b: String,
    prefix: String,
    lease: i64,
}

fuzz_target!(|input: Input| {
    let (Some(a), Some(b)) = (key(&input.a), key(&input.b)) else {
        return;
    };
    file(&a, &b);
    redis(&input.prefix, &a, &b);
    postgres(&input.prefix, &a, &b);
    etcd(&input.prefix, &a, &b, input.lease);
});

/// Validates `s` and checks the verdict against the rules.
fn key(s: &str) -> Option<LockKey> {
    let verdict = LockKey::new(s);
    let expected = if s.is_empty() {
        Err(KeyError::Empty)
    } else if s.len() > MAX_KEY_LEN {
        Err(KeyError::TooLong {
            len: s.len(),
            max: MAX_KEY_LEN,
        })
    } else if let Some(offset) = s.bytes().position(|b| b == 0) {
        Err(KeyError::ContainsNul { offset })
    } else {
        Ok(())
    };
    assert_eq!(verdict.clone().map(|_| ()), expected, "{s:?}");
    let key = verdict.ok()?;
    assert_eq!(key.as_str(), s);
    Some(key)
}

/// File names: safe, bounded, reversible unless hashed, and distinct per key.
fn file(a: &LockKey, b: &LockKey) {
    let name = |k: &LockKey| {
        let n = leasehold_file::fuzzing::file_name(k);
        assert!(!n.is_empty() && n.len() <= 200, "{k:?} -> {n:?}");
        assert!(!n.starts_with('.'), "{k:?} -> hidden file {n:?}");
        let safe = |c: char| c.is_ascii_alphanumeric() || "._-%~".contains(c);
        assert!(n.chars().all(safe), "{k:?} -> {n:?}");
        if !n.contains('~') {
            let back = percent_encoding::percent_decode_str(&n).decode_utf8();
            assert_eq!(back.as_deref().ok(), Some(k.as_str()), "{n:?}");
        }
        n
    };
    let (na, nb) = (name(a), name(b));
    if a != b {
        let files = |n: &str| [format!("{n}.lock"), format!("{n}.fence")];
        for fa in files(&na) {
            for fb in files(&nb) {
                assert_ne!(fa, fb, "{a:?} and {b:?} share a file");
            }
        }
    }
}

/// Redis names: one hash slot per lock, and no name shared by two keys.
fn redis(prefix: &str, a: &LockKey, b: &LockKey) {
    // The drivers refuse a prefix with braces: it would move the hash tag.
    if prefix.contains(['{', '}']) {
        return;
    }
    let names = |k: &LockKey| {
        let n = leasehold_redis::fuzzing::names(prefix, k);
        let tag = hash_tag(&n[0]);
        for other in &n[1..] {
            assert_eq!(
                hash_tag(other),
                tag,
                "{k:?}: {:?} and {other:?} hash apart",
                n[0]
            );
        }
        n
    };
    let (na, nb) = (names(a), names(b));
    if a != b {
        for x in &na {
            assert!(
                !nb.contains(x),
                "{a:?} and {b:?} share the Redis name {x:?}"
            );
        }
    }
}

/// What Redis Cluster hashes of `key`: the text between the first `{` and the first `}` after
/// it if that is not empty, else the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{')
        && let Some(len) = key[open + 1..].find('}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// PostgreSQL: `advisory:<n>` is the number itself (and back); other keys hash with the
/// prefix; two different keys of one kind never share an id.
fn postgres(prefix: &str, a: &LockKey, b: &LockKey) {
    let explicit = |k: &LockKey| {
        let n = k
            .as_str()
            .strip_prefix(leasehold_postgres::NUMERIC_KEY_PREFIX)?;
        let id: i64 = n.parse().ok()?;
        (id.to_string() == n).then_some(id)
    };
    let id = |k: &LockKey| {
        let id = leasehold_postgres::fuzzing::lock_id(prefix, true, k);
        match explicit(k) {
            Some(n) => {
                assert_eq!(id, n, "{k:?}");
                assert_eq!(&leasehold_postgres::numeric_key(n), k);
            }
            None => assert_eq!(
                id,
                leasehold_postgres::advisory_key(&format!("{prefix}{}", k.as_str())),
                "{k:?}"
            ),
        }
        let (hi, lo) = leasehold_postgres::pg_locks_ids(id);
        assert_eq!((u64::from(hi) << 32 | u64::from(lo)) as i64, id);
        id
    };
    let (ia, ib) = (id(a), id(b));
    if a != b && explicit(a).is_some() == explicit(b).is_some() {
        assert_ne!(ia, ib, "{a:?} and {b:?} share the advisory lock {ia}");
    }
}

/// etcd: each lock is a key prefix `<prefix><escaped key>/`; different keys have different
/// prefixes, and a waiter's key lies under its own lock's prefix only (lock names are
/// prefix-free).
fn etcd(prefix: &str, a: &LockKey, b: &LockKey, lease: i64) {
    let (pa, pb) = (
        leasehold_etcd::fuzzing::lock_prefix(prefix, a),
        leasehold_etcd::fuzzing::lock_prefix(prefix, b),
    );
    let waiter = leasehold_etcd::fuzzing::waiter_key(&pa, lease);
    assert!(waiter.starts_with(pa.as_bytes()));
    if a != b {
        assert_ne!(pa, pb, "{a:?} and {b:?} share the etcd prefix");
        assert!(
            !waiter.starts_with(pb.as_bytes()),
            "a waiter of {a:?} ({:?}) lies under {b:?}'s prefix {pb:?}",
            String::from_utf8_lossy(&waiter)
        );
    }
}
