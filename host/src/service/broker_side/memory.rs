//! The embedded in-memory broker's side: its wall clock, which moves
//! messages along as they fall due. It has no queues to read.

use std::sync::Arc;

use futures_util::future::BoxFuture;

use super::BrokerSide;
use crate::broker::{Broker, MemoryExecutor};
use crate::config::Config;
use crate::service::pending::DepthReading;
use crate::service::{Service, ServiceError};

struct MemorySide {
    executor: Arc<MemoryExecutor>,
}

pub(super) fn connect() -> (Broker, Arc<dyn BrokerSide>) {
    let executor = Arc::new(MemoryExecutor::default());
    (executor.clone().into(), Arc::new(MemorySide { executor }))
}

impl BrokerSide for MemorySide {
    fn start<'a>(&'a self, service: &'a Arc<Service>, _config: &'a Config) -> BoxFuture<'a, Result<(), ServiceError>> {
        let (executor, stop) = (self.executor.clone(), service.background.stop.subscribe());
        service.background.supervisor.spawn("memory-clock", None, move || {
            let (executor, stop) = (executor.clone(), stop.clone());
            async move {
                executor.run_clock(stop).await;
                Ok(())
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn depth_reading(&self, _config: &Config) -> Option<DepthReading> {
        None
    }
}
