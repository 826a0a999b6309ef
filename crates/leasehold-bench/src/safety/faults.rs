//! The faults the safety table injects from outside the clients: node stop, start and
//! restart through `scripts/services`, a clock jump, `pg_terminate_backend`, an etcd lease
//! revoke, and finding the etcd cluster's leader to kill.

use std::path::Path;
use std::process::Stdio;

use leasehold_postgres::{advisory_key, pg_locks_ids};
use leasehold_test_support::etcd::leader_index;
use leasehold_test_support::services::{self, NodeAction};

use super::env::{ETCD_CLUSTER_NODES, Env, SAFETY_APP, SAFETY_CLOCK_VAR, opt};
use crate::harness::BoxError;

/// Runs `scripts/services ACTION NODE` for any node, including the dedicated ones.
pub(super) async fn ctl(node: &str, action: NodeAction) -> Result<(), BoxError> {
    script(&[action.as_str(), node]).await.map(drop)
}

/// Runs `scripts/services ARGS…`; its stdout, trimmed.
pub(super) async fn script(args: &[&str]) -> Result<String, BoxError> {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(services::services_script())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = services::var(services::SERVICES_DIR_VAR) {
        cmd.env(services::SERVICES_DIR_VAR, dir);
    }
    let out = cmd.output().await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "scripts/services {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into())
    }
}

/// Moves the wall clock of the clock node forward by an hour: every TTL on it runs out.
pub(super) fn jump_clock(env: &Env) -> Result<(), BoxError> {
    let file = opt(&env.clock_file, SAFETY_CLOCK_VAR)?;
    let now: i64 = std::fs::read_to_string(file)?.trim().parse()?;
    replace_file(file, format!("{}\n", now + 3_600_000).as_bytes())
}

/// Writes `contents` to a temporary file beside `file` (with `file`'s permissions) and renames
/// it over `file`: the clock shim of `scripts/services` reads the file on every clock call, and
/// a truncate-then-write would let it read an empty file (offset 0: the clock steps back).
pub(super) fn replace_file(file: &Path, contents: &[u8]) -> Result<(), BoxError> {
    let mut name = file
        .file_name()
        .ok_or_else(|| format!("{} names no file", file.display()))?
        .to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = file.with_file_name(name);
    let written = std::fs::write(&tmp, contents)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::metadata(file)?.permissions()))
        .and_then(|()| std::fs::rename(&tmp, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(written?)
}

/// `pg_terminate_backend` of the session holding `key`'s advisory lock: one of the trial's
/// own sessions (named [`SAFETY_APP`]), never another client's of the shared server.
pub(super) async fn terminate(url: &str, key: &str) -> Result<(), BoxError> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    let conn = tokio::spawn(conn);
    let (classid, objid) = pg_locks_ids(advisory_key(key));
    let terminated = client
        .query(
            "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a \
             JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted \
             WHERE a.application_name = $3 AND (l.classid, l.objid, l.objsubid) = ($1, $2, 1)",
            &[&classid, &objid, &SAFETY_APP],
        )
        .await;
    drop(client);
    let _ = conn.await;
    match terminated?.len() {
        1 => Ok(()),
        n => Err(format!("expected one session holding {key:?}, found {n}").into()),
    }
}

/// Revokes the etcd lease of `key`'s holder (default prefix `leasehold/`).
pub(super) async fn revoke(endpoints: &[String], key: &str) -> Result<(), BoxError> {
    let mut c = etcd_client::Client::connect(endpoints, None).await?;
    let key = leasehold_core::LockKey::new(key)?;
    let prefix = leasehold_etcd::lock_prefix(leasehold_etcd::DEFAULT_PREFIX, &key);
    let resp = c
        .get(
            prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await?;
    let lease = resp
        .kvs()
        .iter()
        .min_by_key(|kv| kv.create_revision())
        .map(|kv| kv.lease())
        .ok_or_else(|| format!("no etcd key under {prefix:?}"))?;
    c.lease_revoke(lease).await?;
    Ok(())
}

/// The node name of the etcd cluster's leader (endpoints in etcd-c1..3 order).
pub(super) async fn etcd_leader(endpoints: &[String]) -> Result<&'static str, BoxError> {
    let i = leader_index(endpoints).await?;
    ETCD_CLUSTER_NODES
        .get(i)
        .copied()
        .ok_or_else(|| format!("leader #{i} is not one of {ETCD_CLUSTER_NODES:?}").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn replacing_a_file_keeps_its_permissions_and_leaves_no_temporary() -> Result<(), BoxError> {
        use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
        let dir = std::env::temp_dir().join(services::unique_prefix("safety-replace"));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join("clock-offset-ms");
        std::fs::write(&file, "0\n")?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        let before = std::fs::metadata(&file)?;
        replace_file(&file, b"3600000\n")?;
        let after = std::fs::metadata(&file)?;
        assert_eq!(std::fs::read_to_string(&file)?, "3600000\n");
        assert_eq!(after.permissions().mode() & 0o777, 0o600);
        // A new inode: a reader that opened the old file sees it whole, never truncated.
        assert_ne!(before.ino(), after.ino());
        assert_eq!(
            std::fs::read_dir(&dir)?.count(),
            1,
            "a temporary file was left"
        );
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
