//! The hostcalls the filter uses, as safe functions (part of `glue`; the only `unsafe` code
//! besides `_initialize`). Signatures: proxy-wasm ABI 0.2.1, as the Rust SDK declares them
//! (`src/hostcalls.rs` of proxy-wasm-rust-sdk); status codes: its `types::Status`.

use std::mem::MaybeUninit;

pub const OK: u32 = 0;
pub const NOT_FOUND: u32 = 1;
pub const EMPTY: u32 = 7;
pub const CAS_MISMATCH: u32 = 8;

pub const LOG_INFO: u32 = 2;
pub const LOG_WARN: u32 = 3;
pub const LOG_ERROR: u32 = 4;

pub const METRIC_COUNTER: u32 = 0;
pub const METRIC_GAUGE: u32 = 1;

const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
}

/// `size` bytes the host fills and hands over; reclaimed by [`take`].
pub fn allocate(size: usize) -> *mut u8 {
    let mut v: Vec<MaybeUninit<u8>> = Vec::with_capacity(size);
    // SAFETY: MaybeUninit<u8> needs no initialisation; capacity is `size`.
    #[allow(unsafe_code)]
    unsafe {
        v.set_len(size);
    }
    // A boxed slice has capacity == length, which `take` relies on.
    Box::into_raw(v.into_boxed_slice()).cast::<u8>()
}

/// Takes back bytes the host returned from [`allocate`]d memory.
fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: the host wrote `size` bytes into a block our allocator returned for exactly `size`
    // bytes (a boxed slice: capacity == length, same layout as this Vec), and gives it up.
    #[allow(unsafe_code)]
    unsafe {
        Vec::from_raw_parts(data, size, size)
    }
}

pub fn log(level: u32, message: &str) {
    // SAFETY: pointer and length of a live &str; the host copies it.
    #[allow(unsafe_code)]
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

/// Bytes returned through out-pointers; `None` when the host has none (NotFound/Empty).
fn returned(status: u32, data: *mut u8, size: usize) -> Result<Option<Vec<u8>>, u32> {
    match status {
        OK => Ok(Some(take(data, size))),
        NOT_FOUND | EMPTY => Ok(None),
        other => Err(other),
    }
}

pub fn plugin_configuration() -> Result<Option<Vec<u8>>, u32> {
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: out-pointers to locals; the host writes a pointer from our allocator and its size.
    #[allow(unsafe_code)]
    let status = unsafe {
        proxy_get_buffer_bytes(
            BUFFER_PLUGIN_CONFIGURATION,
            0,
            usize::MAX,
            &mut data,
            &mut size,
        )
    };
    returned(status, data, size)
}

/// A property by path (segments joined with NUL, as the ABI wants).
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, u32> {
    let joined = path.join("\0");
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    // SAFETY: as for `plugin_configuration`; the path is a live buffer.
    #[allow(unsafe_code)]
    let status = unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    returned(status, data, size)
}

pub fn define_metric(metric_type: u32, name: &str) -> Result<u32, u32> {
    let mut id = 0;
    // SAFETY: a live &str and an out-pointer to a local.
    #[allow(unsafe_code)]
    let status = unsafe { proxy_define_metric(metric_type, name.as_ptr(), name.len(), &mut id) };
    if status == OK {
        Ok(id)
    } else {
        Err(status)
    }
}

pub fn increment_metric(metric_id: u32, offset: i64) -> u32 {
    // SAFETY: plain values.
    #[allow(unsafe_code)]
    unsafe {
        proxy_increment_metric(metric_id, offset)
    }
}

pub fn record_metric(metric_id: u32, value: u64) -> u32 {
    // SAFETY: plain values.
    #[allow(unsafe_code)]
    unsafe {
        proxy_record_metric(metric_id, value)
    }
}

/// Sets the calling root context's timer; 0 stops it.
pub fn set_tick_period_ms(period: u32) -> u32 {
    // SAFETY: a plain value.
    #[allow(unsafe_code)]
    unsafe {
        proxy_set_tick_period_milliseconds(period)
    }
}

/// The value and its CAS token, `None` when the key does not exist.
pub fn get_shared_data(key: &str) -> Result<Option<(Vec<u8>, u32)>, u32> {
    let mut data = std::ptr::null_mut();
    let mut size = 0;
    let mut cas = 0;
    // SAFETY: as for `plugin_configuration`, plus an out-pointer for the CAS token.
    #[allow(unsafe_code)]
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    Ok(returned(status, data, size)?.map(|v| (v, cas)))
}

/// Sets the value if its CAS token is still `cas` (0: unconditionally). Returns the status.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> u32 {
    // SAFETY: live buffers; the host copies them.
    #[allow(unsafe_code)]
    unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    }
}
