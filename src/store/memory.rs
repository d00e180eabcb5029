//! The embedded, single-instance store: every operation one critical section.
//! STUB: being written.
pub struct MemoryStore;
impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore
    }
}
#[async_trait::async_trait]
impl super::Store for MemoryStore {
    async fn arrive(
        &self,
        _: &super::RoomPolicy,
        _: super::VisitorId,
        _: u64,
    ) -> Result<super::Verdict, super::StoreError> {
        unimplemented!()
    }
    async fn poll(
        &self,
        _: &super::RoomPolicy,
        _: super::VisitorId,
        _: u64,
        _: u64,
    ) -> Result<super::Verdict, super::StoreError> {
        unimplemented!()
    }
    async fn check_in(
        &self,
        _: &super::RoomPolicy,
        _: super::VisitorId,
        _: u64,
    ) -> Result<Option<u64>, super::StoreError> {
        unimplemented!()
    }
    async fn release(
        &self,
        _: &super::RoomPolicy,
        _: super::VisitorId,
        _: u64,
    ) -> Result<bool, super::StoreError> {
        unimplemented!()
    }
    async fn stats(
        &self,
        _: &super::RoomPolicy,
        _: u64,
    ) -> Result<super::RoomStats, super::StoreError> {
        unimplemented!()
    }
    async fn totals(&self, _: &super::RoomPolicy) -> Result<super::RoomTotals, super::StoreError> {
        unimplemented!()
    }
    async fn reset(&self, _: &super::RoomPolicy) -> Result<(), super::StoreError> {
        unimplemented!()
    }
}
