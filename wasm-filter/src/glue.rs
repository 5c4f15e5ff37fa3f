//! The proxy-wasm ABI glue: the root context (configuration, metric definitions) and one stream
//! context per connection. All decisions live in the plain modules; this file only makes
//! hostcalls, and never lets one break traffic.

use std::sync::atomic::{AtomicBool, Ordering};

use log::{error, info};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, RootContext, StreamContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MetricType, PeerType};

use crate::config::FilterConfig;
use crate::direction::{Direction, LISTENER_DIRECTION_PATH};
use crate::stats::{ConnectionLedger, StatKind, StatNames};

#[allow(unsafe_code)]
mod entry {
    proxy_wasm::main! {{
        proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
        proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
            Box::new(super::HoldfastRoot::default())
        });
    }}
}

/// Set once a metric hostcall has failed, so the log gets one line, not one per packet.
static METRIC_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);
/// Same, for reading the listener direction property.
static PROPERTY_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);

fn log_once(flag: &AtomicBool, what: &str, status: proxy_wasm::types::Status) {
    if !flag.swap(true, Ordering::Relaxed) {
        // Stay quiet after this: the proxy keeps working, only the counts may be off.
        let _ = hostcalls::log(
            LogLevel::Warn,
            &format!("holdfast: {what} failed ({status:?}); further failures are not logged"),
        );
    }
}

fn increment(metric_id: u32, offset: i64) {
    if let Err(status) = hostcalls::increment_metric(metric_id, offset) {
        log_once(&METRIC_FAILURE_LOGGED, "increment_metric", status);
    }
}

/// Metric ids of one direction, as returned by `define_metric`.
#[derive(Debug, Clone, Copy)]
struct DirectionMetrics {
    cx_active: u32,
    cx_total: u32,
    bytes_total: u32,
}

/// What a connection needs from the accepted configuration: copied into every stream context.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// Indexed by [`Direction::index`].
    metrics: [DirectionMetrics; 3],
    direction_override: Option<Direction>,
}

/// The plugin's root context: parses the configuration and defines the metrics.
#[derive(Default)]
struct HoldfastRoot {
    /// `None` until `on_configure` accepts a configuration.
    setup: Option<Setup>,
}

impl HoldfastRoot {
    fn define_all(names: &StatNames) -> Result<([DirectionMetrics; 3], u32), String> {
        let define = |kind: StatKind, name: &str| {
            let t = match kind {
                StatKind::Counter => MetricType::Counter,
                StatKind::Gauge => MetricType::Gauge,
            };
            hostcalls::define_metric(t, name).map_err(|s| format!("define_metric({name}): {s:?}"))
        };
        let mut per_direction = [DirectionMetrics {
            cx_active: 0,
            cx_total: 0,
            bytes_total: 0,
        }; 3];
        for (slot, n) in per_direction.iter_mut().zip(&names.per_direction) {
            *slot = DirectionMetrics {
                cx_active: define(StatKind::Gauge, &n.cx_active)?,
                cx_total: define(StatKind::Counter, &n.cx_total)?,
                bytes_total: define(StatKind::Counter, &n.bytes_total)?,
            };
        }
        let loaded = define(StatKind::Gauge, &names.loaded)?;
        Ok((per_direction, loaded))
    }
}

impl Context for HoldfastRoot {}

impl RootContext for HoldfastRoot {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let raw = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(raw) => raw,
            Err(status) => {
                error!("holdfast: cannot read the plugin configuration: {status:?}");
                return false;
            }
        };
        let config = match FilterConfig::parse(raw.as_deref()) {
            Ok(c) => c,
            Err(e) => {
                // Rejecting makes Envoy refuse the filter chain: the operator sees it at once.
                error!("holdfast: {e}");
                return false;
            }
        };
        let names = StatNames::new(&config.stat_prefix);
        let (metrics, loaded) = match HoldfastRoot::define_all(&names) {
            Ok(ids) => ids,
            Err(e) => {
                error!("holdfast: {e}");
                return false;
            }
        };
        if let Err(status) = hostcalls::record_metric(loaded, 1) {
            error!("holdfast: record_metric({}): {status:?}", names.loaded);
            return false;
        }
        self.setup = Some(Setup {
            metrics,
            direction_override: config.direction_override,
        });
        info!(
            "holdfast: configured (stat_prefix {:?}, direction_override {:?})",
            config.stat_prefix, config.direction_override
        );
        true
    }

    fn create_stream_context(&self, _context_id: u32) -> Option<Box<dyn StreamContext>> {
        // Returning None would make the SDK panic: a connection arriving before a configuration
        // was accepted gets a context that does nothing.
        Some(Box::new(CountedConnection {
            setup: self.setup,
            ledger: ConnectionLedger::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::StreamContext)
    }
}

/// One connection's stream context.
struct CountedConnection {
    setup: Option<Setup>,
    ledger: ConnectionLedger,
}

impl CountedConnection {
    /// Takes the connection out of `cx_active` if it is still counted there.
    fn uncount(&mut self) {
        if let (Some(setup), Some(dir)) = (self.setup, self.ledger.close()) {
            increment(setup.metrics[dir.index()].cx_active, -1);
        }
    }

    fn add_bytes(&self, len: usize) {
        if let (Some(setup), Some((dir, n))) = (self.setup, self.ledger.data(len)) {
            increment(setup.metrics[dir.index()].bytes_total, n);
        }
    }
}

impl Context for CountedConnection {}

impl StreamContext for CountedConnection {
    fn on_new_connection(&mut self) -> Action {
        let Some(setup) = self.setup else {
            return Action::Continue;
        };
        let raw = match hostcalls::get_property(LISTENER_DIRECTION_PATH.to_vec()) {
            Ok(raw) => raw,
            Err(status) => {
                log_once(
                    &PROPERTY_FAILURE_LOGGED,
                    "get_property(xds.listener_direction)",
                    status,
                );
                None
            }
        };
        let dir = Direction::resolve(raw.as_deref(), setup.direction_override);
        if self.ledger.open(dir) {
            let m = setup.metrics[dir.index()];
            increment(m.cx_total, 1);
            increment(m.cx_active, 1);
        }
        Action::Continue
    }

    fn on_downstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.add_bytes(data_size);
        Action::Continue
    }

    fn on_upstream_data(&mut self, data_size: usize, _end_of_stream: bool) -> Action {
        self.add_bytes(data_size);
        Action::Continue
    }

    fn on_downstream_close(&mut self, _peer_type: PeerType) {}

    fn on_upstream_close(&mut self, _peer_type: PeerType) {}

    /// Envoy calls this once when the connection is done, however it ended (`on_upstream_close`
    /// does not always fire, and `PeerType` does not say who closed, so neither is used).
    fn on_log(&mut self) {
        self.uncount();
    }
}

/// A safety net for a context deleted without `on_log`; the ledger makes it a no-op after it.
/// In Envoy 1.40 `on_log` ran first for every connection the tests end (client FIN, half-close,
/// RST, upstream close, upstream connect failure, 300 concurrent, `/quitquitquit`), so this
/// never uncounted there; it stays for hosts or versions that delete a context without logging.
impl Drop for CountedConnection {
    fn drop(&mut self) {
        self.uncount();
    }
}
