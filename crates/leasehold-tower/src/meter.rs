//! The per-route outcome counter of `LockLayer` (the `metrics` feature); empty without it.

#[cfg(feature = "metrics")]
use metrics::SharedString;

/// The `route` label of one request, and the counter its outcome goes to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meter {
    #[cfg(feature = "metrics")]
    route: Option<SharedString>,
}

/// The `route` label of requests whose layer names no route and whose extractor derives none.
#[cfg(feature = "metrics")]
const NO_ROUTE: &str = "unnamed";

impl Meter {
    #[cfg(feature = "metrics")]
    pub(crate) fn new(route: Option<SharedString>) -> Self {
        Self { route }
    }

    /// Counts one request with this outcome (once: the label moves into the counter's key).
    #[inline(always)]
    pub(crate) fn record(&mut self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        {
            let route = self
                .route
                .take()
                .unwrap_or_else(|| SharedString::const_str(NO_ROUTE));
            metrics::counter!(leasehold_core::metrics::REQUESTS, "route" => route, "outcome" => outcome)
                .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
}
