//! Unit tests of `lib.rs`.

use super::*;

#[test]
fn file_names_are_safe_stable_and_bounded() {
    let k = |s: &str| LockKey::new(s).unwrap();
    assert_eq!(file_name(&k("nightly")), "nightly");
    assert_eq!(file_name(&k("jobs/nightly run")), "jobs%2Fnightly%20run");
    assert_eq!(file_name(&k("..")), "%2E.");
    let long = file_name(&k(&"x".repeat(500)));
    assert!(long.len() < 200 && long.contains('~'), "{long}");
    assert_ne!(long, file_name(&k(&"x".repeat(499))));
}

#[test]
fn urls() {
    assert_eq!(
        FileConfig::from_url("file:///var/lock/app").unwrap().dir(),
        Path::new("/var/lock/app")
    );
    assert_eq!(
        FileConfig::from_url("file://").unwrap(),
        FileConfig::default()
    );
    assert_eq!(
        FileConfig::from_url("file://relative").unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    let c = FileConfig::from_url("file:///l?check_interval_ms=250&shared=true").unwrap();
    assert_eq!(c.check_interval, Duration::from_millis(250));
    assert!(c.is_shared());
    for bad in [
        "file:///l?check_interval_ms=soon",
        "file:///l?check_interval=1",
    ] {
        assert_eq!(
            FileConfig::from_url(bad).unwrap_err().kind(),
            ErrorKind::InvalidConfig,
            "{bad}"
        );
    }
}
