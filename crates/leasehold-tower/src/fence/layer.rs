use std::sync::Arc;

use tower_layer::Layer;

use super::{Fence, MemoryFenceStore};

/// Wraps the service that owns a protected resource in [`Fence`]: each request's fencing token
/// must not be lower than the highest already accepted for its resource.
#[derive(Debug)]
pub struct FenceLayer<X, St = MemoryFenceStore> {
    extractor: X,
    store: Arc<St>,
}

impl<X: Clone, St> Clone for FenceLayer<X, St> {
    fn clone(&self) -> Self {
        Self {
            extractor: self.extractor.clone(),
            store: Arc::clone(&self.store),
        }
    }
}

impl<X> FenceLayer<X, MemoryFenceStore> {
    /// A layer with a fresh in-memory store.
    pub fn new(extractor: X) -> Self {
        Self {
            extractor,
            store: Arc::new(MemoryFenceStore::new()),
        }
    }
}

impl<X, St> FenceLayer<X, St> {
    /// A layer over a given (possibly shared) store.
    pub fn with_store(extractor: X, store: Arc<St>) -> Self {
        Self { extractor, store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.store
    }
}

impl<S, X: Clone, St> Layer<S> for FenceLayer<X, St> {
    type Service = Fence<S, X, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Fence::new(inner, self.extractor.clone(), Arc::clone(&self.store))
    }
}
