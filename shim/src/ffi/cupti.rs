//! libcupti: loading it without mapping a second copy, the few functions zcta calls,
//! the activity buffer callbacks, the API callback that ties CUDA calls to ops, and
//! the CUPTI entry points zcta interposes to notice another CUPTI client
//! (torch.profiler/Kineto).
//!
//! Loading order (first that works): the libcupti already mapped in the process
//! (torch links one), `ZCTA_CUPTI_LIB`, `$CUDA_HOME`/`$CUDA_PATH`, the `nvidia/cu13/lib`
//! folder next to the Python wheel's libnccl, `/usr/local/cuda*`. Only the first may
//! be reused as is; the others are opened by path, and the loader then shares that
//! object with any later `libcupti.so.13` dependency (same soname).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::real::{dlopen, mapped_libs};

type Res = c_int;
type ReqFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type DoneFn = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
type CallbackFn = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);

/// The CUPTI functions zcta uses.
struct Api {
    get_version: unsafe extern "C" fn(*mut u32) -> Res,
    register_callbacks: unsafe extern "C" fn(ReqFn, DoneFn) -> Res,
    enable: unsafe extern "C" fn(u32) -> Res,
    disable: unsafe extern "C" fn(u32) -> Res,
    flush_all: unsafe extern "C" fn(u32) -> Res,
    next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut c_void) -> Res,
    dropped: unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> Res,
    timestamp: unsafe extern "C" fn(*mut u64) -> Res,
    result_string: Option<unsafe extern "C" fn(Res, *mut *const c_char) -> Res>,
    subscribe: unsafe extern "C" fn(*mut *mut c_void, CallbackFn, *mut c_void) -> Res,
    unsubscribe: unsafe extern "C" fn(*mut c_void) -> Res,
    enable_callback: unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> Res,
    path: String,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn sym(h: usize, name: &CStr) -> *mut c_void {
    // SAFETY: h is a handle returned by dlopen; name is NUL-terminated.
    unsafe { libc::dlsym(h as *mut c_void, name.as_ptr()) }
}

/// `name` from the library `h` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of CUPTI's function of that name (cupti_activity.h 13.0).
unsafe fn func<F: Copy>(h: usize, name: &CStr) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    let p = sym(h, name);
    // SAFETY: F is a function-pointer type of pointer size (asserted above), and the
    // caller vouches for its signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

macro_rules! req {
    ($h:expr, $name:literal) => {
        // SAFETY: the field's type is the C signature of this CUPTI function.
        unsafe { func($h, $name) }.ok_or_else(|| format!("libcupti has no {}", $name.to_string_lossy()))?
    };
}
macro_rules! opt {
    ($h:expr, $name:literal) => {
        // SAFETY: as in `req!`; absent in older CUPTI versions.
        unsafe { func($h, $name) }
    };
}

fn candidates() -> Vec<String> {
    let mut v = Vec::new();
    if let Some(p) = std::env::var("ZCTA_CUPTI_LIB").ok().filter(|s| !s.is_empty()) {
        v.push(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var(var).ok().filter(|s| !s.is_empty()) {
            for sub in ["lib64", "extras/CUPTI/lib64", "targets/x86_64-linux/lib", "lib"] {
                v.push(format!("{root}/{sub}/libcupti.so.13"));
            }
        }
    }
    // The Python wheels: site-packages/nvidia/nccl/lib/libnccl.so.2 → nvidia/cu13/lib.
    for nccl in mapped_libs("libnccl.so") {
        if let Some(nvidia) = std::path::Path::new(&nccl).ancestors().nth(3) {
            v.push(format!("{}/cu13/lib/libcupti.so.13", nvidia.display()));
        }
    }
    let mut roots = vec!["/usr/local/cuda".to_string()];
    if let Ok(rd) = std::fs::read_dir("/usr/local") {
        let mut more: Vec<String> = rd
            .flatten()
            .map(|e| e.path().display().to_string())
            .filter(|p| p.starts_with("/usr/local/cuda-"))
            .collect();
        more.sort();
        more.reverse();
        roots.extend(more);
    }
    for r in roots {
        for sub in ["lib64", "extras/CUPTI/lib64", "targets/x86_64-linux/lib"] {
            v.push(format!("{r}/{sub}/libcupti.so.13"));
        }
    }
    v
}

fn open() -> Result<(usize, String), String> {
    let mapped = mapped_libs("libcupti.so");
    for p in &mapped {
        let h = dlopen(p, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h != 0 {
            return Ok((h, p.clone()));
        }
    }
    for p in candidates() {
        if !std::path::Path::new(&p).exists() {
            continue;
        }
        let h = dlopen(&p, libc::RTLD_NOW | libc::RTLD_LOCAL);
        if h != 0 {
            return Ok((h, p));
        }
    }
    Err("libcupti not found (set ZCTA_CUPTI_LIB, or CUDA_HOME)".into())
}

fn load() -> Result<Api, String> {
    let (h, path) = open()?;
    Ok(Api {
        get_version: req!(h, c"cuptiGetVersion"),
        register_callbacks: req!(h, c"cuptiActivityRegisterCallbacks"),
        enable: req!(h, c"cuptiActivityEnable"),
        disable: req!(h, c"cuptiActivityDisable"),
        flush_all: req!(h, c"cuptiActivityFlushAll"),
        next_record: req!(h, c"cuptiActivityGetNextRecord"),
        dropped: req!(h, c"cuptiActivityGetNumDroppedRecords"),
        timestamp: req!(h, c"cuptiGetTimestamp"),
        result_string: opt!(h, c"cuptiGetResultString"),
        subscribe: req!(h, c"cuptiSubscribe"),
        unsubscribe: req!(h, c"cuptiUnsubscribe"),
        enable_callback: req!(h, c"cuptiEnableCallback"),
        path,
    })
}

fn api() -> Result<&'static Api, &'static str> {
    API.get_or_init(load).as_ref().map_err(String::as_str)
}

/// Loads libcupti (once). Returns its path and API version.
pub fn init() -> Result<(String, u32), String> {
    let a = api().map_err(str::to_owned)?;
    let mut v = 0u32;
    // SAFETY: valid out-pointer.
    let rc = unsafe { (a.get_version)(&mut v) };
    check("cuptiGetVersion", rc)?;
    Ok((a.path.clone(), v))
}

/// CUPTI's text for a result code.
fn describe(rc: Res) -> String {
    let mut s: *const c_char = std::ptr::null();
    if let Ok(a) = api()
        && let Some(f) = a.result_string
    {
        // SAFETY: valid out-pointer; CUPTI returns a static string.
        if unsafe { f(rc, &mut s) } == 0 && !s.is_null() {
            // SAFETY: NUL-terminated static string from CUPTI.
            return format!("{} ({rc})", unsafe { CStr::from_ptr(s) }.to_string_lossy());
        }
    }
    format!("CUPTI error {rc}")
}

fn check(what: &str, rc: Res) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what}: {}", describe(rc)))
    }
}

/// Current CUPTI timestamp (ns).
pub fn timestamp() -> Option<u64> {
    let a = api().ok()?;
    let mut t = 0u64;
    // SAFETY: valid out-pointer.
    (unsafe { (a.timestamp)(&mut t) } == 0).then_some(t)
}

/// zcta's CUPTI subscriber (null: none).
static SUBSCRIBER: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `CUPTI_CB_DOMAIN_DRIVER_API` / `_RUNTIME_API`, `CUPTI_API_ENTER`.
const DOMAIN_DRIVER: u32 = 1;
const DOMAIN_RUNTIME: u32 = 2;
const API_ENTER: u32 = 0;
/// `CUpti_CallbackData` (cupti_callbacks.h 13.0, checked with gcc): `callbackSite` at
/// 0, `correlationId` at 64; 72 bytes.
const CB_SITE: usize = 0;
const CB_CORRELATION: usize = 64;

/// Subscribes to CUPTI's callback API for the listed driver and runtime calls (the
/// launches and copies NCCL issues): each call's correlation id is then tied to the
/// op in flight on that thread at the call (see `gpu::on_api_enter`). Fails when
/// another tool holds CUPTI's single subscriber slot (Nsight, a profiler, a debugger).
pub fn subscribe(driver_cbids: &[u32], runtime_cbids: &[u32]) -> Result<(), String> {
    let a = api().map_err(str::to_owned)?;
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; api_callback has CUpti_CallbackFunc's signature.
    let rc = unsafe { (a.subscribe)(&mut h, api_callback, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(format!("cuptiSubscribe: {}", describe(rc)));
    }
    SUBSCRIBER.store(h, Ordering::Release);
    let lists = [(DOMAIN_DRIVER, driver_cbids), (DOMAIN_RUNTIME, runtime_cbids)];
    for (domain, ids) in lists {
        for &c in ids {
            // SAFETY: h is our subscriber; plain call.
            let rc = unsafe { (a.enable_callback)(1, h, domain, c) };
            if rc != 0 {
                unsubscribe();
                return Err(format!("cuptiEnableCallback({domain}, {c}): {}", describe(rc)));
            }
        }
    }
    Ok(())
}

/// Turns our callbacks on the listed calls on or off (pausing: a disabled callback
/// costs the launch nothing).
pub fn set_callbacks(driver_cbids: &[u32], runtime_cbids: &[u32], on: bool) {
    let h = SUBSCRIBER.load(Ordering::Acquire);
    if h.is_null() {
        return;
    }
    if let Ok(a) = api() {
        for (domain, ids) in [(DOMAIN_DRIVER, driver_cbids), (DOMAIN_RUNTIME, runtime_cbids)] {
            for &c in ids {
                // SAFETY: h is our live subscriber; plain call.
                unsafe { (a.enable_callback)(u32::from(on), h, domain, c) };
            }
        }
    }
}

/// Gives CUPTI's subscriber slot back (another client is taking over).
pub fn unsubscribe() {
    let h = SUBSCRIBER.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !h.is_null()
        && let Ok(a) = api()
    {
        // SAFETY: h is the handle cuptiSubscribe gave us, released once.
        unsafe { (a.unsubscribe)(h) };
    }
}

unsafe extern "C" fn api_callback(_user: *mut c_void, domain: u32, cbid: u32, data: *const c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: CUPTI passes a CUpti_CallbackData for API domains; both fields are
    // plain integers at the offsets above.
    let (site, corr) = unsafe {
        let p = data as *const u8;
        (
            (p.add(CB_SITE) as *const u32).read_unaligned(),
            (p.add(CB_CORRELATION) as *const u32).read_unaligned(),
        )
    };
    if site == API_ENTER {
        let _ = std::panic::catch_unwind(|| crate::gpu::on_api_enter(domain == DOMAIN_DRIVER, cbid, corr));
    }
}

/// Registers the buffer callbacks and enables the activity kinds zcta uses. On
/// failure, whatever was enabled is disabled again.
pub fn start(kinds: &[u32]) -> Result<(), String> {
    let a = api().map_err(str::to_owned)?;
    // SAFETY: both callbacks are extern "C" fns of CUPTI's callback types.
    check("cuptiActivityRegisterCallbacks", unsafe {
        (a.register_callbacks)(buffer_requested, buffer_completed)
    })?;
    for (i, &k) in kinds.iter().enumerate() {
        // SAFETY: plain call with an activity kind.
        if let Err(e) = check("cuptiActivityEnable", unsafe { (a.enable)(k) }) {
            for &k in &kinds[..i] {
                // SAFETY: as above.
                unsafe { (a.disable)(k) };
            }
            return Err(format!("{e} (kind {k})"));
        }
    }
    Ok(())
}

/// Enables or disables the activity `kinds` (pausing capture without leaving CUPTI).
pub fn set_kinds(kinds: &[u32], on: bool) {
    if let Ok(a) = api() {
        for &k in kinds {
            // SAFETY: plain call with an activity kind.
            unsafe {
                if on {
                    (a.enable)(k);
                } else {
                    (a.disable)(k);
                }
            }
        }
    }
}

/// Disables what [`start`] enabled and leaves the subscriber slot.
pub fn stop(kinds: &[u32]) {
    if let Ok(a) = api() {
        for &k in kinds {
            // SAFETY: plain call with an activity kind.
            unsafe { (a.disable)(k) };
        }
    }
    unsubscribe();
}

/// Asks CUPTI to hand over its buffers (`forced`: incomplete ones too).
pub fn flush(forced: bool) {
    if let Ok(a) = api() {
        // SAFETY: plain call; CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1.
        unsafe { (a.flush_all)(u32::from(forced)) };
    }
}

/// Size of each activity buffer handed to CUPTI, and how many may be outstanding.
const BUF_SIZE: usize = 2 << 20;
const MAX_BUFFERS: usize = 48;
static OUTSTANDING: AtomicUsize = AtomicUsize::new(0);
/// Records CUPTI dropped plus buffers refused at the memory limit.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

struct Buf {
    ptr: usize,
    valid: usize,
}

fn channel() -> &'static (Sender<Buf>, Receiver<Buf>) {
    static CH: OnceLock<(Sender<Buf>, Receiver<Buf>)> = OnceLock::new();
    CH.get_or_init(unbounded)
}

fn layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(BUF_SIZE, 8).expect("valid layout")
}

unsafe extern "C" fn buffer_requested(buf: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let _ = std::panic::catch_unwind(|| {
        let mut p = std::ptr::null_mut();
        if OUTSTANDING.fetch_add(1, Ordering::AcqRel) < MAX_BUFFERS {
            // SAFETY: non-zero size layout.
            p = unsafe { std::alloc::alloc(layout()) };
        }
        if p.is_null() {
            OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: CUPTI passes valid out-pointers.
        unsafe {
            *buf = p;
            *size = if p.is_null() { 0 } else { BUF_SIZE };
            *max_records = 0;
        }
    });
}

unsafe extern "C" fn buffer_completed(
    ctx: *mut c_void,
    stream: u32,
    buf: *mut u8,
    _size: usize,
    valid: usize,
) {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(a) = api() {
            let mut n = 0usize;
            // SAFETY: valid out-pointer; ctx/stream as CUPTI passed them.
            if unsafe { (a.dropped)(ctx, stream, &mut n) } == 0 {
                DROPPED.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        if buf.is_null() {
            return;
        }
        // Only hand the buffer over: decoding happens on the writer thread.
        let _ = channel().0.send(Buf {
            ptr: buf as usize,
            valid,
        });
    });
}

/// Decodes every buffer CUPTI completed so far: `f` gets each record's bytes (the
/// CUPTI 13.0 size of its kind; kinds zcta does not decode are skipped). Buffers are
/// freed afterwards.
pub fn drain(f: &mut dyn FnMut(&[u8])) {
    let Ok(a) = api() else { return };
    while let Ok(b) = channel().1.try_recv() {
        let mut rec: *mut c_void = std::ptr::null_mut();
        loop {
            // SAFETY: b.ptr/b.valid are a buffer CUPTI completed; rec is an in/out cursor.
            let rc = unsafe { (a.next_record)(b.ptr as *mut u8, b.valid, &mut rec) };
            if rc != 0 || rec.is_null() {
                break;
            }
            // SAFETY: every record starts with its 4-byte kind.
            let kind = unsafe { (rec as *const u32).read_unaligned() };
            if let Some(n) = zcta::cupti::record_size(kind) {
                // SAFETY: CUPTI wrote a whole record of this kind at rec: at least
                // the CUPTI 13.0 size (newer versions only append fields).
                let bytes = unsafe { std::slice::from_raw_parts(rec as *const u8, n) };
                f(bytes);
            }
        }
        // SAFETY: allocated in buffer_requested with this layout.
        unsafe { std::alloc::dealloc(b.ptr as *mut u8, layout()) };
        OUTSTANDING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A kernel name CUPTI owns (shared by every record of that kernel, never freed).
pub fn name_at(ptr: u64) -> Option<String> {
    if ptr == 0 {
        return None;
    }
    // SAFETY: ptr came from a kernel record's `name` field, a NUL-terminated string
    // CUPTI keeps for the life of the process.
    Some(
        unsafe { CStr::from_ptr(ptr as *const c_char) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// `pthread_self()` truncated to 32 bits, as CUPTI's API records report threads.
pub fn cupti_thread_id() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::pthread_self() as u32 }
}

// ---- Interposed CUPTI entry points: another client is arriving ----

/// The real function of that name in the mapped libcupti.
fn real(name: &CStr) -> *mut c_void {
    for p in mapped_libs("libcupti.so") {
        let h = dlopen(&p, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h != 0 {
            let f = sym(h, name);
            if !f.is_null() && f != own(name) {
                return f;
            }
        }
    }
    std::ptr::null_mut()
}

fn own(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_DEFAULT lookup of a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

const NOT_INITIALIZED: Res = 15;

/// `cuptiActivityRegisterCallbacks` called by someone else (torch.profiler/Kineto).
///
/// # Safety
/// The CUPTI function's contract; arguments are passed through unchanged.
#[allow(non_snake_case)]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuptiActivityRegisterCallbacks(req: ReqFn, done: DoneFn) -> Res {
    crate::gpu::foreign_client("cuptiActivityRegisterCallbacks");
    let f = real(c"cuptiActivityRegisterCallbacks");
    if f.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: the real function has exactly this signature.
    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(ReqFn, DoneFn) -> Res>(f)(req, done) }
}

/// `cuptiSubscribe` called by someone else.
///
/// # Safety
/// The CUPTI function's contract; arguments are passed through unchanged.
#[allow(non_snake_case)]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuptiSubscribe(sub: *mut *mut c_void, cb: *mut c_void, user: *mut c_void) -> Res {
    crate::gpu::foreign_client("cuptiSubscribe");
    let f = real(c"cuptiSubscribe");
    if f.is_null() {
        return NOT_INITIALIZED;
    }
    type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void) -> Res;
    // SAFETY: the real function has exactly this signature.
    unsafe { std::mem::transmute::<*mut c_void, F>(f)(sub, cb, user) }
}

/// `cuptiSubscribe_v2` called by someone else.
///
/// # Safety
/// The CUPTI function's contract; arguments are passed through unchanged.
#[allow(non_snake_case)]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn cuptiSubscribe_v2(
    sub: *mut *mut c_void,
    cb: *mut c_void,
    user: *mut c_void,
    params: *mut c_void,
) -> Res {
    crate::gpu::foreign_client("cuptiSubscribe_v2");
    let f = real(c"cuptiSubscribe_v2");
    if f.is_null() {
        return NOT_INITIALIZED;
    }
    type F = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut c_void, *mut c_void) -> Res;
    // SAFETY: the real function has exactly this signature.
    unsafe { std::mem::transmute::<*mut c_void, F>(f)(sub, cb, user, params) }
}
