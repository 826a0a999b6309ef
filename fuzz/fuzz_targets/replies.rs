//! The replies a driver parses from a server, which may be hostile or broken: Redis replies
//! (script answers, `inspect`'s pipeline, `CLUSTER SLOTS`) as RESP bytes, the values
//! PostgreSQL's fence sequence returns, and the numbers in etcd's replies (create revisions,
//! granted lease TTLs). Nothing may panic, and a value out of range is refused, not trusted.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    leasehold_redis::fuzzing::replies(data);
    for chunk in data.chunks_exact(8) {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(chunk);
        let value = i64::from_le_bytes(bytes);
        let token = leasehold_postgres::fuzzing::token(value);
        assert_eq!(token, u64::try_from(value).ok().filter(|t| *t > 0));
        // etcd: a revision is a token only from 1 to below i64::MAX (so that `+ 1` is safe);
        // a lease TTL only from 1 s to a day (so that instants computed from it stay in range).
        let revision = leasehold_etcd::fuzzing::token(value);
        assert_eq!(
            revision,
            u64::try_from(value)
                .ok()
                .filter(|t| *t > 0 && value < i64::MAX),
            "revision {value}"
        );
        if let Some(ttl) = leasehold_etcd::fuzzing::lease_ttl(value) {
            let secs = ttl.as_secs();
            assert!(
                (1..=86_400).contains(&secs) && secs == value as u64,
                "ttl {value}"
            );
        }
    }
});
