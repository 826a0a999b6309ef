//! An axum service guarded by leasehold: `LockLayer` around the handler that increments a
//! counter, `FenceLayer` in front of the store it writes, Prometheus metrics at `/metrics`.
//! The backend comes from configuration only (see `leasehold_examples::counters`).
//!
//! ```text
//! cargo run -p leasehold-examples --example axum_service                 # in-memory backend
//! cargo run -p leasehold-examples --example axum_service -- locks.toml   # a LockConfig file
//! LEASEHOLD_URL=postgres://user:pw@127.0.0.1/db \
//!     cargo run -p leasehold-examples --example axum_service             # or the environment
//!
//! curl -X POST 'localhost:3000/counters/a/increment?work_ms=500' &
//! curl -X POST localhost:3000/counters/a/increment    # waits for the first (wait budget)
//! curl localhost:3000/counters/a
//! curl localhost:3000/metrics
//! ```
//!
//! `LISTEN` sets the address (default `127.0.0.1:3000`).

use std::path::PathBuf;
use std::time::Duration;

use leasehold_examples::counters::{Store, load_config, router};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let path = std::env::args_os().nth(1).map(PathBuf::from);
    let config = load_config(path.as_deref())?;
    let locker = config.build().await?;
    // The Debug form of a LockConfig hides passwords.
    println!(
        "backend: {}, {config:?}",
        locker.backend().capabilities().name
    );

    // The Prometheus recorder, without its own HTTP listener: the service renders it.
    let handle = PrometheusBuilder::new().install_recorder()?;
    leasehold::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let app = router(locker, config.wait_budget(), Store::new(), Some(handle));
    let addr = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
