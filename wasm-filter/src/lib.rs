//! holdfast's proxy-wasm network filter (placeholder; see issue 2).
