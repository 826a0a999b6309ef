//! PostgresFenceStore: shared by replicas, atomic per resource.

use leasehold_core::FencingToken;
use leasehold_core::fence::{Admission, FenceStore};
use leasehold_postgres::PostgresFenceStore;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

#[tokio::test]
async fn postgres_store_is_shared_and_atomic() {
    let ep = require_service!(Service::Postgres);
    let table = unique_prefix("fence").replace('-', "_");
    let a = PostgresFenceStore::connect(ep.url(), &table).await.unwrap();
    let b = PostgresFenceStore::connect(ep.url(), &table).await.unwrap();
    let t = FencingToken::new;
    assert_eq!(a.admit("r", t(5)).await.unwrap(), Admission::Accepted);
    assert_eq!(
        b.admit("r", t(3)).await.unwrap(),
        Admission::Stale { highest: t(5) }
    );
    assert_eq!(b.admit("r", t(5)).await.unwrap(), Admission::Accepted);
    assert_eq!(b.admit("r", t(9)).await.unwrap(), Admission::Accepted);
    assert_eq!(
        a.admit("r", t(8)).await.unwrap(),
        Admission::Stale { highest: t(9) }
    );
    assert_eq!(a.admit("other", t(1)).await.unwrap(), Admission::Accepted);

    // Concurrent admissions in random order: the highest wins, and every token admitted
    // after it was not lower.
    let store = std::sync::Arc::new(a);
    let mut tasks = Vec::new();
    for n in 10..40u64 {
        let s = std::sync::Arc::clone(&store);
        tasks.push(tokio::spawn(async move { s.admit("race", t(n)).await }));
    }
    for task in tasks {
        assert!(task.await.unwrap().is_ok());
    }
    assert_eq!(
        store.admit("race", t(38)).await.unwrap(),
        Admission::Stale { highest: t(39) }
    );
    assert!(
        store.admit("r", t(u64::MAX)).await.is_err(),
        "a token beyond bigint is refused"
    );
    assert!(
        PostgresFenceStore::connect(ep.url(), "bad; drop")
            .await
            .is_err()
    );

    let (client, conn) = tokio_postgres::connect(ep.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();
}
