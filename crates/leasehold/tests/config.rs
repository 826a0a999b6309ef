//! LockConfig: parsing, validation, environment overrides, secrets, requirements. No service
//! needed (the memory backend and Redlock, which connects lazily, are built for real).

use std::time::Duration;

use leasehold::{
    Error, ErrorKind, LockConfig, RenewalSetting, Require, available_schemes, scheme_feature,
};

const SECRET: &str = "hunter2-s3cret";

fn err_of(r: Result<LockConfig, Error>) -> Error {
    match r {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e,
    }
}

fn assert_no_secret(e: &Error) {
    let shown = format!("{e} | {e:?}");
    assert!(!shown.contains(SECRET), "secret leaked: {shown}");
}

fn sample(scheme: &str) -> String {
    match scheme {
        "memory" => "memory://".into(),
        "file" => "file:///tmp/leasehold-config-test".into(),
        "redis" => "redis://127.0.0.1:6379/2".into(),
        "rediss" => "rediss://127.0.0.1:6380".into(),
        "redis+unix" => "redis+unix:///tmp/redis.sock".into(),
        "unix" => "unix:///tmp/redis.sock".into(),
        "redis-cluster" => "redis-cluster://127.0.0.1:7000,127.0.0.1:7001".into(),
        "rediss-cluster" => "rediss-cluster://127.0.0.1:7000,127.0.0.1:7001".into(),
        "redis+sentinel" | "rediss+sentinel" => {
            format!("{scheme}://127.0.0.1:26379,127.0.0.1:26380/leasehold")
        }
        "redlock" => "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3".into(),
        "postgres" | "postgresql" => format!("{scheme}://u:p@127.0.0.1:5432/db"),
        "etcd" => format!("{scheme}://127.0.0.1:2379"),
        // etcds:// needs a CA file that exists and holds a certificate: the harness's.
        "etcds" => match leasehold_test_support::services::tls_ca() {
            Some(ca) => format!("etcds://127.0.0.1:2379?ca={}", ca.display()),
            None if !leasehold_test_support::services::may_skip() => {
                panic!("no TLS CA from scripts/services for the etcds:// sample")
            }
            None => "etcd://127.0.0.1:2379".into(),
        },
        other => panic!("no sample URL for scheme {other}: add one"),
    }
}

#[test]
fn every_available_scheme_parses() {
    for scheme in available_schemes() {
        let url = sample(scheme);
        let toml = format!("url = {url:?}\nttl = \"10s\"");
        let cfg = LockConfig::from_toml_str(&toml)
            .unwrap_or_else(|e| panic!("{scheme}: {url} should parse: {e}"));
        assert_eq!(cfg.url.as_deref(), Some(url.as_str()));
        assert_eq!(cfg.lock_options().ttl, Duration::from_secs(10));
    }
}

#[test]
fn a_scheme_without_its_feature_names_the_feature() {
    for scheme in ["redis", "redlock", "postgres", "etcd"] {
        let feature = scheme_feature(scheme).unwrap_or_default();
        let compiled = available_schemes().contains(&scheme);
        let r = LockConfig::new(sample(scheme)).validate();
        if compiled {
            assert!(r.is_ok(), "{scheme}: {r:?}");
        } else {
            let e = r.err().unwrap();
            assert_eq!(e.kind(), ErrorKind::InvalidConfig);
            let s = e.to_string();
            assert!(s.contains(&format!("`{feature}` feature")), "{s}");
            assert!(s.contains("available schemes: memory"), "{s}");
            assert!(s.contains("`url`"), "{s}");
        }
    }
}

#[test]
fn an_unknown_scheme_lists_the_available_ones() {
    let e = LockConfig::new("zookeeper://127.0.0.1:2181")
        .validate()
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(s.contains("unknown scheme \"zookeeper\""), "{s}");
    for scheme in available_schemes() {
        assert!(s.contains(scheme), "{s} should list {scheme}");
    }
}

#[test]
fn unknown_keys_are_errors_that_name_them() {
    let e = err_of(LockConfig::from_toml_str(
        "url = \"memory://\"\nttll = \"1s\"",
    ));
    assert!(e.to_string().contains("ttll"), "{e}");
    assert!(e.to_string().contains("line 2"), "{e}");
    let e = err_of(LockConfig::from_toml_str(
        "url = \"memory://\"\n[backoff]\nintial = \"1s\"",
    ));
    assert!(e.to_string().contains("intial"), "{e}");
    let e = err_of(LockConfig::from_toml_str(
        "[backend]\nscheme = \"memory\"\nhostz = []",
    ));
    assert!(e.to_string().contains("hostz"), "{e}");
}

#[test]
fn bad_values_name_the_field() {
    let cases = [
        ("url = \"memory://\"\nttl = \"0s\"", "`ttl`"),
        ("url = \"memory://\"\nttl = \"soon\"", "`ttl`"),
        ("url = \"memory://\"\nrenewal = \"sometimes\"", "`renewal`"),
        ("url = \"memory://\"\nrequire = \"absolutely\"", "`require`"),
        (
            "url = \"memory://\"\n[drift]\nfactor = 1.5",
            "`drift.factor`",
        ),
        (
            "url = \"memory://\"\n[backoff]\ninitial = \"2s\"\nmax = \"1s\"",
            "`backoff.max`",
        ),
        ("url = \"redis//127.0.0.1\"", "`url`"),
        ("url = \"memory://somewhere\"", "`url`"),
        ("ttl = \"1s\"", "`url`"),
        ("url = \"memory://\"\nurls = [\"redis://a:1\"]", "`url`"),
    ];
    for (toml, field) in cases {
        let e = err_of(LockConfig::from_toml_str(toml));
        assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{toml}");
        assert!(e.to_string().contains(field), "{toml}: {e}");
    }
}

#[cfg(feature = "redis")]
#[test]
fn redis_values_name_the_field_and_hide_the_password() {
    let two =
        format!("urls = [\"redis://:{SECRET}@127.0.0.1:1\", \"redis://:{SECRET}@127.0.0.1:2\"]");
    let e = err_of(LockConfig::from_toml_str(&two));
    assert!(e.to_string().contains("`urls`"), "{e}");
    assert!(e.to_string().contains("at least 3"), "{e}");
    assert_no_secret(&e);
    let e = err_of(LockConfig::from_toml_str(&format!(
        "url = \"redlock://u:{SECRET}@127.0.0.1:1,127.0.0.1:2\""
    )));
    assert!(e.to_string().contains("`url`"), "{e}");
    assert!(e.to_string().contains("at least 3"), "{e}");
    assert_no_secret(&e);
    let e = err_of(LockConfig::from_toml_str(&format!(
        "url = \"redis://u:{SECRET}@[::1\""
    )));
    assert!(e.to_string().contains("`url`"), "{e}");
    assert_no_secret(&e);
    let e = err_of(LockConfig::from_toml_str(
        "urls = [\"etcd://127.0.0.1:1\", \"redis://127.0.0.1:2\", \"redis://127.0.0.1:3\"]",
    ));
    assert!(e.to_string().contains("`urls`"), "{e}");
}

#[test]
fn secrets_never_show_in_debug_display_or_errors() {
    let forms = [
        format!("url = \"redis://app:{SECRET}@127.0.0.1:6379/0\""),
        format!("url = \"postgres://app:{SECRET}@127.0.0.1/db?sslmode=disable\""),
        format!(
            "urls = [\"redis://:{SECRET}@127.0.0.1:1\", \"redis://:{SECRET}@127.0.0.1:2\", \
             \"redis://:{SECRET}@127.0.0.1:3\"]"
        ),
        format!(
            "[backend]\nscheme = \"redlock\"\nhosts = [\"127.0.0.1:1\", \"127.0.0.1:2\", \
             \"127.0.0.1:3\"]\npassword = \"{SECRET}\""
        ),
    ];
    for toml in &forms {
        let cfg: LockConfig = match LockConfig::from_toml_str(toml) {
            Ok(c) => c,
            Err(e) => {
                // Without the driver's feature the scheme is refused: still no secret.
                assert_no_secret(&e);
                continue;
            }
        };
        let shown = format!("{cfg:?} {cfg}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
    // A secret in a field of the wrong type, or in an unknown key's line.
    for toml in [
        format!("urls = \"redis://:{SECRET}@127.0.0.1:1\""),
        format!("url = \"memory://\"\nuri = \"redis://:{SECRET}@h:1\""),
        format!("url = \"zz://u:{SECRET}@h:1\""),
        format!("url = \"u:{SECRET}@h:1\""),
    ] {
        let e = err_of(LockConfig::from_toml_str(&toml));
        assert_no_secret(&e);
    }
}

#[test]
fn table_form_builds_a_url() {
    let cfg = LockConfig::from_toml_str(
        "[backend]\nscheme = \"postgres\"\nhosts = [\"127.0.0.1:5432\"]\nuser = \"app\"\n\
         password = \"p@ss/w:rd\"\ndatabase = \"locks\"\n[backend.options]\nsslmode = \"disable\"",
    );
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            assert!(!available_schemes().contains(&"postgres"), "{e}");
            return;
        }
    };
    let table = cfg.backend.clone().unwrap();
    assert_eq!(
        table.to_url(),
        "postgres://app:p%40ss%2Fw%3Ard@127.0.0.1:5432/locks?sslmode=disable"
    );
    assert_eq!(
        table.redacted_url(),
        "postgres://app:***@127.0.0.1:5432/locks?sslmode=disable"
    );
}

#[test]
fn environment_variables_override_the_file() {
    let cfg = LockConfig::from_toml_str("url = \"memory://\"\nttl = \"1s\"\nwait = \"1s\"")
        .unwrap()
        .with_vars([
            ("LEASEHOLD_TTL", "5s"),
            ("LEASEHOLD_WAIT", "250ms"),
            ("LEASEHOLD_RENEWAL", "off"),
            ("LEASEHOLD_BACKOFF_MAX", "2s"),
            ("LEASEHOLD_DRIFT_FACTOR", "0.05"),
            ("LEASEHOLD_KEY_PREFIX", "app:"),
            ("LEASEHOLD_REQUIRE", "correctness"),
            // Not a configuration key: ignored.
            ("LEASEHOLD_TEST_REDIS_URL", "redis://127.0.0.1:1"),
        ])
        .unwrap();
    assert_eq!(cfg.ttl, Some(Duration::from_secs(5)));
    assert_eq!(cfg.wait_budget(), Duration::from_millis(250));
    assert_eq!(cfg.renewal, Some(RenewalSetting::Off));
    assert_eq!(cfg.lock_options().backoff.max, Duration::from_secs(2));
    assert_eq!(cfg.lock_options().drift.factor, 0.05);
    assert_eq!(cfg.key_prefix.as_deref(), Some("app:"));
    assert_eq!(cfg.require, Require::Correctness);

    let moved = cfg
        .clone()
        .with_vars([("LEASEHOLD_URLS", "redis://a:1,redis://b:2,redis://c:3")]);
    match moved {
        Ok(c) => {
            assert_eq!(c.url, None);
            assert_eq!(c.urls.map(|u| u.len()), Some(3));
        }
        Err(e) => assert!(!available_schemes().contains(&"redlock"), "{e}"),
    }

    for (var, value) in [
        ("LEASEHOLD_TTL", "soon"),
        ("LEASEHOLD_TTL", "0s"),
        ("LEASEHOLD_REQUIRE", "maybe"),
        ("LEASEHOLD_DRIFT_FACTOR", "x"),
        ("LEASEHOLD_BACKEND_PASSWORD", "pw"),
    ] {
        let e = cfg.clone().with_vars([(var, value)]).err().unwrap();
        let s = e.to_string();
        assert!(s.contains(var) || s.contains("`ttl`"), "{var}={value}: {s}");
    }
}

#[test]
fn table_password_from_the_environment() {
    let cfg = LockConfig::from_toml_str("[backend]\nscheme = \"memory\"")
        .unwrap()
        .with_vars([("LEASEHOLD_BACKEND_PASSWORD", SECRET)])
        .unwrap();
    assert_eq!(
        cfg.backend.as_ref().and_then(|b| b.password.as_deref()),
        Some(SECRET)
    );
    assert!(!format!("{cfg:?}").contains(SECRET));
}

/// Runs in a child process with a real environment (setting variables in this process would
/// need `unsafe`); the parent test below spawns it.
#[test]
fn env_child() {
    if std::env::var_os("LEASEHOLD_ENV_CHILD").is_none() {
        return;
    }
    let cfg = LockConfig::from_env().unwrap();
    assert_eq!(cfg.url.as_deref(), Some("memory://"));
    assert_eq!(cfg.ttl, Some(Duration::from_secs(7)));
    println!("ENV-CHILD-OK");
}

#[test]
fn process_environment_is_read() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "env_child", "--nocapture", "--test-threads=1"])
        .env("LEASEHOLD_ENV_CHILD", "1")
        .env("LEASEHOLD_URL", "memory://")
        .env("LEASEHOLD_TTL", "7s")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("ENV-CHILD-OK"), "{stdout}");
}

#[tokio::test]
async fn memory_builds_with_the_configured_options() {
    let cfg = LockConfig::from_toml_str(
        "url = \"memory://\"\nttl = \"10s\"\nwait = \"1s\"\nrenewal = \"2s\"",
    )
    .unwrap();
    let locker = cfg.build().await.unwrap();
    assert_eq!(locker.options().ttl, Duration::from_secs(10));
    assert_eq!(
        locker.options().renewal_interval(),
        Some(Duration::from_secs(2))
    );
    let lease = locker
        .acquire("config/memory", cfg.wait_budget())
        .await
        .unwrap();
    assert!(lease.fencing_token().is_some());
    assert!(lease.release().await.unwrap());
    // Renewal longer than the usable lease: refused by the options check, naming renewal.
    let bad =
        LockConfig::from_toml_str("url = \"memory://\"\nttl = \"1s\"\nrenewal = \"5s\"").unwrap();
    let e = bad.build().await.err().unwrap();
    assert!(e.to_string().contains("renewal"), "{e}");
}

#[tokio::test]
async fn correctness_refuses_the_memory_backend_with_the_reason() {
    let cfg = LockConfig::from_toml_str("url = \"memory://\"\nrequire = \"correctness\"").unwrap();
    let e = cfg.build().await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    let s = e.to_string();
    assert!(s.contains("require = \"correctness\""), "{s}");
    assert!(s.contains("memory"), "{s}");
    assert!(s.contains("only within one process"), "{s}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn correctness_refuses_redlock_with_the_reason() {
    // Redlock connects lazily: this needs no server.
    let cfg = LockConfig::from_toml_str(
        "url = \"redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3\"\nrequire = \"correctness\"",
    )
    .unwrap();
    let e = cfg.build().await.err().unwrap();
    let s = e.to_string();
    assert!(s.contains("redlock"), "{s}");
    assert!(s.contains("no fencing token"), "{s}");
    assert!(s.contains("clock drift"), "{s}");
    // The same configuration for efficiency builds.
    assert!(cfg.with_require(Require::Efficiency).build().await.is_ok());
}

/// PostgreSQL's session bound is a driver option: `max_sessions` in the URL's query or in
/// `[backend.options]`; the replaced `max_idle_sessions` is refused with a pointer to it.
#[cfg(feature = "postgres")]
#[test]
fn postgres_max_sessions_is_a_backend_option() {
    use leasehold::postgres::{DEFAULT_MAX_SESSIONS, PostgresConfig};
    let cfg = LockConfig::from_toml_str(
        "[backend]\nscheme = \"postgres\"\nhosts = [\"127.0.0.1:5432\"]\nuser = \"app\"\n\
         database = \"locks\"\n[backend.options]\nmax_sessions = \"8\"",
    )
    .unwrap();
    let url = cfg.backend.clone().unwrap().to_url();
    assert_eq!(PostgresConfig::from_url(&url).unwrap().max_sessions(), 8);
    let url = "postgres://app@127.0.0.1/locks";
    assert_eq!(
        PostgresConfig::from_url(url).unwrap().max_sessions(),
        DEFAULT_MAX_SESSIONS
    );
    let e = PostgresConfig::from_url(&format!("{url}?max_idle_sessions=4")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidConfig);
    assert!(e.to_string().contains("max_sessions"), "{e}");
}

/// A configuration builds semaphores: on memory it takes permits; `require = "correctness"`
/// applies as for locks; a limit of 0 is a typed error.
#[tokio::test]
async fn semaphores_are_built_checked_and_refused_with_the_reason() {
    let sem = LockConfig::new("memory://")
        .build_semaphore(2)
        .await
        .unwrap();
    let a = sem.try_acquire("k").await.unwrap();
    let b = sem.try_acquire("k").await.unwrap();
    assert!(a.is_some() && b.is_some());
    assert!(sem.try_acquire("k").await.unwrap().is_none());

    let strict = LockConfig::new("memory://").with_require(Require::Correctness);
    let err = strict.build_semaphore(3).await.unwrap_err();
    assert!(err.to_string().contains("correctness"), "{err}");

    let err = LockConfig::new("memory://")
        .build_semaphore(0)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// Redlock (which connects lazily: no server needed) is refused a semaphore with its reason.
#[cfg(feature = "redis")]
#[tokio::test]
async fn redlock_semaphores_are_refused_with_the_reason() {
    let redlock = LockConfig::new("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3");
    let err = redlock.build_semaphore(3).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("keeps no count"), "{err}");
}
