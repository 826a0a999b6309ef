//! No secret ever shows: every config type's `Debug` (and `Display` where it has one) and every
//! error of parsing or opening a configuration, with a secret in each position a secret can
//! take — URL userinfo, the `pass`, `password`, `*password` and `token` options, a Redis unix
//! socket's `?pass=`, a `[backend]` table — written plainly, percent-encoded, and holding
//! `/ ? # @` that confuse URL parsers.
//!
//! Each driver's part is compiled with its feature (`cargo test -p leasehold --all-features`
//! runs them all). Opening points at a closed port: connection errors are checked too.

#![allow(unused_imports)]

use std::fmt::Debug;
use std::time::Duration;

use leasehold::{BackendTable, LockConfig};

/// The part of every secret below that must never show.
const MARK: &str = "Zq9SECRET";

/// Secrets to place: plain, with URL delimiters, and with a `:` (read as `user:password`).
fn secrets() -> Vec<String> {
    ["", "/?#@x", "a/b", "q?r", "h#i", "@at", ":c@d/e?f#g"]
        .iter()
        .map(|tail| format!("{MARK}{tail}"))
        .collect()
}

/// The secret as a URL would carry it: raw (as users write it) and percent-encoded.
fn forms(secret: &str) -> Vec<String> {
    let encoded: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    vec![secret.to_owned(), encoded]
}

/// Calls `f` with each template, its `{s}` replaced by every secret in every form.
fn each_secret_in(templates: &[&str], mut f: impl FnMut(&str)) {
    for secret in secrets() {
        for s in forms(&secret) {
            for t in templates {
                f(&t.replace("{s}", &s));
            }
        }
    }
}

thread_local! {
    /// Every leak found by the running test (reported all at once by [`no_leaks`]).
    static LEAKS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Records a leak if `shown` holds the secret's mark (the mark's letters are the same
/// percent-encoded, so this covers both forms).
fn assert_hidden(what: &str, shown: &str) {
    if shown.contains(MARK) {
        LEAKS.with(|l| l.borrow_mut().push(format!("{what}:\n    {shown}")));
    }
}

/// Fails with every leak recorded on this thread.
fn no_leaks() {
    let leaks = LEAKS.with(|l| std::mem::take(&mut *l.borrow_mut()));
    assert!(
        leaks.is_empty(),
        "{} leaks of the secret:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}

/// Checks `Debug` of a parsed value, or `Display` and `Debug` of its error.
fn check<T: Debug, E: std::fmt::Display + Debug>(what: &str, r: &Result<T, E>) {
    match r {
        Ok(v) => assert_hidden(&format!("Debug of {what}"), &format!("{v:?}")),
        Err(e) => {
            assert_hidden(&format!("the error of {what}"), &e.to_string());
            assert_hidden(&format!("Debug of the error of {what}"), &format!("{e:?}"));
        }
    }
}

/// Parses and shows a configuration with this URL, and with `open`, opens it against a closed
/// port (connection errors quote addresses).
async fn check_url(url: &str, open: bool) {
    let cfg = LockConfig::new(url);
    assert_hidden(&format!("Debug of LockConfig({url})"), &format!("{cfg:?}"));
    assert_hidden(&format!("Display of LockConfig({url})"), &cfg.to_string());
    check(&format!("validate({url})"), &cfg.validate());
    if open
        && cfg.validate().is_ok()
        && let Ok(built) = tokio::time::timeout(Duration::from_secs(10), cfg.build()).await
    {
        check(&format!("build({url})"), &built.map(|_| ()));
    }
    // The same URL as TOML, and as a one-node list.
    let toml = format!("url = {url:?}\nttl = \"5s\"");
    check(&format!("TOML {toml}"), &LockConfig::from_toml_str(&toml));
    let toml = format!("urls = [{url:?}]");
    check(&format!("TOML {toml}"), &LockConfig::from_toml_str(&toml));
}

/// URLs of every scheme compiled in, with `secret` in every position.
fn urls(secret: &str) -> Vec<String> {
    let mut out = Vec::new();
    for s in forms(secret) {
        let mut userinfo = vec![format!("u:{s}@127.0.0.1:1"), format!(":{s}@127.0.0.1:1")];
        // A bare userinfo is a password to Redis; one with a `:` is `user:password`, and
        // the part before the `:` a user name, shown.
        if !s.contains(':') {
            userinfo.push(format!("{s}@127.0.0.1:1"));
        }
        let query = ["pass", "password", "PASSWORD", "sslpassword", "token"]
            .map(|name| format!("127.0.0.1:1?{name}={s}"));
        let query_then =
            ["pass", "password", "token"].map(|name| format!("127.0.0.1:1?{name}={s}&bogus=1"));
        for scheme in [
            "file",
            "memory",
            "redis",
            "rediss",
            "redis-cluster",
            "rediss-cluster",
            "redis+sentinel",
            "rediss+sentinel",
            "postgres",
            "etcd",
        ] {
            for rest in userinfo.iter().chain(&query).chain(&query_then) {
                out.push(format!("{scheme}://{rest}"));
            }
            // A bad port and a missing host, after the secret.
            out.push(format!("{scheme}://u:{s}@127.0.0.1:notaport/0"));
            out.push(format!("{scheme}://u:{s}@127.0.0.1:1/0?password={s}"));
            out.push(format!("{scheme}://u:{s}@/0"));
        }
        out.push(format!(
            "redlock://u:{s}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
        ));
        out.push(format!(
            "redlock://u:{s}@127.0.0.1:1,127.0.0.1:1,127.0.0.1:3"
        ));
        out.push(format!("redlock://u:{s}@127.0.0.1:1"));
        for unix in ["redis+unix", "unix"] {
            out.push(format!("{unix}:///tmp/no-such.sock?pass={s}"));
            out.push(format!("{unix}:///tmp/no-such.sock?db=1&pass={s}&bogus=x"));
            out.push(format!("{unix}:///tmp/no-such.sock?db=x&pass={s}"));
        }
        out.push(format!("redis://u:{s}@127.0.0.1:1/0?fair_queue_ms=abc"));
        out.push(format!(
            "redis+sentinel://u:{s}@127.0.0.1:1,127.0.0.1:2/leasehold?sentinel_password={s}"
        ));
        out.push(format!(
            "redis+sentinel://127.0.0.1:1/leasehold?sentinel_user=u&sentinel_password={s}&bogus=1"
        ));
        out.push(format!("postgres://u:{s}@127.0.0.1:1/db?sslmode=bogus"));
        out.push(format!("etcd://u:{s}@127.0.0.1:1?timeout_ms=x"));
        out.push(format!("etcds://u:{s}@127.0.0.1:1?ca=/no/such/file"));
        out.push(format!("nosuchscheme://u:{s}@h:1"));
        out.push(format!("u:{s}@h:1"));
    }
    // A libpq key=value string.
    out.push(format!("host=127.0.0.1 port=1 password={MARK}/?#@x user=u"));
    out.push(format!("host=127.0.0.1 port=1 password='{MARK} x' user=u"));
    out
}

// One thread (the leaks are recorded per thread), every URL checked at once: opening one
// waits for connections to a closed port and their retries.
#[tokio::test]
async fn no_url_shows_its_secret() {
    let mut checks = tokio::task::JoinSet::new();
    for (i, secret) in secrets().iter().enumerate() {
        for url in urls(secret) {
            // Opening takes time (connect timeouts): once, with the secret richest in
            // delimiters.
            checks.spawn(async move { check_url(&url, i == 1).await });
        }
    }
    while let Some(done) = checks.join_next().await {
        done.unwrap();
    }
    no_leaks();
}

#[test]
fn backend_tables_never_show_secrets() {
    for secret in secrets() {
        for scheme in ["redis", "redlock", "postgres", "etcd", "nosuch"] {
            let mut t = BackendTable::default();
            t.scheme = scheme.into();
            t.hosts = vec!["127.0.0.1:1".into()];
            t.user = Some("u".into());
            t.password = Some(secret.clone());
            for name in [
                "pass",
                "password",
                "Password",
                "sslpassword",
                "token",
                "backend_password",
            ] {
                t.options.insert(name.into(), secret.clone());
            }
            assert_hidden("Debug of BackendTable", &format!("{t:?}"));
            assert_hidden("BackendTable::redacted_url", &t.redacted_url());
            let mut cfg = LockConfig::default();
            cfg.backend = Some(t.clone());
            assert_hidden("Debug of LockConfig", &format!("{cfg:?}"));
            assert_hidden("Display of LockConfig", &cfg.to_string());
            check("validate([backend])", &cfg.validate());
            // A bare password, no user.
            t.user = None;
            assert_hidden("Debug of BackendTable", &format!("{t:?}"));

            let toml = format!(
                "[backend]\nscheme = {scheme:?}\nhosts = [\"127.0.0.1:1\"]\nuser = \"u\"\n\
                 password = {secret:?}\n[backend.options]\nsslpassword = {secret:?}\n\
                 token = {secret:?}\npass = {secret:?}\n"
            );
            check("TOML [backend]", &LockConfig::from_toml_str(&toml));
            let env = [("LEASEHOLD_BACKEND_PASSWORD", secret.as_str())];
            check(
                "[backend] with LEASEHOLD_BACKEND_PASSWORD",
                &LockConfig::from_toml_str(&format!("[backend]\nscheme = {scheme:?}\n"))
                    .and_then(|c| c.with_vars(env)),
            );
        }
    }
    no_leaks();
}

/// TOML errors never quote a value: a value of the wrong type may be the password itself.
#[test]
fn toml_errors_do_not_echo_values() {
    let numeric = "918273645501"; // a password made of digits, written without quotes
    for (toml, secret) in [
        (
            format!("[backend]\nscheme = \"redis\"\npassword = {numeric}"),
            numeric,
        ),
        (
            format!("[backend]\nscheme = \"redis\"\nuser = {numeric}"),
            numeric,
        ),
        (format!("url = {numeric}"), numeric),
        (
            format!("[backend]\nscheme = \"redis\"\n[backend.options]\ntoken = {numeric}"),
            numeric,
        ),
        (format!("require = \"{MARK}\""), MARK),
        (format!("ttl = \"{MARK}\""), MARK),
        (format!("ttl = \"5{MARK}\""), MARK),
        (format!("renewal = \"{MARK}\""), MARK),
        (format!("wait = {numeric}"), numeric),
        (format!("urls = \"redis://u:{MARK}@h\""), MARK),
        (format!("urls = [\"redis://u:{MARK}@h\", 5]"), MARK),
        (format!("key_prefix = 5\npassword = \"{MARK}\""), MARK),
        (
            format!("[backend]\nscheme = \"redis\"\nhosts = \"{MARK}\""),
            MARK,
        ),
        (
            format!("[backend]\nscheme = \"redis\"\npasword = \"{MARK}\""),
            MARK,
        ),
        (format!("\"{MARK}\""), MARK), // a value without its key
        (format!("url = \"redis://u:{MARK}@h\" junk"), MARK),
        (format!("url = 'redis://u:{MARK}@h"), MARK),
        (
            format!("[backend]\nscheme = \"redis\"\npassword = \"{MARK}\"\npassword = \"x\""),
            MARK,
        ),
    ] {
        let err = LockConfig::from_toml_str(&toml).expect_err(&toml);
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains(secret), "{toml:?} shows {secret}: {shown}");
        }
        // Still useful: it names the line.
        assert!(err.to_string().contains("line "), "{toml:?}: {err}");
    }
}

#[cfg(all(feature = "file", unix))]
#[test]
fn file_config() {
    use leasehold::FileConfig;
    let urls = [
        "file:///tmp/x?password={s}",
        "file:///tmp/x?token={s}&shared=true",
        "file://u:{s}@h/tmp",
    ];
    each_secret_in(&urls, |url| check(url, &FileConfig::from_url(url)));
    no_leaks();
}

#[cfg(feature = "redis")]
#[test]
fn redis_configs() {
    use leasehold::redis::{RedisConfig, RedlockConfig};
    let urls = [
        "redis://u:{s}@127.0.0.1:1/0",
        "redis://:{s}@127.0.0.1:1/0?fair_queue_ms=500",
        "rediss://u:{s}@127.0.0.1:1/0",
        "redis-cluster://u:{s}@127.0.0.1:1,127.0.0.1:2",
        "redis+unix:///tmp/r.sock?pass={s}",
        "redis+unix:///tmp/r.sock?db=1&pass={s}",
        "unix:///tmp/r.sock?pass={s}",
        "redis://u:{s}@127.0.0.1:x/0",
        "redis://u:{s}@127.0.0.1:1/0?fair_queue_ms=1",
    ];
    each_secret_in(&urls, |url| {
        check(url, &RedisConfig::from_url(url));
        check(url, &RedisConfig::cluster([url]));
    });
    each_secret_in(&["redis://u:{s}@127.0.0.1:"], |node| {
        let nodes = [1, 2, 3].map(|p| format!("{node}{p}/0"));
        check("redlock nodes", &RedlockConfig::from_urls(&nodes));
        let twice = [1, 1, 3].map(|p| format!("{node}{p}/0"));
        check("redlock nodes twice", &RedlockConfig::from_urls(&twice));
        check("redlock one node", &RedlockConfig::from_urls(&nodes[..1]));
    });
    no_leaks();
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_config() {
    use leasehold::postgres::PostgresConfig;
    let urls = [
        "postgres://u:{s}@127.0.0.1:1/db",
        "postgresql://u:{s}@127.0.0.1:1/db?sslmode=require",
        "postgres://127.0.0.1:1/db?password={s}",
        "postgres://u:{s}@127.0.0.1:1/db?sslmode=nope",
        "postgres://u:{s}@127.0.0.1:1/db?nosuch=1",
        "postgres://u:{s}@127.0.0.1:1/db?sslrootcert=/no/such",
        "host=127.0.0.1 user=u password={s}",
        "host=127.0.0.1 user=u password='{s}' sslmode=nope",
    ];
    each_secret_in(&urls, |url| check(url, &PostgresConfig::from_url(url)));
    no_leaks();
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_config() {
    use leasehold::etcd::EtcdConfig;
    for secret in secrets() {
        let c = EtcdConfig::new(["127.0.0.1:1"]).with_user("u", secret.clone());
        assert_hidden("Debug of EtcdConfig", &format!("{c:?}"));
    }
    let urls = [
        "etcd://u:{s}@127.0.0.1:1",
        "etcd://u:{s}@127.0.0.1:1,127.0.0.1:2?prefix=p/",
        "etcd://u:{s}@127.0.0.1",
        "etcd://u:{s}@127.0.0.1:1?nosuch=1",
        "etcd://u:{s}@127.0.0.1:1/path",
        "etcd://127.0.0.1:1?token={s}",
        "etcd://127.0.0.1:1?password={s}",
        "etcds://u:{s}@127.0.0.1:1?ca=/no/such",
    ];
    each_secret_in(&urls, |url| check(url, &EtcdConfig::from_url(url)));
    no_leaks();
}
