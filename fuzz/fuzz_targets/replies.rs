//! The replies a driver parses from a server, which may be hostile or broken: Redis replies
//! (script answers, `inspect`'s pipeline, `CLUSTER SLOTS`) as RESP bytes, and the values
//! PostgreSQL's fence sequence returns. Nothing may panic.
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
    }
});
