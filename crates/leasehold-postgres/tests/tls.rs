//! TLS (`sslmode`, `sslrootcert`) against the real PostgreSQL of `scripts/services`, which
//! serves TLS and plain TCP on one port with a certificate for `127.0.0.1` and `localhost`
//! signed by the harness's throwaway CA (`LEASEHOLD_TEST_TLS_CA`).

mod common;

use std::path::PathBuf;

use leasehold_core::{ErrorKind, LockKey, Locker};
use leasehold_postgres::{PostgresBackend, PostgresConfig, PostgresFenceStore};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, Service, unique_prefix};
use tokio_postgres::Client;

/// The CA file, or a failure / a skip where allowed (like `require_service!`).
fn ca() -> Option<PathBuf> {
    let ca = services::tls_ca();
    if ca.is_none() {
        assert!(
            services::may_skip(),
            "{} not set: run scripts/services up",
            services::TLS_CA_VAR
        );
        eprintln!(
            "SKIPPED: {} not set (run scripts/services up)",
            services::TLS_CA_VAR
        );
    }
    ca
}

/// Whether every session of `app` uses TLS; fails if it has none.
async fn sessions_use_tls(admin: &Client, app: &str) -> Result<bool, common::BoxError> {
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&app],
        )
        .await?;
    if rows.is_empty() {
        return Err(format!("no session of {app}").into());
    }
    Ok(rows.iter().all(|r| r.get::<_, bool>(0)))
}

/// A lock round trip through `backend`: acquire, check the token, release.
async fn lock_cycle(backend: PostgresBackend, key: &str) -> Result<(), common::BoxError> {
    let locker = Locker::new(backend);
    let lease = locker
        .try_acquire(&LockKey::new(key)?)
        .await?
        .ok_or("free key not granted")?;
    assert!(lease.fencing_token().is_some());
    assert!(lease.release().await?);
    Ok(())
}

#[tokio::test]
async fn verify_full_with_the_ca_connects_encrypted() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let Some(ca) = ca() else { return Ok(()) };
    let admin = common::admin(pg.url()).await?;
    // 127.0.0.1 matches the certificate's IP SAN; `localhost` its DNS SAN.
    for url in [
        pg.url().to_owned(),
        pg.url().replace("@127.0.0.1:", "@localhost:"),
    ] {
        let app = unique_prefix("pg-tls-full");
        let cfg = common::config(
            &common::url_with(
                &url,
                &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
            ),
            &app,
        )?;
        assert_eq!(cfg.ssl_mode(), "verify-full");
        let backend = PostgresBackend::connect(cfg).await?;
        lock_cycle(backend.clone(), &format!("{app}/k")).await?;
        assert!(sessions_use_tls(&admin, &app).await?, "{url}: not TLS");
    }
    Ok(())
}

#[tokio::test]
async fn verify_full_rejects_a_wrong_host_name_and_verify_ca_does_not()
-> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let Some(ca) = ca() else { return Ok(()) };
    let url: tokio_postgres::Config = pg.url().parse()?;
    let port = url.get_ports().first().copied().ok_or("no port")?;
    // Connect to 127.0.0.1 but expect the certificate to name `wrong.invalid`.
    let conninfo = |mode: &str| {
        format!(
            "host=wrong.invalid hostaddr=127.0.0.1 port={port} user=leasehold password=leasehold \
             dbname=leasehold sslmode={mode} sslrootcert='{}'",
            ca.display()
        )
    };
    let err = PostgresBackend::connect(PostgresConfig::from_url(&conninfo("verify-full"))?)
        .await
        .err()
        .ok_or("verify-full accepted a certificate for another name")?;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("sslmode=verify-full"), "{msg}");
    assert!(msg.contains("not valid for name"), "{msg}");
    assert!(!msg.contains("password=leasehold"), "{msg}");

    // verify-ca checks the chain only: same name, accepted.
    let app = unique_prefix("pg-tls-ca");
    let cfg = PostgresConfig::from_url(&conninfo("verify-ca"))?.with_application_name(&app);
    assert_eq!(cfg.ssl_mode(), "verify-ca");
    lock_cycle(PostgresBackend::connect(cfg).await?, &format!("{app}/k")).await?;
    Ok(())
}

#[tokio::test]
async fn verify_full_without_the_ca_fails_clearly() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    if ca().is_none() {
        return Ok(());
    }
    // System roots (no sslrootcert) do not know the throwaway CA.
    let result = match PostgresConfig::from_url(&common::url_with(pg.url(), "sslmode=verify-full"))
    {
        // No system roots at all: refused when configuring.
        Err(e) => Err(e),
        Ok(cfg) => PostgresBackend::connect(cfg).await.map(drop),
    };
    let err = result.err().ok_or("verify-full trusted an unknown CA")?;
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Unavailable | ErrorKind::InvalidConfig
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("UnknownIssuer") || msg.contains("root certificates"),
        "{msg}"
    );

    // A missing root file is a configuration error, naming the file, before any connect.
    let err = PostgresConfig::from_url(&common::url_with(
        pg.url(),
        "sslmode=verify-full&sslrootcert=/nonexistent/leasehold-ca.pem",
    ))
    .err()
    .ok_or("a missing sslrootcert was accepted")?;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("/nonexistent/leasehold-ca.pem"));
    Ok(())
}

#[tokio::test]
async fn require_encrypts_without_verifying_and_disable_stays_plain() -> Result<(), common::BoxError>
{
    let pg = require_service!(Service::Postgres, Ok(()));
    let admin = common::admin(pg.url()).await?;

    let app = unique_prefix("pg-tls-req");
    let cfg = common::config(&common::url_with(pg.url(), "sslmode=require"), &app)?;
    assert_eq!(cfg.ssl_mode(), "require");
    let backend = PostgresBackend::connect(cfg).await?;
    lock_cycle(backend.clone(), &format!("{app}/k")).await?;
    assert!(sessions_use_tls(&admin, &app).await?, "require: not TLS");
    drop(backend);

    let app = unique_prefix("pg-tls-off");
    let cfg = common::config(&common::url_with(pg.url(), "sslmode=disable"), &app)?;
    assert_eq!(cfg.ssl_mode(), "disable");
    let backend = PostgresBackend::connect(cfg).await?;
    lock_cycle(backend.clone(), &format!("{app}/k")).await?;
    assert!(
        !sessions_use_tls(&admin, &app).await?,
        "sslmode=disable used TLS"
    );
    drop(backend);
    Ok(())
}

/// libpq's `prefer`: TLS first. Earlier versions read `prefer` (and no `sslmode` at all) as
/// "no TLS", so a default connection sent its password in clear.
#[tokio::test]
async fn prefer_and_the_default_try_tls_first() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let admin = common::admin(pg.url()).await?;
    for url in [
        pg.url().to_owned(),
        common::url_with(pg.url(), "sslmode=prefer"),
    ] {
        let app = unique_prefix("pg-tls-prefer");
        let cfg = common::config(&url, &app)?;
        assert_eq!(cfg.ssl_mode(), "prefer");
        let backend = PostgresBackend::connect(cfg).await?;
        lock_cycle(backend.clone(), &format!("{app}/k")).await?;
        assert!(sessions_use_tls(&admin, &app).await?, "{url}: not TLS");
    }
    Ok(())
}

/// `prefer` against a server without TLS (pgbouncer here) connects in plaintext, as libpq
/// does; to a loopback address that is not even a warning.
#[tokio::test]
async fn prefer_falls_back_to_plaintext_when_the_server_has_no_tls() -> Result<(), common::BoxError>
{
    let bouncer = require_service!(Service::PgBouncer, Ok(()));
    let logs = leasehold_test_support::logs::capture();
    let url = common::url_with(
        bouncer.url(),
        "sslmode=prefer&allow_plaintext_password=false",
    );
    let table = unique_prefix("pg_prefer").replace('-', "_");
    let store = PostgresFenceStore::connect(&url, &table).await?;
    let token = leasehold_core::FencingToken::new(3);
    assert_eq!(
        leasehold_core::FenceStore::admit(&store, "r", token).await?,
        leasehold_core::Admission::Accepted
    );
    assert!(!logs.text().contains("in clear"), "{}", logs.text());
    drop(store);
    let admin = common::admin(&common::url_with(bouncer.url(), "sslmode=disable")).await?;
    admin.batch_execute(&format!("DROP TABLE {table}")).await?;
    // `require` does not fall back.
    let err = PostgresFenceStore::connect(&common::url_with(bouncer.url(), "sslmode=require"), "t")
        .await
        .err()
        .ok_or("require connected without TLS")?;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    Ok(())
}

/// The fence store connects with the driver's TLS, as the backend does.
#[tokio::test]
async fn the_fence_store_uses_tls() -> Result<(), common::BoxError> {
    let pg = require_service!(Service::Postgres, Ok(()));
    let Some(ca) = ca() else { return Ok(()) };
    let admin = common::admin(pg.url()).await?;
    for params in [
        String::new(),
        format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    ] {
        let app = unique_prefix("pg-tls-fence");
        let url = common::url_with(pg.url(), &format!("application_name={app}&{params}"));
        let table = app.replace('-', "_");
        let store = PostgresFenceStore::connect(&url, &table).await?;
        assert!(sessions_use_tls(&admin, &app).await?, "{params}: not TLS");
        drop(store);
        admin.batch_execute(&format!("DROP TABLE {table}")).await?;
    }
    Ok(())
}

/// A password about to go in clear to a host that is not loopback: a warning by default,
/// a refusal (before anything is sent) with `allow_plaintext_password=false`; neither quotes
/// the password. To a loopback address, neither.
#[tokio::test]
async fn a_password_in_clear_to_a_remote_host_warns_or_is_refused() -> Result<(), common::BoxError>
{
    let pg = require_service!(Service::Postgres, Ok(()));
    // 192.0.2.1 (TEST-NET-1) is never routed: the warning comes before the connect fails.
    let remote = "postgres://u:hunter2@192.0.2.1:5432/db?sslmode=disable&connect_timeout=1";
    let logs = leasehold_test_support::logs::capture();
    let err = PostgresBackend::connect(PostgresConfig::from_url(remote)?)
        .await
        .err()
        .ok_or("connected to TEST-NET-1")?;
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = logs.text();
    assert!(
        text.contains("in clear") && text.contains("192.0.2.1"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");

    let refused = format!("{remote}&allow_plaintext_password=false");
    let started = std::time::Instant::now();
    let err = PostgresBackend::connect(PostgresConfig::from_url(&refused)?)
        .await
        .err()
        .ok_or("connected to TEST-NET-1")?;
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(
        err.to_string().contains("allow_plaintext_password"),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "it tried to connect"
    );

    // Loopback: plaintext with a password is allowed silently, even when refusing remotes.
    let logs = leasehold_test_support::logs::capture();
    let app = unique_prefix("pg-plain-loop");
    let url = common::url_with(pg.url(), "sslmode=disable&allow_plaintext_password=false");
    let backend = PostgresBackend::connect(common::config(&url, &app)?).await?;
    lock_cycle(backend, &format!("{app}/k")).await?;
    assert!(!logs.text().contains("in clear"), "{}", logs.text());
    Ok(())
}
