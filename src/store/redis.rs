//! The Redis store (single node or Cluster): every operation one Lua script.
//! STUB: being written (issue 3).
pub struct RedisStore;
impl RedisStore {
    pub async fn connect(_: &[String], _: std::time::Duration) -> Result<Self, super::StoreError> {
        unimplemented!()
    }
}
#[async_trait::async_trait]
impl super::Store for RedisStore {
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
    async fn overrides(&self, _: &str) -> Result<Option<super::RoomOverrides>, super::StoreError> {
        unimplemented!()
    }
    async fn set_overrides(
        &self,
        _: &str,
        _: Option<&super::RoomOverrides>,
    ) -> Result<(), super::StoreError> {
        unimplemented!()
    }
    async fn reset(&self, _: &super::RoomPolicy) -> Result<(), super::StoreError> {
        unimplemented!()
    }
}
