//! `leasehold elect` and `leasehold leader`, what a script sees: the command's environment
//! (`LEASEHOLD_TERM` equal to `LEASEHOLD_FENCING_TOKEN`, no credentials), its status passed on
//! with the leadership resigned at once, `leader` with and without a leader, the signals while
//! campaigning and while leading, a backend that does not answer yet, and Redlock's refusal
//! (78). The failovers are in `elect_failover.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::election::{Candidate, IDLE, Seen, leader, until_leader};
use common::{folder, on_key, redlock_url, stderr, stdout};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use nix::sys::signal::Signal;

/// `elect -- sh -c 'print the environment; exit 3'` on Redis with a 30 s TTL, with and
/// without `--once`: the command sees its term twice and no credentials, `elect` exits 3, and
/// the leadership is resigned (no leader right after, not 30 s later); the second term is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_its_term_and_its_end_resigns() {
    let redis = require_service!(Service::Redis);
    let rt = folder("elect-env");
    let key = unique_prefix("elect-env");
    let url = redis.url();
    let script = "echo \"$LEASEHOLD_TERM $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_KEY \
                  $LEASEHOLD_BACKEND ${LEASEHOLD_URL-unset}\"; exit 3";
    let mut terms = Vec::new();
    for once in [true, false] {
        let mut args = vec!["elect", "--key", &key, "--value", "me", "--ttl", "30s"];
        if once {
            args.push("--once");
        }
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let mut cmd = common::lh(&rt, &args);
        // The backend from the environment: it must not reach the command.
        cmd.env("LEASEHOLD_URL", url);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("in time")
            .expect("runs");
        assert_eq!(out.status.code(), Some(3), "--once {once}: {out:?}");
        let seen = stdout(&out);
        let f: Vec<&str> = seen.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{seen:?}");
        assert_eq!(
            f[0], f[1],
            "LEASEHOLD_TERM and LEASEHOLD_FENCING_TOKEN: {seen:?}"
        );
        assert_eq!(&f[2..], [key.as_str(), "redis", "unset"], "{seen:?}");
        terms.push(f[0].parse::<u64>().unwrap());
        assert!(stderr(&out).contains("leader of"), "{out:?}");
        // Resigned: nobody leads now, long before the 30 s TTL.
        let none = on_key(&rt, "leader", &key, url, &[]).await;
        assert_eq!(none.status.code(), Some(1), "{none:?}");
        assert!(stdout(&none).contains("has no leader"), "{none:?}");
    }
    assert!(terms[1] > terms[0], "terms {terms:?}");
}

/// `leader` names the leader (text and JSON, exit 0) while one leads, and says there is none
/// (exit 1) on a key nobody campaigns for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_names_the_leader_or_none() {
    let etcd = require_service!(Service::Etcd);
    let rt = folder("elect-leader");
    let dir = folder("elect-leader-out");
    let url = format!(
        "etcd://{}?prefix={}/",
        etcd.urls().join(","),
        unique_prefix("leader")
    );
    assert_eq!(leader(&rt, "nobody", &url).await, None);
    let mut a = Candidate::start(&rt, &dir, ("job", &url), "10.0.0.7:8080", &[], IDLE, &[]);
    let (seen, _) = until_leader(&rt, ("job", &url), Duration::from_secs(20), |_| true).await;
    assert_eq!(seen.value, "10.0.0.7:8080");
    a.ran_under(seen.term, Duration::from_secs(10)).await;
    let text = on_key(&rt, "leader", "job", &url, &[]).await;
    assert_eq!(text.status.code(), Some(0), "{text:?}");
    assert_eq!(
        stdout(&text),
        format!("leader: 10.0.0.7:8080\nterm: {}\n", seen.term)
    );
    a.signal(Signal::SIGTERM);
    // The signal goes on to the command (`sleep`, ended by it), then `elect` resigns.
    assert_eq!(
        a.exit(Duration::from_secs(15)).await,
        Some(143),
        "{}",
        a.stderr()
    );
    assert_eq!(leader(&rt, "job", &url).await, None);
}

/// SIGTERM while campaigning gives up (143); SIGINT while leading goes to the command, and
/// `elect` exits with its status (130) and resigns, so the other candidate leads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_while_campaigning_and_while_leading() {
    let rt = folder("elect-signals");
    let dir = folder("elect-signals-out");
    let url = format!("file://{}", dir.join("locks").display());
    let key = ("k", url.as_str());
    let limit = Duration::from_secs(20);
    let mut a = Candidate::start(&rt, &dir, key, "a", &[], IDLE, &[]);
    let (first, _) = until_leader(&rt, key, limit, |_| true).await;
    a.ran_under(first.term, limit).await;
    let mut b = Candidate::start(&rt, &dir, key, "b", &[], IDLE, &[]);
    let mut c = Candidate::start(&rt, &dir, key, "c", &[], IDLE, &[]);
    common::eventually("b and c campaign", limit, || {
        b.stderr().contains("waiting to lead") && c.stderr().contains("waiting to lead")
    })
    .await;
    b.signal(Signal::SIGTERM);
    assert_eq!(b.exit(limit).await, Some(143));
    assert!(
        b.stderr().contains("stopped by SIGTERM while campaigning"),
        "{}",
        b.stderr()
    );
    assert!(b.ran().is_empty(), "b never led");
    a.signal(Signal::SIGINT);
    assert_eq!(a.exit(limit).await, Some(130), "{}", a.stderr());
    let (next, _) = until_leader(&rt, key, limit, |s: &Seen| s.value == "c").await;
    assert!(next.term > first.term, "{next:?} after {first:?}");
    c.ran_under(next.term, limit).await;
    c.signal(Signal::SIGTERM);
    assert_eq!(c.exit(limit).await, Some(143));
}

/// A backend that does not answer yet keeps `elect` trying (it neither leads nor exits);
/// SIGTERM then ends it (143).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_does_not_answer_keeps_it_trying() {
    let rt = folder("elect-down");
    let dir = folder("elect-down-out");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut a = Candidate::start(&rt, &dir, ("k", &url), "a", &[], IDLE, &[]);
    // Until it says so (once; a debug build's start can take seconds on a loaded machine),
    // then a while longer: it must still be trying.
    common::eventually("the retry notice", Duration::from_secs(15), || {
        a.stderr().contains("trying again")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        a.child.try_wait().unwrap().is_none(),
        "elect gave up: {}",
        a.stderr()
    );
    assert!(a.ran().is_empty());
    a.signal(Signal::SIGTERM);
    assert_eq!(
        a.exit(Duration::from_secs(15)).await,
        Some(143),
        "{}",
        a.stderr()
    );
}

/// Redlock gives no elections: `elect` and `leader` exit 78 with the reason, and the command
/// never runs. A bad `--value` is a usage error (2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_is_refused_and_bad_values_are_usage_errors() {
    let nodes = require_service!(Service::Redlock);
    let url = redlock_url(nodes.urls());
    let rt = folder("elect-redlock");
    let marker = rt.join("ran");
    let touch = format!("touch {}", marker.display());
    let out = on_key(
        &rt,
        "elect",
        "k",
        &url,
        &["--value", "a", "--", "sh", "-c", &touch],
    )
    .await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(stderr(&out).contains("does not give elections"), "{out:?}");
    assert!(!marker.exists(), "the command ran");
    let out = on_key(&rt, "leader", "k", &url, &["--json"]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(stderr(&out).contains("does not give elections"), "{out:?}");
    let out = on_key(&rt, "elect", "k", &url, &["--value", "", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
