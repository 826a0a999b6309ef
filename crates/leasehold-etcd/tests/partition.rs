//! A real network partition of a 3-member etcd cluster: each member in a network namespace of
//! its own (`leasehold_test_support::netns`, needs root), the clients in the root namespace.
//! The leader is cut off from the other two members and from every client; the holder that
//! reaches the cluster only through it is told it lost within the session TTL, nobody else gets
//! the lock before that, the fenced resource rejects the old holder's token, and once healed the
//! old leader serves again without a restart. Own test binary: one partition at a time.

mod common;

use std::time::Duration;

use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::etcd::leader_index;
use leasehold_test_support::fence::FencedResource;
use leasehold_test_support::netns::Net;
use tokio::time::{Instant, sleep, timeout};

async fn backend(endpoints: Vec<String>, prefix: &str) -> EtcdBackend {
    let cfg = EtcdConfig::new(endpoints)
        .with_prefix(prefix)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_lease_mode(LeaseMode::Session)
        .with_session_ttl(common::SESSION_TTL)
        .with_request_timeout(Duration::from_secs(2));
    EtcdBackend::connect(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolating_the_leader_ends_its_holders_lease_and_no_one_else_gets_it_first() {
    let net = Net::create("etcd", 3).unwrap_or_else(|e| panic!("netns: {e}"));
    let endpoints = net
        .etcd_cluster()
        .await
        .unwrap_or_else(|e| panic!("etcd in namespaces: {e}"));
    let lead = leader_index(&endpoints)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let node = lead + 1;
    let followers: Vec<String> = (0..3)
        .filter(|i| *i != lead)
        .map(|i| endpoints[i].clone())
        .collect();
    // The holder reaches the cluster only through the leader (the minority side once cut),
    // the other client only through the two followers.
    let prefix = common::prefix("partition");
    let holder = common::locker(backend(vec![endpoints[lead].clone()], &prefix).await);
    let other = common::locker(backend(followers, &prefix).await);
    let resource = FencedResource::new();

    let lease = holder
        .try_acquire("job")
        .await
        .unwrap()
        .expect("a free lock");
    let old = lease.fencing_token().expect("etcd mints tokens");
    resource.write("job", old).expect("the first write");
    net.cut(node).unwrap();
    // Read once the link is down: the members exchange heartbeats all the time, so a count
    // read before the cut may miss packets sent in between.
    let sent = net.tx_packets(node).unwrap();
    let t0 = Instant::now();
    let signal = lease.lost();
    let told = tokio::spawn(async move {
        let reason = signal.await;
        (t0.elapsed(), reason)
    });

    // The other side tries all along; it may win only once the holder has been told.
    let mut winner = None;
    while t0.elapsed() < common::SESSION_TTL * 4 {
        if let Ok(Ok(Some(l))) = timeout(Duration::from_secs(3), other.try_acquire("job")).await {
            assert!(
                lease.is_lost(),
                "double grant: the majority granted the lock at {:?} while the isolated \
                 holder still believed it held it",
                t0.elapsed()
            );
            winner = Some(l);
            break;
        }
        sleep(Duration::from_millis(200)).await;
    }
    let granted_at = t0.elapsed();
    let (told_at, reason) = timeout(Duration::from_secs(1), told)
        .await
        .expect("the isolated holder was never told")
        .unwrap();
    let winner = winner.expect("the majority never granted the lock again");
    eprintln!(
        "leader m{node} cut: holder told at {told_at:?} ({reason}); majority granted at \
         {granted_at:?}"
    );
    // Told within the session TTL (its validity counts from before the last keep-alive was
    // sent), with slack for a loaded machine.
    assert!(
        told_at <= common::SESSION_TTL + Duration::from_secs(2),
        "told only after {told_at:?}"
    );
    let new = winner.fencing_token().unwrap();
    assert!(new > old, "tokens went back: {new:?} after {old:?}");
    resource.write("job", new).expect("the new holder's write");
    let stale = resource
        .write("job", old)
        .expect_err("the old holder's write got through");
    assert_eq!(stale.given, old.get());
    assert!(
        net.tx_packets(node).unwrap() == sent,
        "packets reached the cut member"
    );

    // Healed: the old leader serves again, without a restart, through its own endpoint.
    net.heal(node).unwrap();
    assert!(winner.release().await.unwrap());
    let again = holder
        .acquire("job", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the healed member does not serve: {e}"));
    assert!(again.fencing_token().unwrap() > new);
    assert!(again.release().await.unwrap());
}
