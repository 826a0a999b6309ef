//! URL parsing of every scheme: the facade (registry and `LockConfig`) and each driver's own
//! parser. None may panic, and none may show a password in a `Debug` output or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// What the first byte puts in front of the rest (the empty string: the rest as it is).
const SCHEMES: &[&str] = &[
    "",
    "memory://",
    "file://",
    "redis://",
    "rediss://",
    "redis+unix://",
    "unix://",
    "redis-cluster://",
    "redlock://",
    "postgres://",
    "postgresql://",
    "etcd://",
    "etcds://",
];

/// The secret planted in the URL; no output may contain it.
const SECRET: &str = "Hx7SECRETq";

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(rest) = std::str::from_utf8(rest) else {
        return;
    };
    let scheme = SCHEMES[usize::from(pick) % SCHEMES.len()];
    // The high bits plant a secret where every scheme may carry one. An option goes only
    // after a rest without `?` or `#`: after them it would be part of another option's value
    // (`?prefix=a?password=…`) or of the fragment, which are shown.
    // Without a scheme the text is no URL (PostgreSQL reads `key=value` words): nothing is
    // planted.
    let options = !rest.contains(['?', '#']);
    let pick = if scheme.is_empty() { pick % 32 } else { pick };
    let planted = match pick / 32 {
        2..=4 if !options => None,
        1 => Some(format!("{scheme}user:{SECRET}@{rest}")),
        2 => Some(format!("{scheme}{rest}?password={SECRET}")),
        3 => Some(format!("{scheme}{rest}?db=0&pass={SECRET}")),
        4 => Some(format!("{scheme}{rest}?sslpassword={SECRET}")),
        _ => None,
    };
    match planted {
        // The fuzzer may copy the marker into the rest, where it is no secret.
        Some(url) if !rest.to_ascii_uppercase().contains("SECRET") => {
            for shown in parse(&url) {
                assert!(
                    !shown.contains(SECRET),
                    "{url:?} shows its password: {shown}"
                );
            }
        }
        _ => drop(parse(&format!("{scheme}{rest}"))),
    }
});

/// Parses `url` every way leasehold does; returns everything that parsing shows.
fn parse(url: &str) -> Vec<String> {
    let mut shown = vec![leasehold::redact(url)];
    let mut show = |r: Result<String, leasehold::Error>| {
        shown.push(match r {
            Ok(debug) => debug,
            Err(e) => format!("{e} {e:?}"),
        });
    };
    let config = leasehold::LockConfig::new(url);
    show(config.validate().map(|()| format!("{config:?} {config}")));
    let nodes = leasehold::LockConfig::from_toml_str("urls = [\"redis://127.0.0.1\"]")
        .and_then(|c| c.with_vars([("LEASEHOLD_URLS", format!("{url},{url}"))]));
    show(nodes.map(|c| format!("{c:?}")));
    show(leasehold_file::FileConfig::from_url(url).map(|c| format!("{c:?}")));
    show(leasehold_redis::RedisConfig::from_url(url).map(|c| format!("{c:?}")));
    show(leasehold_redis::RedlockConfig::from_url(url).map(|c| format!("{c:?}")));
    show(leasehold_postgres::PostgresConfig::from_url(url).map(|c| format!("{c:?}")));
    show(leasehold_etcd::EtcdConfig::from_url(url).map(|c| format!("{c:?}")));
    shown
}
