//! The webhooks' figures as Prometheus families, read at each scrape:
//! `webhook_deliveries_total{webhook, outcome}` (`sent`, `failed`,
//! `dropped`, `retried`) and `webhook_queued{webhook}`, `webhook` being
//! the URL. Registered on the daemon's registry, they take its
//! `waitroom_` prefix.

use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{Hook, Webhooks};

/// The webhooks' figures for a `prometheus_client` registry
/// (`Registry::register_collector`). It holds the webhooks' counters, not
/// the webhooks: dropping the last [`Webhooks`] still stops delivery.
/// It follows reloads.
#[derive(Clone)]
pub struct Metrics {
    /// The webhooks in force, as a reload leaves them.
    hooks: Arc<ArcSwap<Vec<Arc<Hook>>>>,
}

impl Webhooks {
    /// The figures as Prometheus families (see [`Metrics`]).
    pub fn metrics(&self) -> Metrics {
        Metrics {
            hooks: Arc::clone(&self.inner.hooks),
        }
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.hooks.load().iter().map(|h| h.url.clone()))
            .finish()
    }
}

impl Collector for Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures: Vec<_> = self.hooks.load().iter().map(|h| h.figures()).collect();
        if figures.is_empty() {
            return Ok(());
        }
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "webhook_deliveries",
            "Webhook deliveries by outcome: sent (2xx), failed (given up), dropped (buffer full or stopping), retried (attempts after the first)",
            None,
            counter.metric_type(),
        )?;
        for f in &figures {
            for (outcome, n) in [
                ("sent", f.sent),
                ("failed", f.failed),
                ("dropped", f.dropped),
                ("retried", f.retried),
            ] {
                let labels = [("webhook", f.url.as_str()), ("outcome", outcome)];
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "webhook_queued",
            "Happenings waiting in a webhook's buffer",
            None,
            gauge.metric_type(),
        )?;
        for f in &figures {
            let labels = [("webhook", f.url.as_str())];
            ConstGauge::new(i64::try_from(f.queued).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use prometheus_client::registry::Registry;

    use crate::clock::ManualClock;
    use crate::secret::Secret;
    use crate::webhook::{Happening, Kind, WebhookConfig, Webhooks};

    #[tokio::test(flavor = "current_thread")]
    async fn the_figures_are_counters_by_webhook_and_outcome() {
        let mut config = WebhookConfig::new(
            "http://127.0.0.1:9/hook".parse().unwrap(),
            Secret("0123456789abcdef".into()),
        );
        config.buffer = 1;
        let hooks = Webhooks::new(&[config], Arc::new(ManualClock::new(0)));
        let h = Happening {
            id: "a".into(),
            kind: Kind::SoldOut,
            room: "shop".into(),
            at_ms: 0,
            data: serde_json::json!({}),
        };
        // The delivery task has not run: one queued, two dropped.
        for _ in 0..3 {
            hooks.emit(h.clone());
        }
        let mut registry = Registry::with_prefix("waitroom");
        registry.register_collector(Box::new(hooks.metrics()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE waitroom_webhook_deliveries counter",
            "waitroom_webhook_deliveries_total{webhook=\"http://127.0.0.1:9/hook\",outcome=\"sent\"} 0",
            "waitroom_webhook_deliveries_total{webhook=\"http://127.0.0.1:9/hook\",outcome=\"dropped\"} 2",
            "# TYPE waitroom_webhook_queued gauge",
            "waitroom_webhook_queued{webhook=\"http://127.0.0.1:9/hook\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        // No webhook, no family.
        let mut registry = Registry::with_prefix("waitroom");
        registry.register_collector(Box::new(Webhooks::default().metrics()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("webhook"), "{text}");
        hooks.shutdown(std::time::Duration::ZERO).await;
    }
}
