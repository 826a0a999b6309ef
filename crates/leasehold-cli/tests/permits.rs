//! `--permits N` end to end on the local file backend: `acquire` holds permits, `run
//! --no-wait` exits 75 when all N are taken, `status --permits` lists the holders (0 when one
//! is held, 1 when none), another N exits 78, and `release` gives a permit back. Redlock's
//! refusal is 78 with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;

fn url(dir: &std::path::Path) -> String {
    format!("file://{}", dir.join("locks").display())
}

#[tokio::test]
async fn permits_from_the_shell() {
    let rt = folder("cli_permits");
    let u = url(&rt);
    let two = ["--permits", "2"];
    let a = on_key(&rt, "acquire", "pool", &u, &two).await;
    assert_eq!(a.status.code(), Some(0), "{a:?}");
    let b = on_key(&rt, "acquire", "pool", &u, &two).await;
    assert_eq!(b.status.code(), Some(0), "{b:?}");
    let (ea, eb) = (exports(&a), exports(&b));
    assert_ne!(ea["LEASEHOLD_FENCING_TOKEN"], eb["LEASEHOLD_FENCING_TOKEN"]);

    let full = run_true(&rt, "pool", &u, &["--permits", "2", "--no-wait"]).await;
    assert_eq!(full.status.code(), Some(75), "{full:?}");
    // The lock of the same name is another thing: free.
    let lock = run_true(&rt, "pool", &u, &["--no-wait"]).await;
    assert_eq!(lock.status.code(), Some(0), "{lock:?}");

    let st = on_key(&rt, "status", "pool", &u, &two).await;
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    assert!(stdout(&st).contains("2 of 2 permits held"), "{st:?}");
    let json = on_key(&rt, "status", "pool", &u, &["--permits", "2", "--json"]).await;
    assert!(
        stdout(&json).contains("\"permits\":2,\"held\":2"),
        "{json:?}"
    );

    let other = run_true(&rt, "pool", &u, &["--permits", "3", "--no-wait"]).await;
    assert_eq!(other.status.code(), Some(78), "{other:?}");
    assert!(
        stderr(&other).contains("in use with 2 permits"),
        "{other:?}"
    );

    let rel = output(&rt, &["release", "--handle", &ea["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let runs = run_true(&rt, "pool", &u, &["--permits", "2", "--no-wait"]).await;
    assert_eq!(runs.status.code(), Some(0), "a permit came back: {runs:?}");
    let rel = on_key(&rt, "release", "pool", &u, &two).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let st = on_key(&rt, "status", "pool", &u, &two).await;
    assert_eq!(st.status.code(), Some(1), "none held: {st:?}");
}

#[tokio::test]
async fn a_backend_without_semaphores_exits_78_with_the_reason() {
    let rt = folder("cli_permits_redlock");
    let u = "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";
    let out = run_true(&rt, "k", u, &["--permits", "2", "--no-wait"]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(stderr(&out).contains("does not give semaphores"), "{out:?}");
}
