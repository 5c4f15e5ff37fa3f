//! The proxy-wasm ABI (0.2.1), written out: the module's exports and every hostcall. All
//! decisions live in the plain modules; this file only moves values across the ABI and never
//! lets a failed hostcall break traffic.
//!
//! # Why not the Rust SDK
//! The SDK's dispatcher exports every `proxy_on_*` callback, and Envoy calls each export the
//! module has: proxy-wasm-cpp-host looks every callback up by name once per VM
//! (`WasmBase::getFunctions`, `src/wasm.cc`) and skips one the module lacks
//! (`if (!wasm_->on_new_connection_) { return FilterStatus::Continue; }` and the like in
//! `src/context.cc`). With the SDK a connection cost nine VM entries. This module exports only
//! (callbacks named as in Envoy `source/extensions/common/wasm/context.cc`):
//!
//! | export | when Envoy calls it | what it does here |
//! |---|---|---|
//! | `proxy_on_context_create` | root context start; per connection, just before `on_new_connection` (Envoy `Context::onNewConnection` calls `onCreate()` first) | counts the connection (`cx_total`, `cx_active`) |
//! | `proxy_on_configure` | root context configuration | parses the config, defines the stats |
//! | `proxy_on_done` | per connection first in `Context::onCloseTCP` (before `on_log`, `on_delete`); root contexts when the plugin goes | uncounts the connection; the worker gauge |
//! | `proxy_on_tick` | a root context's timer (once, then stopped) | the worker gauge (see [`crate::workers`]) |
//! | `proxy_on_memory_allocate` | the host returns bytes (config, property, shared data) | allocator |
//! | `proxy_abi_version_0_2_1`, `_initialize` | ABI detection; VM start | marker; WASI constructors |
//!
//! So a connection costs two VM entries (create, done) instead of nine, however many data chunks
//! it carries: no data callback is exported (proxy-wasm-cpp-host's
//! `ContextBase::onDownstreamData` returns `Continue` without entering the VM when the export is
//! missing), so Envoy never enters the VM per chunk. Bytes in flight are Envoy's own counters'
//! business (`downstream_cx_{rx,tx}_bytes_total`, which the agent's drain reads and holdfast's
//! mesh config keeps: Istio's default stats matcher drops them); a per-chunk callback cost 3–6 %
//! of the request rate (docs/benchmarks.md). Without
//! `proxy_on_vm_start` Envoy treats the start as successful (`ContextBase::onStart`).
//!
//! # Direction
//! With `direction` in the configuration (one plugin per direction, as Istio delivers a
//! WasmPlugin with `match: [{mode: SERVER}]` / `[{mode: CLIENT}]`) nothing is read per
//! connection. Otherwise the property `xds.listener_direction` is read once per connection, in
//! the connection's context. It cannot be read once per root context instead: in Envoy 1.40 the
//! same filter configuration on an INBOUND and an OUTBOUND listener shares one root context per
//! VM (seen: 4 `on_configure` calls for 2 such listeners at `--concurrency 2`: canary, main
//! thread, 2 workers), and the property is empty in a root context.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::FilterConfig;
use crate::direction::{Direction, LISTENER_DIRECTION_PATH};
use crate::stats::{ConnectionLedger, StatKind, StatNames};
use crate::workers::{self, VmReadiness};

mod hostcalls;
use hostcalls as host;

/// How often a fresh root context's timer fires until its first tick (then it is stopped).
const CONFIRM_TICK_MS: u32 = 1;

/// Metric ids of one direction, as returned by `define_metric`.
#[derive(Debug, Clone, Copy)]
struct DirectionMetrics {
    cx_active: u32,
    cx_total: u32,
}

/// A configured root context: where its connections are counted.
#[derive(Debug)]
struct RootSetup {
    config: FilterConfig,
    /// Indexed by [`Direction::index`].
    metrics: [DirectionMetrics; 3],
    workers_ready: u32,
    prefix: String,
}

impl RootSetup {
    /// The direction of a new connection: from the configuration, else (one hostcall) from its
    /// listener. Called in the connection's own context, so the property is the listener's.
    fn direction(&self) -> Direction {
        if let Some(d) = self.config.direction {
            return d;
        }
        let raw = host::property(&LISTENER_DIRECTION_PATH).unwrap_or_else(|status| {
            log_once(
                &PROPERTY_FAILURE_LOGGED,
                "get_property(xds.listener_direction)",
                status,
            );
            None
        });
        self.config.resolve_direction(raw.as_deref())
    }
}

/// One counted connection.
struct Connection {
    ledger: ConnectionLedger,
    metrics: DirectionMetrics,
}

/// Context ids are small sequential integers: hashing them as themselves is enough.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
}

/// Everything this VM keeps. A VM runs on one thread and hostcalls never call back into the
/// module except through the allocator (which touches none of this), so the `RefCell` is never
/// borrowed twice; `try_borrow_mut` turns the impossible case into a no-op, not a panic.
#[derive(Default)]
struct State {
    roots: HashMap<u32, RootSetup, BuildHasherDefault<IdHasher>>,
    connections: HashMap<u32, Connection, BuildHasherDefault<IdHasher>>,
    readiness: VmReadiness,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with_state<R: Default>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => R::default(),
    })
}

/// Set once a metric hostcall has failed, so the log gets one line, not one per packet.
static METRIC_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);
/// Same, for reading the listener direction property.
static PROPERTY_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);
/// Same, for the worker gauge's shared counter.
static SHARED_FAILURE_LOGGED: AtomicBool = AtomicBool::new(false);

fn log_once(flag: &AtomicBool, what: &str, status: u32) {
    if !flag.swap(true, Ordering::Relaxed) {
        // Stay quiet after this: the proxy keeps working, only the counts may be off.
        host::log(
            host::LOG_WARN,
            &format!("holdfast: {what} failed (status {status}); further failures are not logged"),
        );
    }
}

fn increment(metric_id: u32, offset: i64) {
    let status = host::increment_metric(metric_id, offset);
    if status != host::OK {
        log_once(&METRIC_FAILURE_LOGGED, "increment_metric", status);
    }
}

// ---------------------------------------------------------------------------------------------
// Exports.

/// WASI reactor start: runs the module's static constructors, as the Rust SDK's `main!` does.
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn _initialize() {
    #[allow(unsafe_code)] // an import the wasm linker provides
    extern "C" {
        fn __wasm_call_ctors();
    }
    // SAFETY: provided by the wasm linker for reactors; runs the constructors once, and the host
    // calls `_initialize` once per VM before anything else.
    #[allow(unsafe_code)]
    unsafe {
        __wasm_call_ctors();
    }
}

/// Tells the host which ABI this module speaks (found by name, never called for a value).
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// The host's allocator for bytes it hands to the module (see `hostcalls::take`).
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    host::allocate(size)
}

/// Root context start (`parent == 0`) or a new connection's stream context.
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, parent: u32) {
    if parent == 0 {
        return; // a root context: it matters once configured
    }
    with_state(|s| {
        // A connection before its root context was configured is not counted (as before).
        let Some(root) = s.roots.get(&parent) else {
            return;
        };
        let direction = root.direction();
        let metrics = root.metrics[direction.index()];
        let mut ledger = ConnectionLedger::new();
        if ledger.open(direction) {
            increment(metrics.cx_total, 1);
            increment(metrics.cx_active, 1);
        }
        s.connections
            .insert(context_id, Connection { ledger, metrics });
    });
}

/// A connection ended (Envoy calls this first when it closes, whatever closed it), or a root
/// context is going away. Returns 1: done, nothing pending.
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_on_done(context_id: u32) -> u32 {
    let left = with_state(|s| {
        if let Some(mut c) = s.connections.remove(&context_id) {
            if c.ledger.close().is_some() {
                increment(c.metrics.cx_active, -1);
            }
            return None;
        }
        let root = s.roots.remove(&context_id)?;
        s.readiness
            .gone(context_id)
            .map(|prefix| (prefix, root.workers_ready))
    });
    if let Some((prefix, gauge)) = left {
        update_ready_vms(&prefix, gauge, workers::leave);
    }
    1
}

/// A root context's timer: the first tick proves it is not the canary (see [`crate::workers`]).
#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_on_tick(context_id: u32) {
    // One tick is all it takes: stop this root context's timer.
    let _ = host::set_tick_period_ms(0);
    let joined = with_state(|s| {
        let prefix = s.readiness.ticked(context_id)?;
        let gauge = s.roots.get(&context_id)?.workers_ready;
        Some((prefix, gauge))
    });
    if let Some((prefix, gauge)) = joined {
        update_ready_vms(&prefix, gauge, workers::join);
    }
}

#[allow(unsafe_code)] // `no_mangle`: an ABI export, found by name by the host
#[no_mangle]
pub extern "C" fn proxy_on_configure(context_id: u32, _size: usize) -> u32 {
    match configure(context_id) {
        Ok(()) => 1,
        Err(e) => {
            // Rejecting makes Envoy refuse the filter chain: the operator sees it at once.
            host::log(host::LOG_ERROR, &format!("holdfast: {e}"));
            0
        }
    }
}

fn configure(context_id: u32) -> Result<(), String> {
    let raw = host::plugin_configuration()
        .map_err(|s| format!("cannot read the plugin configuration (status {s})"))?;
    let config = FilterConfig::parse(raw.as_deref()).map_err(|e| e.to_string())?;
    let names = StatNames::new(&config.stat_prefix);
    let mut ids = HashMap::new();
    for (name, kind) in names.all() {
        let t = match kind {
            StatKind::Counter => host::METRIC_COUNTER,
            StatKind::Gauge => host::METRIC_GAUGE,
        };
        let id = host::define_metric(t, name)
            .map_err(|s| format!("define_metric({name}): status {s}"))?;
        ids.insert(name.to_string(), id);
    }
    let id = |n: &str| ids.get(n).copied().ok_or(format!("no metric id for {n}"));
    let mut metrics = [DirectionMetrics {
        cx_active: 0,
        cx_total: 0,
    }; 3];
    for (slot, d) in metrics.iter_mut().zip(&names.per_direction) {
        *slot = DirectionMetrics {
            cx_active: id(&d.cx_active)?,
            cx_total: id(&d.cx_total)?,
        };
    }
    let setup = RootSetup {
        config: config.clone(),
        metrics,
        workers_ready: id(&names.workers_ready)?,
        prefix: config.stat_prefix.clone(),
    };
    let status = host::record_metric(id(&names.loaded)?, 1);
    if status != host::OK {
        return Err(format!("record_metric({}): status {status}", names.loaded));
    }
    // The shared counter must exist before any VM ticks: the first configuration of a plugin is
    // always its canary's, on the main thread, before any other VM of it exists.
    ensure_ready_vms_key(&config.stat_prefix);
    let (left, await_tick) = with_state(|s| {
        let left = s.readiness.configured(context_id, &setup.prefix);
        let left = left.map(|p| (p, setup.workers_ready));
        s.roots.insert(context_id, setup);
        (left, s.readiness.awaiting_tick(context_id))
    });
    if let Some((prefix, gauge)) = left {
        update_ready_vms(&prefix, gauge, workers::leave);
    }
    if await_tick {
        let status = host::set_tick_period_ms(CONFIRM_TICK_MS);
        if status != host::OK {
            log_once(
                &SHARED_FAILURE_LOGGED,
                "set_tick_period_milliseconds",
                status,
            );
        }
    }
    host::log(
        host::LOG_INFO,
        &format!(
            "holdfast: configured (stat_prefix {:?}, direction {})",
            config.stat_prefix,
            match (config.direction, config.direction_override) {
                (Some(d), _) => format!("{} (configured)", d.as_str()),
                (None, Some(o)) => format!("per listener, else {}", o.as_str()),
                (None, None) => "per listener".to_string(),
            }
        ),
    );
    Ok(())
}

fn ensure_ready_vms_key(prefix: &str) {
    let key = workers::shared_key(prefix);
    if let Ok(None) = host::get_shared_data(&key) {
        let _ = host::set_shared_data(&key, &workers::encode(0), 0);
    }
}

/// Moves the process-wide count of ready VMs for `prefix` with compare-and-swap, then the gauge
/// by what `step` says. Gives up (logged once) after repeated conflicts or a garbled value: the
/// gauge then stays low, which readers see as "not ready" — the safe side.
fn update_ready_vms(prefix: &str, gauge: u32, step: fn(u32) -> (u32, i64)) {
    let key = workers::shared_key(prefix);
    for _ in 0..64 {
        let (n, cas) = match host::get_shared_data(&key) {
            Ok(Some((raw, cas))) => match workers::decode(&raw) {
                Some(n) => (n, cas),
                None => break,
            },
            Ok(None) => (0, 0),
            Err(status) => {
                log_once(&SHARED_FAILURE_LOGGED, "get_shared_data", status);
                return;
            }
        };
        let (new, delta) = step(n);
        match host::set_shared_data(&key, &workers::encode(new), cas) {
            host::OK => {
                if delta != 0 {
                    increment(gauge, delta);
                }
                return;
            }
            host::CAS_MISMATCH => continue,
            status => {
                log_once(&SHARED_FAILURE_LOGGED, "set_shared_data", status);
                return;
            }
        }
    }
    log_once(
        &SHARED_FAILURE_LOGGED,
        "updating the ready VM count",
        host::CAS_MISMATCH,
    );
}
