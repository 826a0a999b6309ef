//! Key mapping: lock names to PostgreSQL's 64-bit advisory-lock key space.

use hmac::{Hmac, KeyInit, Mac};
use leasehold_core::LockKey;
use sha2::Sha256;

/// The HKDF "info" string sqlx uses for `PgAdvisoryLock::new`; keeping it makes our keys equal
/// to sqlx's for the same name.
const SQLX_INFO: &[u8] = b"SQLx (Rust) Postgres advisory lock";

/// Keys of this form (`advisory:<i64 in canonical decimal>`) name an advisory-lock key directly,
/// where the configuration opts in (`advisory_keys=true`).
pub const NUMERIC_KEY_PREFIX: &str = "advisory:";

/// The advisory-lock key (`bigint`) for a lock name, exactly as sqlx's
/// `PgAdvisoryLock::new(name)` derives it, so a sqlx application and a leasehold application
/// taking the same name exclude each other.
///
/// The derivation is HKDF-SHA256 (RFC 5869) with no salt, the UTF-8 bytes of `name` as input
/// key material and the info string `SQLx (Rust) Postgres advisory lock`, expanded to 8 bytes
/// read as a little-endian `i64`. See the crate documentation for the same computation in SQL.
///
/// ```
/// // The example from sqlx's documentation.
/// assert_eq!(
///     leasehold_postgres::advisory_key("my first Postgres advisory lock!"),
///     -5560419505042474287
/// );
/// ```
pub fn advisory_key(name: &str) -> i64 {
    // HKDF-Extract without salt: HMAC keyed with HashLen zero bytes. HMAC pads any key shorter
    // than the block to the block size (64 bytes) with zeros, so a zeroed block is that key.
    let prk = hmac_sha256(&[0u8; 32], &[name.as_bytes()]);
    // HKDF-Expand to 8 bytes needs only the first block: T(1) = HMAC(PRK, info || 0x01).
    let t1 = hmac_sha256(&prk, &[SQLX_INFO, &[1u8]]);
    let mut le = [0u8; 8];
    le.copy_from_slice(&t1[..8]);
    i64::from_le_bytes(le)
}

/// HMAC-SHA256 with a key of at most one block (64 bytes), over the concatenated `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    let n = key.len().min(block.len());
    block[..n].copy_from_slice(&key[..n]);
    let mut mac = <Hmac<Sha256> as KeyInit>::new(&block.into());
    for part in parts {
        mac.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(&mac.finalize().into_bytes());
    out
}

/// The explicit key of a `LockKey` of the form `advisory:<i64>` (canonical decimal: no `+`,
/// no leading zeros, no `-0`), or `None`.
pub(crate) fn explicit_key(key: &LockKey) -> Option<i64> {
    let digits = key.as_str().strip_prefix(NUMERIC_KEY_PREFIX)?;
    let n: i64 = digits.parse().ok()?;
    (n.to_string() == digits).then_some(n)
}

/// A [`LockKey`] naming the advisory-lock key `id` directly (`advisory:<id>`), for locks shared
/// with code that uses a plain number: `pg_advisory_lock(id)`. Only a backend configured with
/// `advisory_keys=true` reads it as the number; otherwise it is a name hashed like any other.
///
/// ```
/// let key = leasehold_postgres::numeric_key(42);
/// assert_eq!(key.as_str(), "advisory:42");
/// ```
pub fn numeric_key(id: i64) -> LockKey {
    // "advisory:" plus at most 20 ASCII characters: non-empty, short, no NUL, always valid.
    match LockKey::new(format!("{NUMERIC_KEY_PREFIX}{id}")) {
        Ok(key) => key,
        Err(e) => unreachable!("a short ASCII key is always valid: {e}"),
    }
}

/// The first `int4` of every election's advisory key: `0x4C48454C`, "LHEL" in ASCII. No
/// semaphore takes it (see [`semaphore_key`]).
pub const ELECTION_SPACE: i32 = 0x4C48_454C;

/// An advisory-lock key, for locks, semaphores and elections alike, in one of PostgreSQL's two
/// key spaces, which never overlap: a `bigint` (`objsubid = 1` in `pg_locks`) or a pair of
/// `int4` (`objsubid = 2`). Each primitive has its own part:
///
/// - a **lock** takes the `bigint` of [`derive_id`](crate::backend::derive_id);
/// - an **election** takes `(ELECTION_SPACE, k)`, `k` the low 32 bits of [`advisory_key`] of
///   the prefixed name ([`AdvisoryId::election`]);
/// - permit `i` of a **semaphore** takes `(s, i)`, `s` = [`semaphore_key`] of the prefixed
///   name, which is never [`ELECTION_SPACE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AdvisoryId {
    /// `pg_advisory_lock(bigint)`.
    Big(i64),
    /// `pg_advisory_lock(int4, int4)`.
    Pair(i32, i32),
}

impl AdvisoryId {
    /// The advisory lock of the election `name` (prefix and key).
    pub(crate) fn election(name: &str) -> Self {
        // The low 32 bits, reinterpreted: any i32 is a valid second key.
        Self::Pair(ELECTION_SPACE, advisory_key(name) as i32)
    }

    /// `(classid, objid, objsubid)` as `pg_locks` shows the lock.
    pub(crate) fn pg_locks(self) -> (u32, u32, i16) {
        match self {
            Self::Big(id) => {
                let (classid, objid) = pg_locks_ids(id);
                (classid, objid, 1)
            }
            Self::Pair(a, b) => (a as u32, b as u32, 2),
        }
    }
}

impl std::fmt::Display for AdvisoryId {
    /// The arguments of `pg_advisory_lock(…)`, as SQL literals.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Big(id) => write!(f, "{id}"),
            Self::Pair(a, b) => write!(f, "{a}, {b}"),
        }
    }
}

/// The pair `(classid, objid)` under which `pg_locks` shows a `bigint` advisory lock (with
/// `objsubid = 1`): the high and the low 32 bits of the key.
pub fn pg_locks_ids(id: i64) -> (u32, u32) {
    let bits = id as u64;
    ((bits >> 32) as u32, (bits & 0xffff_ffff) as u32)
}

/// The first `int4` of the advisory keys of `name`'s semaphore slots: the high half of
/// [`advisory_key`] of `"semaphore:" + name`, except that [`ELECTION_SPACE`] (which belongs to
/// elections) becomes `ELECTION_SPACE + 1`. Two semaphores whose names share it share their
/// slots, which can only lower how many holders each admits, never raise it.
pub fn semaphore_key(name: &str) -> i32 {
    semaphore_space((advisory_key(&format!("semaphore:{name}")) >> 32) as i32)
}

/// A semaphore's first `int4` from its hash: anything but [`ELECTION_SPACE`].
fn semaphore_space(hash: i32) -> i32 {
    if hash == ELECTION_SPACE {
        ELECTION_SPACE + 1
    } else {
        hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_sqlx_documented_value() {
        assert_eq!(
            advisory_key("my first Postgres advisory lock!"),
            -5560419505042474287
        );
    }

    #[test]
    fn explicit_keys_are_canonical_decimal_only() {
        let k = |s: &str| LockKey::new(s).ok().and_then(|k| explicit_key(&k));
        assert_eq!(k("advisory:42"), Some(42));
        assert_eq!(k("advisory:-7"), Some(-7));
        assert_eq!(k("advisory:9223372036854775807"), Some(i64::MAX));
        assert_eq!(k("advisory:-9223372036854775808"), Some(i64::MIN));
        assert_eq!(k("advisory:042"), None);
        assert_eq!(k("advisory:+4"), None);
        assert_eq!(k("advisory:-0"), None);
        assert_eq!(k("advisory:9223372036854775808"), None);
        assert_eq!(k("advisory:x"), None);
        assert_eq!(k("42"), None);
        assert_eq!(numeric_key(-3).as_str(), "advisory:-3");
    }

    #[test]
    fn semaphores_never_take_the_election_space() {
        // The remap itself, on the one hash value that needs it.
        assert_ne!(semaphore_space(ELECTION_SPACE), ELECTION_SPACE);
        assert_eq!(semaphore_space(7), 7);
        assert_eq!(
            AdvisoryId::election("app/k"),
            AdvisoryId::Pair(ELECTION_SPACE, advisory_key("app/k") as i32)
        );
    }

    #[test]
    fn pg_locks_split() {
        assert_eq!(pg_locks_ids(1), (0, 1));
        assert_eq!(pg_locks_ids(-1), (u32::MAX, u32::MAX));
        assert_eq!(
            pg_locks_ids(0x1234_5678_9abc_def0),
            (0x1234_5678, 0x9abc_def0)
        );
    }
}
