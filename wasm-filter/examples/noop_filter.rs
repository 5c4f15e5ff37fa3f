//! A proxy-wasm network filter that does nothing: every callback returns at once.
//!
//! Benchmark baseline only (`holdfast-bench filter` runs it next to the holdfast filter, when
//! built): it pays exactly what any filter built with the same SDK pays for Envoy to call into
//! the wasm VM on every connection and data chunk, so the difference to holdfast is the cost of
//! holdfast's own work. Build it with
//! `cargo build -p holdfast-filter --example noop_filter --target wasm32-wasip1 --profile wasm-release`.

// Only meaningful as a wasm module; natively this example is empty.
#![cfg(target_arch = "wasm32")]

use proxy_wasm::traits::{Context, RootContext, StreamContext};
use proxy_wasm::types::ContextType;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(NoopRoot) });
}}

struct NoopRoot;

impl Context for NoopRoot {}

impl RootContext for NoopRoot {
    fn create_stream_context(&self, _context_id: u32) -> Option<Box<dyn StreamContext>> {
        Some(Box::new(NoopStream))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::StreamContext)
    }
}

struct NoopStream;

impl Context for NoopStream {}

impl StreamContext for NoopStream {}
