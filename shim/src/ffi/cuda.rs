//! The CUDA driver calls behind per-operation timing (`crate::timing`): events, the
//! capture status of a stream, a stream's context.
//!
//! The driver is never loaded by zcta: only a `libcuda.so.1` the process already
//! mapped is used (`RTLD_NOLOAD`), so a process that runs no CUDA gets no driver from
//! us. Handles cross this module as plain integers; every call returns the driver's
//! `CUresult` as an integer (0: success).

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::OnceLock;

use super::real::dlopen;

type Res = c_int;
type Handle = *mut c_void;

/// `CUDA_ERROR_NOT_READY`.
pub const NOT_READY: i32 = 600;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

struct Api {
    ctx_get_current: unsafe extern "C" fn(*mut Handle) -> Res,
    ctx_set_current: unsafe extern "C" fn(Handle) -> Res,
    stream_get_ctx: unsafe extern "C" fn(Handle, *mut Handle) -> Res,
    stream_is_capturing: unsafe extern "C" fn(Handle, *mut c_int) -> Res,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> Res,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> Res,
    event_destroy: unsafe extern "C" fn(Handle) -> Res,
    event_record: unsafe extern "C" fn(Handle, Handle) -> Res,
    event_query: unsafe extern "C" fn(Handle) -> Res,
    event_elapsed: unsafe extern "C" fn(*mut f32, Handle, Handle) -> Res,
    exchange_capture_mode: unsafe extern "C" fn(*mut c_int) -> Res,
}

static API: OnceLock<Api> = OnceLock::new();

/// `name` from the library `h` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of the driver's function of that name (cuda.h 13.0).
unsafe fn func<F: Copy>(h: usize, name: &CStr) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: h is a handle returned by dlopen; name is NUL-terminated.
    let p = unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) };
    // SAFETY: F is a function-pointer type of pointer size (asserted above), and the
    // caller vouches for its signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

fn load() -> Option<Api> {
    let h = dlopen("libcuda.so.1", libc::RTLD_NOLOAD | libc::RTLD_LAZY);
    if h == 0 {
        return None;
    }
    // SAFETY (each): the field's type is the C signature of that driver function;
    // `cuEventElapsedTime_v2` has the same signature as the first version (CUDA 12.8+).
    unsafe {
        Some(Api {
            ctx_get_current: func(h, c"cuCtxGetCurrent")?,
            ctx_set_current: func(h, c"cuCtxSetCurrent")?,
            stream_get_ctx: func(h, c"cuStreamGetCtx")?,
            stream_is_capturing: func(h, c"cuStreamIsCapturing")?,
            stream_create: func(h, c"cuStreamCreate")?,
            event_create: func(h, c"cuEventCreate")?,
            event_destroy: func(h, c"cuEventDestroy_v2").or_else(|| func(h, c"cuEventDestroy"))?,
            event_record: func(h, c"cuEventRecord")?,
            event_query: func(h, c"cuEventQuery")?,
            event_elapsed: func(h, c"cuEventElapsedTime_v2").or_else(|| func(h, c"cuEventElapsedTime"))?,
            exchange_capture_mode: func(h, c"cuThreadExchangeStreamCaptureMode")?,
        })
    }
}

/// Whether the process has a CUDA driver zcta can use. Looked up again on each call
/// until found: a process maps the driver when it first uses CUDA, which may come
/// after its first NCCL call.
pub fn init() -> bool {
    if API.get().is_some() {
        return true;
    }
    match load() {
        Some(a) => {
            let _ = API.set(a);
            true
        }
        None => false,
    }
}

fn api() -> Option<&'static Api> {
    API.get()
}

/// Whether `stream` is being captured into a CUDA graph: `Ok(false)` only when the
/// driver says plainly that it is not (an error, e.g. the legacy stream queried while
/// a blocking stream captures, counts as "do not touch").
pub fn capturing(stream: usize) -> Result<bool, i32> {
    let a = api().ok_or(-1)?;
    let mut status: c_int = -1;
    // SAFETY: valid out-pointer; the stream handle is the one the program passed to
    // NCCL, which NCCL is about to use.
    let rc = unsafe { (a.stream_is_capturing)(stream as Handle, &mut status) };
    match rc {
        0 => Ok(status != 0),
        e => Err(e),
    }
}

/// The context of `stream` (the current one for the legacy stream).
pub fn stream_ctx(stream: usize) -> Result<usize, i32> {
    let a = api().ok_or(-1)?;
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer; stream as in `capturing`.
    match unsafe { (a.stream_get_ctx)(stream as Handle, &mut ctx) } {
        0 if !ctx.is_null() => Ok(ctx as usize),
        0 => Err(-1),
        e => Err(e),
    }
}

/// The calling thread's current context (0: none).
pub fn current_ctx() -> usize {
    let Some(a) = api() else { return 0 };
    let mut ctx: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    match unsafe { (a.ctx_get_current)(&mut ctx) } {
        0 => ctx as usize,
        _ => 0,
    }
}

/// Makes `ctx` current on the calling thread (the writer's: events and its own
/// stream are made in the op's context).
pub fn set_current(ctx: usize) -> Result<(), i32> {
    let a = api().ok_or(-1)?;
    // SAFETY: ctx came from cuStreamGetCtx on a stream the program used.
    match unsafe { (a.ctx_set_current)(ctx as Handle) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// A timing event in the current context.
pub fn event_create() -> Result<usize, i32> {
    let a = api().ok_or(-1)?;
    let mut ev: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags 0 = CU_EVENT_DEFAULT (timing on).
    match unsafe { (a.event_create)(&mut ev, 0) } {
        0 if !ev.is_null() => Ok(ev as usize),
        0 => Err(-1),
        e => Err(e),
    }
}

/// Destroys one of our events that was never recorded (one half of a pair whose other
/// half could not be made).
pub fn event_destroy(ev: usize) {
    if let Some(a) = api() {
        // SAFETY: ev is one of our events, made by event_create and not in use.
        unsafe { (a.event_destroy)(ev as Handle) };
    }
}

/// A non-blocking stream of zcta's own in the current context (for clock anchors).
pub fn stream_create() -> Result<usize, i32> {
    let a = api().ok_or(-1)?;
    let mut s: Handle = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    match unsafe { (a.stream_create)(&mut s, STREAM_NON_BLOCKING) } {
        0 if !s.is_null() => Ok(s as usize),
        0 => Err(-1),
        e => Err(e),
    }
}

/// Records `ev` (made by [`event_create`] in the stream's context) on `stream`.
#[inline]
pub fn record(ev: usize, stream: usize) -> Result<(), i32> {
    let a = api().ok_or(-1)?;
    // SAFETY: ev is one of our events; the stream is the program's, not capturing
    // (checked by the caller just before).
    match unsafe { (a.event_record)(ev as Handle, stream as Handle) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `cuEventQuery`: 0 done, [`NOT_READY`], or another error.
pub fn query(ev: usize) -> i32 {
    let Some(a) = api() else { return -1 };
    // SAFETY: ev is one of our events.
    unsafe { (a.event_query)(ev as Handle) }
}

/// Milliseconds from `start` to `end` (both complete, same context); may be negative.
pub fn elapsed_ms(start: usize, end: usize) -> Result<f32, i32> {
    let a = api().ok_or(-1)?;
    let mut ms = 0f32;
    // SAFETY: valid out-pointer; both are our events.
    match unsafe { (a.event_elapsed)(&mut ms, start as Handle, end as Handle) } {
        0 => Ok(ms),
        e => Err(e),
    }
}

/// Puts the calling thread in relaxed capture mode, so its event queries never count
/// as unsafe calls during another thread's global-mode capture (the writer thread).
pub fn relax_capture_mode() {
    if let Some(a) = api() {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: valid in/out pointer; affects only the calling thread.
        unsafe { (a.exchange_capture_mode)(&mut mode) };
    }
}
