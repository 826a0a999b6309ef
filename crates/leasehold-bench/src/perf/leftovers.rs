//! What keys leave behind after their locks are released (issue: keys must come from a bounded
//! set): on Redis, the fence counter (`MEMORY USAGE`, and the server's `used_memory` growth per
//! key over many keys), kept for ever or expiring with `fence_ttl_ms`; on the file backend, the
//! `.lock` and `.fence` files (bytes and disk blocks), before and after `prune`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use leasehold_core::{LockOptions, Locker, Renewal};
use leasehold_file::{FileBackend, FileConfig};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::services::{self, Service};
use redis::aio::MultiplexedConnection;

use super::model::Params;
use crate::harness::{BoxError, runtime};
use crate::report::Table;

/// Keys of the "many keys" rows.
const MANY: usize = 1000;

/// Whether the table is wanted: with every group, or with `file` or `redis` chosen.
pub(crate) fn chosen(p: &Params) -> bool {
    p.groups.is_empty() || p.groups.iter().any(|g| g == "file" || g == "redis")
}

/// The table, as Markdown (measured on a runtime of its own); `Err` on a figure that
/// contradicts the documented behaviour (so `--quick` fails on it).
pub(crate) fn markdown(p: &Params, out: &Path) -> Result<String, BoxError> {
    let rt = runtime("multi-thread")?;
    let mut t = Table::new(
        "What keys leave behind after release",
        &["backend", "keys", "left", "items", "bytes", "disk"],
    );
    let many = if p.quick { 20 } else { MANY };
    let folder = out.join("leftovers-locks");
    rt.block_on(file_rows(&mut t, &folder, many))?;
    let _ = std::fs::remove_dir_all(&folder);
    rt.block_on(redis_rows(&mut t, many))?;
    t.note(
        "bytes: the files' contents (file) or the server's `MEMORY USAGE` of each key left, or \
         its `used_memory` growth divided by the keys (Redis); disk: allocated blocks."
            .into(),
    );
    Ok(t.markdown())
}

fn locker(backend: impl leasehold_core::LockBackend) -> Result<Locker, BoxError> {
    Ok(Locker::new(backend).with_options(LockOptions::default().with_renewal(Renewal::Off))?)
}

/// Takes and releases each of `n` keys `key-<i>`.
async fn cycle(l: &Locker, n: usize) -> Result<(), BoxError> {
    for i in 0..n {
        let lease = l
            .try_acquire(format!("key-{i}"))
            .await?
            .ok_or("the key was held")?;
        lease.release().await?;
    }
    Ok(())
}

/// Files in `dir`: (count, content bytes, allocated bytes).
fn files(dir: &Path) -> Result<(u64, u64, u64), BoxError> {
    let (mut n, mut bytes, mut disk) = (0, 0, 0);
    for entry in std::fs::read_dir(dir)? {
        let m = entry?.metadata()?;
        n += 1;
        bytes += m.len();
        disk += m.blocks() * 512;
    }
    Ok((n, bytes, disk))
}

async fn file_rows(t: &mut Table, folder: &Path, many: usize) -> Result<(), BoxError> {
    let _ = std::fs::remove_dir_all(folder);
    let backend = FileBackend::new(FileConfig::new(folder))?;
    let l = locker(backend.clone())?;
    let mut row = |keys: usize, left: &str, (n, bytes, disk): (u64, u64, u64)| {
        let per = |x: u64| format!("{:.0}", x as f64 / keys as f64);
        t.row(vec![
            "file".into(),
            keys.to_string(),
            left.into(),
            format!("{} file(s)", per(n)),
            per(bytes),
            per(disk),
        ]);
    };
    cycle(&l, 1).await?;
    let one = files(folder)?;
    row(1, "`.lock` + `.fence`", one);
    cycle(&l, many).await?;
    let all = files(folder)?;
    row(many, "`.lock` + `.fence`, per key", all);
    let pruned = backend.prune().await?;
    let after = files(folder)?;
    row(many, "`.fence` after `prune`, per key", after);
    if one.0 != 2 || pruned.removed != many || after.0 != many as u64 {
        return Err(format!(
            "file leftovers: {one:?} for one key, pruned {pruned:?}, {after:?} after"
        )
        .into());
    }
    Ok(())
}

async fn info_used_memory(conn: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no used_memory in INFO memory".into())
}

/// `MEMORY USAGE` of every key under `prefix` (count, bytes).
async fn usage(conn: &mut MultiplexedConnection, prefix: &str) -> Result<(u64, u64), BoxError> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await?;
    let mut bytes = 0;
    for k in &keys {
        let b: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .query_async(conn)
            .await?;
        bytes += b.unwrap_or(0);
    }
    Ok((keys.len() as u64, bytes))
}

async fn redis_rows(t: &mut Table, many: usize) -> Result<(), BoxError> {
    let ep = services::lookup(Service::Redis)?;
    let mut conn = redis::Client::open(ep.url())?
        .get_multiplexed_async_connection()
        .await?;
    let tag = services::unique_prefix("leftovers");
    let connect = |prefix: String, query: &'static str| {
        let url = format!("{}?prefix={prefix}{query}", ep.url());
        async move { locker(RedisBackend::connect(RedisConfig::from_url(&url)?).await?) }
    };
    let mut row = |keys: usize, left: &str, (n, bytes): (u64, u64)| {
        let per = |x: u64| format!("{:.0}", x as f64 / keys as f64);
        t.row(vec![
            "redis".into(),
            keys.to_string(),
            left.into(),
            format!("{} key(s)", per(n)),
            per(bytes),
            "–".into(),
        ]);
    };
    let one_prefix = format!("{tag}-one:");
    cycle(&connect(one_prefix.clone(), "").await?, 1).await?;
    let one = usage(&mut conn, &one_prefix).await?;
    row(1, "`<lock>:fence` (`MEMORY USAGE`)", one);

    let many_prefix = format!("{tag}-many:");
    let l = connect(many_prefix.clone(), "").await?;
    let before = info_used_memory(&mut conn).await?;
    cycle(&l, many).await?;
    let grown = info_used_memory(&mut conn).await?.saturating_sub(before);
    let (n, _) = usage(&mut conn, &many_prefix).await?;
    row(
        many,
        "`<lock>:fence`, per key (`used_memory` growth)",
        (n, grown),
    );

    let ttl_prefix = format!("{tag}-ttl:");
    cycle(
        &connect(ttl_prefix.clone(), "&fence_ttl_ms=1000").await?,
        many,
    )
    .await?;
    let armed = usage(&mut conn, &ttl_prefix).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let expired = usage(&mut conn, &ttl_prefix).await?;
    row(
        many,
        "with `fence_ttl_ms=1000`, 1.5 s after release",
        expired,
    );

    let _: u64 = redis::cmd("DEL")
        .arg(format!("{one_prefix}{{key-0}}:fence"))
        .query_async(&mut conn)
        .await?;
    for i in 0..many {
        let _: u64 = redis::cmd("DEL")
            .arg(format!("{many_prefix}{{key-{i}}}:fence"))
            .query_async(&mut conn)
            .await?;
    }
    if one.0 != 1 || n != many as u64 || armed.0 != many as u64 || expired.0 != 0 {
        return Err(format!(
            "redis leftovers: {one:?} for one key, {n} of {many}, {armed:?} then {expired:?} \
             with an expiry"
        )
        .into());
    }
    Ok(())
}
