//! What LockLayer costs per request, on the in-memory backend (so the lock itself is as cheap
//! as it gets and the layer's own overhead shows).
//!
//! ```text
//! cargo run --release -p leasehold-tower --example overhead
//! cargo run --release -p leasehold-tower --example overhead --features metrics   # with a recorder
//! ```
//!
//! Three ways to serve the same trivial request, interleaved round by round (the order rotates
//! each round) on one current-thread runtime:
//!
//! - `bare`: the inner service alone;
//! - `locker`: by hand, `Locker::try_acquire`, the inner service, `Lease::release`;
//! - `layer`: the inner service behind `LockLayer` (try mode), which releases on drop in the
//!   background.
//!
//! Every request takes a fresh key and is followed by one `yield_now`, so background releases
//! run (and are paid for) inside the measurement. The report is the median over rounds of the
//! time per request, and the median over rounds of the per-round ratios.
//!
//! With the `metrics` feature, every variant runs under a recording recorder
//! (`metrics-util`'s debugging recorder, whose registry is the one the Prometheus exporter
//! uses), and a fourth variant, `layer, no recorder`, runs the layer under a no-op recorder in
//! the same rounds: their ratio is the cost of recording.
//!
//! Arguments: `[rounds] [requests per round]` (default 21 × 20000).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::{Duration, Instant};

use leasehold_core::{Locker, MemoryBackend};
use leasehold_tower::LockLayer;
use tower::{Layer, Service, ServiceExt, service_fn};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    Locker,
    Layer,
    /// The layer, with a no-op recorder instead of the recording one (`metrics` feature).
    LayerNoRecorder,
}

const VARIANTS: [Variant; 4] = [
    Variant::Bare,
    Variant::Locker,
    Variant::Layer,
    Variant::LayerNoRecorder,
];

/// Runs one variant under the recorder it calls for.
async fn run_under(variant: Variant, locker: &Locker, n: u64, base: u64) -> Duration {
    #[cfg(feature = "metrics")]
    {
        let noop = metrics::NoopRecorder;
        let _guard = (variant == Variant::LayerNoRecorder)
            .then(|| metrics::set_default_local_recorder(&noop));
        run(variant, locker, n, base).await
    }
    #[cfg(not(feature = "metrics"))]
    run(variant, locker, n, base).await
}

/// The request: an `http` request whose body is its key (the layer puts the lease into its
/// extensions, as it would for a real service).
type Req = http::Request<String>;

async fn inner(req: Req) -> Result<usize, Infallible> {
    Ok(std::hint::black_box(req.body().len()))
}

async fn run(variant: Variant, locker: &Locker, n: u64, base: u64) -> Duration {
    let svc = service_fn(inner);
    let layered = LockLayer::new(locker.clone(), |req: &Req| Some(req.body().clone())).layer(svc);
    let started = Instant::now();
    for i in 0..n {
        let key = format!("bench/{}", base + i);
        let req = http::Request::new(key.clone());
        match variant {
            Variant::Bare => {
                let mut s = svc;
                let out = s.ready().await.unwrap().call(req).await.unwrap();
                std::hint::black_box(out);
            }
            Variant::Locker => {
                let lease = locker.try_acquire(key.as_str()).await.unwrap().unwrap();
                let mut s = svc;
                let out = s.ready().await.unwrap().call(req).await.unwrap();
                std::hint::black_box(out);
                lease.release().await.unwrap();
            }
            Variant::Layer | Variant::LayerNoRecorder => {
                let mut s = layered.clone();
                let out = s.ready().await.unwrap().call(req).await.unwrap();
                std::hint::black_box(out);
            }
        }
        tokio::task::yield_now().await;
    }
    started.elapsed()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(21, |a| a.parse().expect("rounds"));
    let n: u64 = args.next().map_or(20_000, |a| a.parse().expect("requests"));

    #[cfg(feature = "metrics")]
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    #[cfg(feature = "metrics")]
    let _guard = metrics::set_default_local_recorder(&recorder);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let locker = Locker::new(MemoryBackend::new());
    let variants = if cfg!(feature = "metrics") { 4 } else { 3 };
    let mut per_request: [Vec<f64>; 4] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut layer_vs_locker = Vec::new();
    let mut layer_vs_bare = Vec::new();
    let mut recorder_vs_noop = Vec::new();
    let mut base = 0;
    rt.block_on(async {
        // Warm-up.
        for v in &VARIANTS[..variants] {
            run_under(*v, &locker, n / 10, base).await;
            base += n;
        }
        for round in 0..rounds {
            let mut ns = [0.0; 4];
            for k in 0..variants {
                let i = (round + k) % variants;
                let elapsed = run_under(VARIANTS[i], &locker, n, base).await;
                base += n;
                ns[i] = elapsed.as_nanos() as f64 / n as f64;
            }
            for i in 0..variants {
                per_request[i].push(ns[i]);
            }
            layer_vs_locker.push(ns[2] / ns[1]);
            layer_vs_bare.push(ns[2] - ns[0]);
            recorder_vs_noop.push(ns[2] / ns[3]);
        }
    });

    let [bare, by_hand, layer, layer_noop] =
        per_request.map(|v| if v.is_empty() { 0.0 } else { median(v) });
    println!(
        "LockLayer overhead, memory backend, {rounds} rounds x {n} requests, metrics feature {}",
        if cfg!(feature = "metrics") {
            "on (recorder installed)"
        } else {
            "off"
        }
    );
    println!();
    println!("| variant | ns per request (median) |");
    println!("|---|---:|");
    println!("| bare service | {bare:.0} |");
    println!("| Locker by hand (try_acquire, call, release) | {by_hand:.0} |");
    println!("| LockLayer (try mode) | {layer:.0} |");
    if variants == 4 {
        println!("| LockLayer (try mode), no-op recorder | {layer_noop:.0} |");
    }
    println!();
    println!(
        "LockLayer / Locker by hand: {:.2}x (median of per-round ratios)",
        median(layer_vs_locker)
    );
    println!(
        "LockLayer minus bare service: {:.0} ns per request (median)",
        median(layer_vs_bare)
    );
    if variants == 4 {
        println!(
            "LockLayer with a recording recorder / with a no-op one: {:.2}x (median of per-round ratios)",
            median(recorder_vs_noop)
        );
    }
}
