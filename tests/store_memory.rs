//! Runs the store conformance suite against the in-memory store, plus a
//! footprint measurement run by hand.

mod conformance;

use std::sync::Arc;

use waitroom::store::memory::MemoryStore;

conformance::store_conformance!(|| async {
    conformance::Harness::new(Arc::new(MemoryStore::new()))
});
