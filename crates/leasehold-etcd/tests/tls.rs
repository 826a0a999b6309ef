//! TLS (rustls) and etcd authentication against the harness's `etcd-secure` member: a server
//! certificate from the harness's throwaway CA, and auth enabled (user root). Needs the crate
//! feature `tls` (`cargo test -p leasehold-etcd --features tls`).

use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{
    Candidate, Elector, Error, ErrorKind, Locker, PermitLimit, Renewal, Semaphore,
};
use leasehold_etcd::EtcdBackend;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, Endpoints, Service};
use tokio::process::Command;
use tokio::time::timeout;

/// The harness's credentials for etcd-secure, and its CA (they come with the service).
struct Secure {
    endpoint: String,
    user: String,
    password: String,
    ca: PathBuf,
}

fn secure(endpoints: &Endpoints) -> Secure {
    let var = |key: &str| match services::var(key) {
        Some(v) => v,
        None => panic!("etcd-secure is configured but {key} is not set (scripts/services env)"),
    };
    let ca = match services::tls_ca() {
        Some(ca) => ca,
        None => panic!(
            "etcd-secure is configured but the CA file ({}) is missing",
            services::TLS_CA_VAR
        ),
    };
    Secure {
        endpoint: endpoints.url().to_owned(),
        user: var(services::ETCD_USER_VAR),
        password: var(services::ETCD_PASSWORD_VAR),
        ca,
    }
}

/// `%XX`-escapes everything but unreserved characters, for user, password and paths in URLs.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn url(s: &Secure, password: &str, ca: Option<&Path>, prefix: &str) -> String {
    let mut url = format!(
        "etcds://{}:{}@{}?prefix={}&session_ttl=5&timeout_ms=3000",
        escape(&s.user),
        escape(password),
        s.endpoint,
        escape(prefix)
    );
    if let Some(ca) = ca {
        url.push_str("&ca=");
        url.push_str(&escape(&ca.to_string_lossy()));
    }
    url
}

/// Connects, bounded in time: a TLS or auth failure must come back as an error, never hang.
async fn connect(url: &str) -> Result<EtcdBackend, Error> {
    match timeout(Duration::from_secs(20), async {
        EtcdBackend::connect(leasehold_etcd::EtcdConfig::from_url(url)?).await
    })
    .await
    {
        Ok(r) => r,
        Err(_) => panic!("connect did not finish within 20 s"),
    }
}

fn locker(backend: EtcdBackend) -> Locker {
    leasehold_test_support::harness::locker(backend, Duration::from_secs(5), Renewal::Auto)
}

/// `etcdctl ARGS` on etcd-secure, over TLS with the CA, as root: its standard output. Fails
/// the test if it fails.
async fn etcdctl(s: &Secure, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://{}", s.endpoint))
        .arg(format!("--cacert={}", s.ca.display()))
        .arg(format!("--user={}:{}", s.user, s.password))
        .arg("--command-timeout=5s")
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match timeout(Duration::from_secs(10), out).await {
        Ok(Ok(out)) if out.status.success() => out,
        Ok(Ok(out)) => panic!(
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Ok(Err(e)) => panic!("cannot run etcdctl: {e}"),
        Err(_) => panic!("etcdctl {args:?} did not finish within 10 s"),
    };
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `etcdctl get --prefix --keys-only PREFIX`: an independent look at what the server stores.
async fn etcdctl_keys(s: &Secure, prefix: &str) -> Vec<String> {
    etcdctl(s, &["get", "--prefix", "--keys-only", prefix])
        .await
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every rendering of an error a user might log: Display, Debug, and each source's.
fn renderings(e: &Error) -> String {
    let mut all = format!("{e}\n{e:?}\n");
    let mut source = e.source();
    while let Some(s) = source {
        all.push_str(&format!("{s}\n{s:?}\n"));
        source = s.source();
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_user_and_password_acquires_and_releases() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);
    let prefix = leasehold_test_support::harness::key_prefix("tls-e2e", "/");
    let url = url(&s, &s.password, Some(&s.ca), &prefix);

    let a = connect(&url).await.unwrap();
    let b = connect(&url).await.unwrap();
    assert!(
        a.session_lease_id().await.is_some(),
        "no session lease granted"
    );
    let debug = format!("{a:?}");
    assert!(
        !debug.contains(&s.password),
        "Debug shows the password: {debug}"
    );
    let (a, b) = (locker(a), locker(b));

    let lease = a.acquire("billing", Duration::from_secs(5)).await.unwrap();
    let token = lease.fencing_token().unwrap();
    assert!(token.get() > 0, "{token:?}");
    // The other session (another TLS connection, another lease) is excluded...
    assert!(b.try_acquire("billing").await.unwrap().is_none());
    // ...sees who holds it...
    let holder = b.inspect("billing").await.unwrap().unwrap();
    assert_eq!(holder.owner.as_ref(), Some(lease.owner()));
    assert_eq!(holder.fencing, Some(token));
    // ...and the key is really on the TLS member, as etcdctl (TLS + auth) sees it.
    let keys = etcdctl_keys(&s, &prefix).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with(&format!("{prefix}billing/")),
        "{keys:?}"
    );

    assert!(lease.release().await.unwrap(), "release found no grant");
    let next = b.try_acquire("billing").await.unwrap().unwrap();
    assert!(next.fencing_token().unwrap() > token);
    assert!(next.release().await.unwrap());
    assert_eq!(etcdctl_keys(&s, &prefix).await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_typed_error_that_never_shows_the_password() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);
    let wrong = format!("Wr0ng-{:08x}-pw", rand::random::<u32>());
    assert_ne!(wrong, s.password);
    let url = url(&s, &wrong, Some(&s.ca), "lh-test-wrong-pw/");
    let e = connect(&url).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(
        !e.is_retryable(),
        "a wrong password is not worth retrying: {e:?}"
    );
    assert!(
        e.message().contains("authentication failed"),
        "the message should say why: {e}"
    );
    let all = renderings(&e);
    assert!(!all.contains(&wrong), "the password leaked: {all}");
    assert!(!all.contains(&escape(&wrong)), "the password leaked: {all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_credentials_on_an_auth_member_is_a_config_error() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);
    let url = format!(
        "etcds://{}?ca={}&prefix=lh-test-no-user/",
        s.endpoint,
        escape(&s.ca.to_string_lossy())
    );
    // etcd grants leases to anyone; connecting still fails, not the first lock.
    let e = connect(&url).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(e.message().contains("user name is empty"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_ca_fails_clearly() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);

    // No CA at all: nothing could verify the server, so the configuration is refused.
    let e = connect(&url(&s, &s.password, None, "lh-test-no-ca/"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(
        e.message().contains("ca="),
        "should say how to give it: {e}"
    );
    assert!(!renderings(&e).contains(&s.password));

    // A CA file that is not there.
    let gone =
        std::env::temp_dir().join(format!("lh-no-such-ca-{:08x}.pem", rand::random::<u32>()));
    let e = connect(&url(&s, &s.password, Some(&gone), "lh-test-no-ca/"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(e.message().contains("cannot read the CA file"), "{e}");
    assert!(e.message().contains(&*gone.to_string_lossy()), "{e}");
    assert!(!renderings(&e).contains(&s.password));

    // A file that holds no certificate.
    let dir = services::workspace_root().join("target/tmp");
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join(format!("lh-not-a-ca-{:08x}.pem", rand::random::<u32>()));
    std::fs::write(&junk, b"not a certificate\n").unwrap();
    let e = connect(&url(&s, &s.password, Some(&junk), "lh-test-no-ca/"))
        .await
        .unwrap_err();
    let _ = std::fs::remove_file(&junk);
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{e:?}");
    assert!(e.message().contains("no PEM certificate"), "{e}");

    // A real CA that did not sign the server's certificate: the handshake fails, promptly,
    // and the password was never sent to an unverified server.
    let other_ca = dir.join(format!("lh-other-ca-{:08x}", rand::random::<u32>()));
    let (cert, key) = (
        other_ca.with_extension("pem"),
        other_ca.with_extension("key"),
    );
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=leasehold other test CA"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    assert!(
        made.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let started = tokio::time::Instant::now();
    let e = connect(&url(&s, &s.password, Some(&cert), "lh-test-other-ca/"))
        .await
        .unwrap_err();
    let _ = std::fs::remove_file(&cert);
    let _ = std::fs::remove_file(&key);
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    let all = renderings(&e);
    assert!(!all.contains(&s.password), "the password leaked: {all}");
    assert!(
        all.to_lowercase().contains("certificate") || all.contains("UnknownIssuer"),
        "the error should point at the certificate: {all}"
    );
}

/// A user whose role may only read and write the backend's prefix (least privilege) takes a
/// lock with a token, a semaphore permit and a leadership there, and leaves no key: the driver
/// touches nothing outside its prefix and makes no call reserved to root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_its_prefix_locks_counts_permits_and_elects() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);
    let tag = leasehold_test_support::services::unique_prefix("etcd-least");
    let prefix = format!("{tag}/");
    let (user, role) = (format!("{tag}-user"), format!("{tag}-role"));
    etcdctl(&s, &["role", "add", &role]).await;
    etcdctl(
        &s,
        &[
            "role",
            "grant-permission",
            &role,
            "readwrite",
            &prefix,
            "--prefix=true",
        ],
    )
    .await;
    etcdctl(&s, &["user", "add", &format!("{user}:least-pw")]).await;
    etcdctl(&s, &["user", "grant-role", &user, &role]).await;
    let limited = Secure {
        user: user.clone(),
        password: "least-pw".to_owned(),
        endpoint: s.endpoint.clone(),
        ca: s.ca.clone(),
    };
    let url = url(&limited, &limited.password, Some(&limited.ca), &prefix);
    // In a task of its own, so that a failure still removes the user and the role.
    let outcome = tokio::spawn(async move {
        let backend = connect(&url).await.unwrap();
        let l = locker(backend.clone());
        let lease = l.try_acquire("k").await.unwrap().expect("free");
        assert!(lease.fencing_token().is_some(), "no token");
        assert!(lease.release().await.unwrap());
        let sem = Semaphore::from_locker(&l, PermitLimit::new(2).unwrap()).unwrap();
        let permit = sem.try_acquire("s").await.unwrap().expect("a free permit");
        assert!(permit.release().await.unwrap());
        let elector = Elector::new(
            std::sync::Arc::new(backend),
            "e",
            Candidate::new("me").unwrap(),
            leasehold_test_support::harness::options(Duration::from_secs(5), Renewal::Auto),
        )
        .unwrap();
        let lead = elector.campaign_for(Duration::from_secs(5)).await.unwrap();
        assert!(lead.resign().await.unwrap());
    })
    .await;
    // What the semaphore keeps for good (its agreed limit), then the user and the role.
    etcdctl(&s, &["del", "--prefix", &prefix]).await;
    etcdctl(&s, &["user", "delete", &user]).await;
    etcdctl(&s, &["role", "delete", &role]).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// A change to the cluster's users or roles makes etcd refuse every token issued before it
/// ("revision of auth store is old"), and etcd-client renews a token only when etcd calls it
/// invalid. A lease taken before the change still releases, and the backend acquires again
/// after a second change: each request that meets a stale token renews it and goes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_users_or_roles_does_not_fail_a_release_or_an_acquisition() {
    let endpoints = require_service!(Service::EtcdSecure);
    let s = secure(&endpoints);
    let tag = leasehold_test_support::services::unique_prefix("etcd-authrev");
    let prefix = format!("{tag}/");
    let role = format!("{tag}-role");
    let l = locker(
        connect(&url(&s, &s.password, Some(&s.ca), &prefix))
            .await
            .unwrap(),
    );
    let lease = l.try_acquire("k").await.unwrap().expect("free");
    let token = lease.fencing_token().unwrap();

    etcdctl(&s, &["role", "add", &role]).await;
    let released = lease.release().await;
    etcdctl(&s, &["role", "delete", &role]).await;
    assert!(released.unwrap(), "release found no grant");

    let next = l.try_acquire("k").await.unwrap().expect("free again");
    assert!(next.fencing_token().unwrap() > token);
    assert!(next.release().await.unwrap());
    assert_eq!(etcdctl_keys(&s, &prefix).await, Vec::<String>::new());
}
