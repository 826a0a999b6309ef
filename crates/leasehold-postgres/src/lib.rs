//! PostgreSQL advisory locks as **leases with a durable fencing token**, for
//! [leasehold](leasehold_core).
//!
//! A PostgreSQL advisory lock belongs to a *session*: it is held until unlocked or until the
//! connection ends, it is re-entrant within the session (two tasks sharing one pooled
//! connection would both "get" it), and a holder whose connection died no longer holds
//! anything, without being told. [`PostgresBackend`] turns it into a safe lease:
//!
//! - **Its own sessions, shared by many locks, bounded.** Locks live on sessions the backend
//!   opens and owns, never on a connection an application pool hands out. One session
//!   carries any number of locks (a PostgreSQL session may hold any number of advisory
//!   locks), so a process holding thousands of leases uses a handful of server connections:
//!   at most `max_sessions` (default 10, [`DEFAULT_MAX_SESSIONS`]) per backend, whatever the
//!   number of leases; sessions that carry no lock and run nothing for `idle_timeout_ms`
//!   (60 s) are closed, so the pool shrinks back after a burst. Every session carries
//!   `application_name = leasehold` unless the connection string names another, so
//!   `pg_stat_activity` shows them. A statement goes to the open session with the fewest
//!   statements in flight (among equals, the one with the most locks, so locks gather and
//!   other sessions fall idle), and a new session is opened only when every open one is busy.
//! - **In-process gate.** PostgreSQL's advisory locks are re-entrant within a session, so two
//!   tasks of this process sharing a session would both "get" a key. A gate per key keeps
//!   one local holder (or attempt) per key and backend: local contenders queue in the process
//!   (first come, first served) and only the head of the queue talks to the server; the gate
//!   opens only once the holder's unlock is done (or its session is gone).
//! - **One round trip, with the token.** `try_acquire` is one prepared statement:
//!   `SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval($2::text::regclass) END`, the
//!   sequence's name (`"public"."leasehold_fence"`) bound as `$2`, never spliced into the SQL.
//!   The fencing token comes from a sequence (created with `CREATE SEQUENCE IF NOT EXISTS` on
//!   first use; schema and name are configurable): it strictly increases across every grant
//!   of every key, and survives server restarts (sequences never go back, even after a crash).
//! - **An application role that may not create.** Since PostgreSQL 15 only a schema's owner
//!   may create in `public` by default. What the driver stores (the fencing sequence, the
//!   tables `leasehold_semaphores` and `leasehold_leaders`, a fence store's table) is looked up
//!   before it is created, so such a role works once an administrator has made them (the
//!   driver makes them on its first use as the owner) and granted their use: `GRANT USAGE ON
//!   SEQUENCE public.leasehold_fence`, and `SELECT, INSERT, UPDATE, DELETE` on the tables.
//!   Missing, an object's error gives the statement that makes it.
//! - **Native, fair waiting.** `acquire` with a budget tries once on a shared session, then
//!   blocks in `pg_advisory_lock` (PostgreSQL's queue is fair) on a session **lent whole**
//!   from the same bound: one that carries no lock and runs nothing, or a new one if the pool
//!   is below `max_sessions`. A waiting session can run nothing else (statements on one
//!   connection run in order), which is why waits never share a session with held locks: an
//!   unlock or a health check behind a blocked wait would stall. The wait runs under a
//!   `lock_timeout` equal to the remaining budget, rounded up to whole milliseconds and never
//!   0 (which would mean "no timeout"), with `statement_timeout` off (a server, database or
//!   role default shorter than the budget would cut the wait short; PostgreSQL 13 or later).
//!   The `SET`s, the lock and the `RESET`s go in one simple-protocol message, which
//!   PostgreSQL runs as one implicit transaction: on timeout the transaction aborts and the
//!   `SET`s are rolled back, on success the `RESET`s run, so neither setting is left on the
//!   session. A statement that a `statement_timeout` or an operator cancels (SQLSTATE 57014)
//!   is an `Unavailable` error, retried like any transient fault. A grant and a lock timeout
//!   are exclusive on the server, so the race where the lock is granted just as the timeout
//!   fires has one answer.
//!   After a grant, a `nextval` round trip mints the token and starts the validity, and the
//!   session goes back to the pool, carrying the lock, for shared use. **When no session can
//!   be lent whole** (every one carries locks and the bound is reached), the acquisition
//!   polls instead: a try on a shared session, then a jittered pause (up to 4, 8, … 50 ms),
//!   looking for a free session again each round. Such a waiter is not in the server's queue,
//!   so it can be overtaken; PostgreSQL's fairness holds for waiters that got a session. Keep
//!   `max_sessions` above the number of concurrent waits you expect, plus one or two for the
//!   locks held.
//! - **A full pool.** If every session is lent whole to waits, a `try_acquire` fails at once
//!   with [`ErrorKind::Unavailable`](leasehold_core::ErrorKind::Unavailable) (retryable), and
//!   a waiting acquisition waits for a session within its budget, then fails `Unavailable`
//!   too (through a [`Locker`](leasehold_core::Locker) the budget ends in a `Timeout` whose
//!   source is that error). The backend never opens more than `max_sessions` connections, so
//!   it never meets the server's `too many clients` on its own account.
//! - **The server's lock table.** Advisory locks live in the server's shared lock table,
//!   which holds about `max_locks_per_transaction × (max_connections +
//!   max_prepared_transactions)` locks for the whole server (6,400 with the defaults 64 ×
//!   (100 + 0); the table has some slack, so somewhat more fit in practice; every session's
//!   locks count, not only ours). When it is full, PostgreSQL
//!   answers `out of shared memory` (SQLSTATE 53200) to every new lock on the server; the
//!   backend reports it as `Unavailable` (retryable). Raise `max_locks_per_transaction` on a
//!   server that must carry many locks (it takes a restart): one process holding 10,000 leases
//!   needs 10,000 entries for itself, so on a default install (100 connections) a value of at
//!   least 128 (12,800 entries) with room for every other session's locks. The test services
//!   run 128 × 200 connections (25,600), which the `fleet` benchmark's 10,000 leases fit.
//! - **Release checks its answer, and retries.** `pg_advisory_unlock` returns whether the
//!   session held the lock; `false` is reported as "not held". A release whose connection
//!   ended reports "not held" (the lock ended with the session). An unlock that fails while
//!   the connection is up is sent again, 4 times over some 70 ms; if it still fails,
//!   `release` returns `Unavailable` and the unlock goes on **in the background**, with
//!   backoff (up to 1 s apart), until it succeeds or the session ends; the key's gate stays
//!   closed until then, so no task of this process takes the key meanwhile.
//! - **Told when lost.** Each session has one health check, not one per lease: the moment its
//!   connection ends (`pg_terminate_backend`, server restart, a reset), and otherwise by a
//!   `SELECT 1` every `health_interval` (default 250 ms, only while the session carries a
//!   lock) that must answer within `health_timeout` (default 500 ms). A lease's validity is
//!   the start of its session's last successful check plus `health_interval +
//!   health_timeout` (the *validity window*, 750 ms by default). When a session is lost
//!   (connection ended, or a check failed or timed out), **every** lease on it is reported
//!   lost, each with the reason, and the session leaves the pool (closed, which ends any lock
//!   the server still has on it); leases on other sessions are untouched. TCP keepalives are
//!   on (15 s idle, 5 s interval, 3 probes) unless the connection string says otherwise.
//! - **TLS via rustls** (ring provider): `sslmode=require|verify-ca|verify-full` with
//!   `sslrootcert=<PEM file>` (else the system's roots). `verify-full` checks the chain and
//!   the host name (DNS name or IP address); cancel requests use the same TLS settings. See
//!   [`PostgresConfig`] for the exact semantics of each mode.
//!
//! Capabilities: [`SafetyClass::Correctness`](leasehold_core::SafetyClass::Correctness),
//! [`FencingKind::Monotonic`](leasehold_core::FencingKind::Monotonic),
//! [`WaitKind::Native`](leasehold_core::WaitKind::Native),
//! [`RenewalKind::Session`](leasehold_core::RenewalKind::Session). The TTL of a
//! [`Locker`](leasehold_core::Locker) does not shorten or lengthen a grant (it lasts as long
//! as its session); the shortest TTL accepted is the validity window, so that a lease's
//! deadline never lies beyond its TTL.
//!
//! ```no_run
//! # async fn demo() -> Result<(), leasehold_core::Error> {
//! use std::time::Duration;
//! use leasehold_core::Locker;
//! use leasehold_postgres::{PostgresBackend, PostgresConfig};
//!
//! let config = PostgresConfig::from_url("postgres://app:secret@127.0.0.1/app")?;
//! let backend = PostgresBackend::connect(config).await?;
//! let locker = Locker::new(backend);
//! let lease = locker.acquire("billing/export", Duration::from_secs(5)).await?;
//! let token = lease.fencing_token(); // send with every write; the resource rejects lower ones
//! lease.run(async { /* work */ }).await?; // cancelled if the lease is lost
//! lease.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! # What it does not guarantee
//!
//! - A lease can be lost while its holder runs: the server can end the session (restart,
//!   `pg_terminate_backend`, an `idle_session_timeout` shorter than `health_interval_ms`,
//!   whose checks otherwise keep a session carrying locks from being idle; a network failure)
//!   and grant the lock to someone else *before* the holder's next health check notices.
//!   Sessions that carry no lock may be ended while idle: the pool never hands out an ended
//!   one (`tests/server_timeouts.rs`). The lost signal fires within the validity window at
//!   worst (at once when the connection visibly ends), but a holder that writes in between is
//!   only stopped by a **fencing token checked by the resource**.
//! - Advisory locks are only advisory: code that doesn't ask for the lock is not stopped.
//! - Connection poolers in *transaction* mode (pgbouncer `pool_mode = transaction`) hand each
//!   transaction to any server session: **session mode through them is unsafe and not
//!   supported**. A session lock taken through such a pooler belongs to a pooled server
//!   connection, not to the client: it outlives the client that took it (the
//!   `session_lock_through_pgbouncer_outlives_its_client` test shows it), another client may
//!   later run on that server connection and "hold" it too, and the health check proves
//!   nothing about the lock's session. The backend does not detect poolers (pgbouncer is
//!   invisible to the protocol); pointing it at one is a configuration error. Connect the
//!   backend directly (or through session-mode pooling), or use the transaction mode,
//!   [`PostgresBackend::lock_xact`], which takes `pg_advisory_xact_lock` inside your own
//!   transaction (released at its commit or rollback) with a fencing token from the same
//!   transaction, and works through pgbouncer in transaction mode (tested).
//! - A network partition between holder and server: the holder is told it lost the lease when
//!   its health check times out, but the server keeps the session, and with it the lock, until
//!   a server setting ends it. TCP keep-alives alone are not enough: a probe is sent only while
//!   nothing is in flight, and the answer to the holder's last health check usually is (its
//!   ACK was cut), so the server retransmits it for about 15 minutes (`tcp_retries2`). Set
//!   `tcp_user_timeout` on the server together with `tcp_keepalives_*` (or
//!   `idle_session_timeout`, which a live holder's health checks never reach); without them the
//!   lock stays taken until the path heals (measured in the partition tests,
//!   `tests/partition.rs`). Fencing tokens protect the resource in between.
//! - `sslmode=require` encrypts but does **not** authenticate the server (any certificate is
//!   accepted): it stops passive eavesdroppers, not an active man in the middle. Use
//!   `verify-full` (with `sslrootcert=<CA file>` for a private CA) to know whom you talk to.
//!   `prefer` (the default) tries TLS first, as libpq does, and falls back to plaintext when
//!   the server refuses it (with a warning, or a refusal with `allow_plaintext_password=false`,
//!   when a password would then go in clear to a host that is not loopback); `disable` and
//!   `allow` do not use TLS. See *TLS* in [`PostgresConfig`].
//! - A crashed holder's locks end with its process: the kernel closes the connection and the
//!   server ends the session at once (`CrashRelease::ProcessExit` in the capabilities), whatever
//!   the TTL. A host that vanishes without closing its connections is noticed only as a
//!   partition is (above): by the server's `tcp_user_timeout` with `tcp_keepalives_*`, or
//!   `idle_session_timeout`.
//!
//! # Key mapping
//!
//! Every key maps to one `bigint` advisory-lock key:
//!
//! - Only where the configuration opts in (`advisory_keys=true` in the URL,
//!   [`PostgresConfig::with_advisory_keys`]), a key of the form `advisory:<n>`, `<n>` a
//!   canonical decimal `i64` (no `+`, no leading zeros, no `-0`), is the number `n` itself,
//!   and the prefix is not applied: for locks shared with `pg_advisory_lock(n)`. [`numeric_key`]
//!   builds such keys. Off (the default), `advisory:5` is a name like any other, hashed with
//!   the prefix below, so no key can step outside the configured prefix.
//! - Any other key `k` maps to [`advisory_key`]`(prefix + k)`, which is exactly what sqlx's
//!   `PgAdvisoryLock::new(prefix + k)` uses: HKDF-SHA256 (RFC 5869) without salt, input key
//!   material the UTF-8 bytes of the name, info `SQLx (Rust) Postgres advisory lock`, 8 bytes
//!   of output read as a little-endian `i64`. A sqlx application locking the same name
//!   excludes a leasehold application and vice versa (tested against sqlx 0.9's
//!   `PgAdvisoryLock` in both directions). The prefix is empty unless configured.
//!
//! [`PostgresBackend::lock_id`] gives the number for a key. `pg_locks` shows it as
//! `locktype = 'advisory'`, `classid` = the high 32 bits, `objid` = the low 32 bits,
//! `objsubid = 1` (see [`pg_locks_ids`]).
//!
//! ## Taking the same lock from psql
//!
//! With the number (e.g. from [`advisory_key`]): `SELECT pg_advisory_lock(-5560419505042474287);`
//! … `SELECT pg_advisory_unlock(-5560419505042474287);`. Or compute it in SQL from the name
//! (PostgreSQL 11 or later, no extension needed; HMAC-SHA256 written out with `sha256`):
//!
//! ```sql
//! CREATE FUNCTION leasehold_key(name text) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $$
//!   WITH prk AS (   -- HKDF-Extract: HMAC-SHA256 keyed with 32 zero bytes
//!     SELECT sha256(decode(repeat('5c', 64), 'hex')
//!                   || sha256(decode(repeat('36', 64), 'hex') || convert_to(name, 'UTF8'))) AS k
//!   ), pads AS (    -- PRK padded to the 64-byte block, XORed with ipad / opad
//!     SELECT decode(string_agg(lpad(to_hex(get_byte(k || decode(repeat('00', 32), 'hex'), i) # 54), 2, '0'), '' ORDER BY i), 'hex') AS ipad,
//!            decode(string_agg(lpad(to_hex(get_byte(k || decode(repeat('00', 32), 'hex'), i) # 92), 2, '0'), '' ORDER BY i), 'hex') AS opad
//!     FROM prk, generate_series(0, 63) AS i
//!   ), okm AS (     -- HKDF-Expand, first block: HMAC-SHA256(PRK, info || 0x01)
//!     SELECT sha256(opad || sha256(ipad || convert_to('SQLx (Rust) Postgres advisory lock', 'UTF8')
//!                                  || '\x01'::bytea)) AS t
//!     FROM pads
//!   )               -- first 8 bytes, little-endian, as a signed bigint
//!   SELECT ('x' || string_agg(encode(substring(t FROM i + 1 FOR 1), 'hex'), '' ORDER BY i DESC))::bit(64)::bigint
//!   FROM okm, generate_series(0, 7) AS i
//! $$;
//!
//! SELECT pg_advisory_lock(leasehold_key('billing/export'));   -- prefix included, if any
//! ```
//!
//! ([`KEY_SQL`] holds the body of that function, parameterised as `$1`.)
//!
//! # Cancellation and drop
//!
//! - **A dropped `try_acquire`** (or the try step of `acquire`): the statement may already be
//!   on its way. The backend queues `pg_advisory_unlock` behind it on the same session
//!   (statements on one connection run in order) in a background task, retried until it
//!   answers or the session ends; the key's gate stays closed until then. With no runtime
//!   left, the session is taken out of the pool instead, and closes (ending the lock) once
//!   its other locks are released.
//! - **A dropped waiting `acquire`**: a cancel request (`pg_cancel_backend` over the protocol,
//!   tokio-postgres' `CancelToken`) is sent for the blocked `pg_advisory_lock`, and the session
//!   lent to the wait is closed (it carries no other lock), so the cancel can never hit a
//!   later statement and a grant that won the race dies with the session. Even without a
//!   runtime (no cancel sent), the server stops waiting at the `lock_timeout` (the remaining
//!   budget) and then finds the connection gone.
//! - **Release on drop is not immediate**: dropping a [`Lease`](leasehold_core::Lease) spawns
//!   its release (see core); until it runs, the lock stays held. Dropping the release future
//!   mid-statement hands the unlock to the background, as a failed unlock is (see *Release*
//!   above).
//! - A lease stops being checked when it is released, dropped or lost; the session's check
//!   goes on while the session carries other locks.

mod backend;
mod config;
mod conninfo;
mod ddl;
mod election;
mod error;
mod fence;
mod gate;
mod grant;
mod key;
mod lock_impl;
mod permits;
mod pool;
mod probe;
mod session;
mod tls;
mod watch;
mod xact;

pub use backend::PostgresBackend;
pub use config::{
    DEFAULT_APPLICATION_NAME, DEFAULT_FENCE_SCHEMA, DEFAULT_FENCE_SEQUENCE,
    DEFAULT_HEALTH_INTERVAL, DEFAULT_HEALTH_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS,
    DEFAULT_PREFIX, PostgresConfig, SCHEMES,
};
pub use election::LEADERS_TABLE;
pub use fence::PostgresFenceStore;
pub use key::{
    ELECTION_SPACE, NUMERIC_KEY_PREFIX, advisory_key, numeric_key, pg_locks_ids, semaphore_key,
};
pub use permits::{PostgresPermits, SEMAPHORE_TABLE};

use leasehold_core::Error;
use leasehold_core::driver::{Driver, Opening, Target, connecting};

/// The backend's name in errors and leases.
pub(crate) const NAME: &str = "postgres";

/// A query computing [`advisory_key`]`($1)` on the server (PostgreSQL 11+, no extension):
/// the body of the `leasehold_key` function shown in the crate documentation.
pub const KEY_SQL: &str = "WITH prk AS ( \
     SELECT sha256(decode(repeat('5c', 64), 'hex') \
            || sha256(decode(repeat('36', 64), 'hex') || convert_to($1, 'UTF8'))) AS k \
   ), pads AS ( \
     SELECT decode(string_agg(lpad(to_hex(get_byte(k || decode(repeat('00', 32), 'hex'), i) # 54), 2, '0'), '' ORDER BY i), 'hex') AS ipad, \
            decode(string_agg(lpad(to_hex(get_byte(k || decode(repeat('00', 32), 'hex'), i) # 92), 2, '0'), '' ORDER BY i), 'hex') AS opad \
     FROM prk, generate_series(0, 63) AS i \
   ), okm AS ( \
     SELECT sha256(opad || sha256(ipad || convert_to('SQLx (Rust) Postgres advisory lock', 'UTF8') \
                                  || '\\x01'::bytea)) AS t \
     FROM pads \
   ) \
   SELECT ('x' || string_agg(encode(substring(t FROM i + 1 FOR 1), 'hex'), '' ORDER BY i DESC))::bit(64)::bigint \
   FROM okm, generate_series(0, 7) AS i";

/// The driver's entry for a registry (the `leasehold` facade's): opens [`SCHEMES`] (and
/// checks the URL with one session, as [`PostgresBackend::connect`] does).
pub static DRIVER: Driver = Driver::new(NAME, SCHEMES, open);

fn open(target: &Target<'_>) -> Result<Opening, Error> {
    let config = PostgresConfig::from_url(target.url)?;
    let config = target.prefixed(config, |c, p| c.with_prefix(p))?;
    Ok(connecting(PostgresBackend::connect(config)))
}

#[doc(hidden)]
pub mod fuzzing {
    //! Internal entry points for the fuzz targets in `fuzz/`; not part of the API.

    use leasehold_core::LockKey;

    /// The advisory-lock key of `key` under `prefix` (with `advisory:<n>` keys taken as
    /// written when `advisory_keys`), as
    /// [`PostgresBackend::lock_id`](crate::PostgresBackend::lock_id) derives it.
    pub fn lock_id(prefix: &str, advisory_keys: bool, key: &LockKey) -> i64 {
        crate::backend::derive_id(prefix, advisory_keys, key)
    }

    /// The fencing token of a value read from the fence sequence's row, if it is one.
    pub fn token(value: i64) -> Option<u64> {
        crate::backend::positive(value).ok().map(|t| t.get())
    }
}
