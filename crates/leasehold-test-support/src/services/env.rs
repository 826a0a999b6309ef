//! The service configuration: the env file of `scripts/services up`, overridden by the process
//! environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::kind::Service;

/// Name of the variable holding the state directory of `scripts/services`.
pub const SERVICES_DIR_VAR: &str = "LEASEHOLD_SERVICES_DIR";

/// Name of the variable holding the absolute path of `scripts/services`.
pub const SERVICES_SCRIPT_VAR: &str = "LEASEHOLD_SERVICES_SCRIPT";

/// Name of the variable holding the path of the throwaway CA certificate
/// (PEM) that signed the certificate of every TLS server of the harness.
pub const TLS_CA_VAR: &str = "LEASEHOLD_TEST_TLS_CA";

/// Name of the variable holding the user for [`Service::EtcdSecure`].
pub const ETCD_USER_VAR: &str = "LEASEHOLD_TEST_ETCD_USER";

/// Name of the variable holding the password for [`Service::EtcdSecure`].
pub const ETCD_PASSWORD_VAR: &str = "LEASEHOLD_TEST_ETCD_PASSWORD";

/// Name of the variable holding the ACL user (with a password) of [`Service::Redis`], beside
/// its default user without one.
pub const REDIS_ACL_USER_VAR: &str = "LEASEHOLD_TEST_REDIS_ACL_USER";

/// Name of the variable holding the password of [`REDIS_ACL_USER_VAR`].
pub const REDIS_ACL_PASSWORD_VAR: &str = "LEASEHOLD_TEST_REDIS_ACL_PASSWORD";

/// The root of the cargo workspace (two levels above this crate's manifest).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// The env file written by `scripts/services up`:
/// `$LEASEHOLD_SERVICES_DIR/env` if set, else `<root>/target/services/env`.
pub fn env_file() -> PathBuf {
    match non_empty_var(SERVICES_DIR_VAR) {
        Some(dir) => PathBuf::from(dir).join("env"),
        None => workspace_root().join("target").join("services").join("env"),
    }
}

/// The merged service configuration: the env file's `KEY=VALUE` lines, with
/// process environment variables of the same names taking precedence. Read
/// afresh on each call (the file may appear while tests run).
pub fn config() -> BTreeMap<String, String> {
    let mut map = std::fs::read_to_string(env_file())
        .map(|text| parse_env(&text))
        .unwrap_or_default();
    let keys = Service::ALL.iter().map(|s| s.env_key()).chain([
        SERVICES_DIR_VAR,
        SERVICES_SCRIPT_VAR,
        TLS_CA_VAR,
        ETCD_USER_VAR,
        ETCD_PASSWORD_VAR,
        REDIS_ACL_USER_VAR,
        REDIS_ACL_PASSWORD_VAR,
    ]);
    for key in keys {
        if let Some(value) = non_empty_var(key) {
            map.insert(key.to_owned(), value);
        }
    }
    map
}

/// One configured value (see [`config`]); `None` when absent or empty.
pub fn var(key: &str) -> Option<String> {
    non_empty_var(key).or_else(|| config().remove(key).filter(|v| !v.is_empty()))
}

/// The throwaway CA certificate (PEM file) of the harness's TLS servers
/// ([`TLS_CA_VAR`]), if configured and the file exists.
pub fn tls_ca() -> Option<PathBuf> {
    var(TLS_CA_VAR).map(PathBuf::from).filter(|p| p.is_file())
}

/// Whether we run under CI: the `CI` variable is `true` or `1`.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| truthy(&v))
}

/// The variable that lets a test whose service is missing skip: [`ALLOW_SKIP_VAR`]`=1`.
pub const ALLOW_SKIP_VAR: &str = "LEASEHOLD_ALLOW_SKIP";

/// Whether a test whose service is missing may skip instead of failing: only when
/// [`ALLOW_SKIP_VAR`] is `1` (or `true`) and `CI` is not `true`/`1`. Anything else — `CI`
/// unset, or `CI=false` inherited from a parent environment — fails, so a missing service
/// never turns into a silent pass.
pub fn may_skip() -> bool {
    skip_allowed(
        std::env::var("CI").ok().as_deref(),
        std::env::var(ALLOW_SKIP_VAR).ok().as_deref(),
    )
}

fn skip_allowed(ci: Option<&str>, allow_skip: Option<&str>) -> bool {
    !ci.is_some_and(truthy) && allow_skip.is_some_and(truthy)
}

fn truthy(v: &str) -> bool {
    let v = v.trim();
    v == "1" || v.eq_ignore_ascii_case("true")
}

pub(super) fn non_empty_var(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

/// Parses `KEY=VALUE` lines; blank lines and `#` comments are skipped, an
/// optional `export ` prefix and matching surrounding quotes are removed.
fn parse_env(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| {
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (key, value) = line.split_once('=')?;
            let value = value.trim();
            let value = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(value);
            Some((key.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_an_explicit_opt_out_skips() {
        use super::skip_allowed;
        assert!(!skip_allowed(None, None));
        assert!(
            !skip_allowed(Some("false"), None),
            "CI=false alone must not skip"
        );
        assert!(!skip_allowed(Some("0"), Some("0")));
        assert!(!skip_allowed(Some("true"), Some("1")), "CI wins");
        assert!(skip_allowed(None, Some("1")));
        assert!(skip_allowed(Some("false"), Some("true")));
    }

    use super::*;

    #[test]
    fn parses_env_files() {
        let map = parse_env("# c\n\nA=1\nexport B = \"two\"\nC='x=y'\nbad line\n");
        assert_eq!(map.get("A").map(String::as_str), Some("1"));
        assert_eq!(map.get("B").map(String::as_str), Some("two"));
        assert_eq!(map.get("C").map(String::as_str), Some("x=y"));
        assert_eq!(map.len(), 3);
    }
}
