//! The CUDA driver calls behind per-operation timing (`crate::timing`): the stamp
//! kernel and the host memory it writes, the capture status of a stream, a stream's
//! context.
//!
//! The driver is never loaded by zcta: only a `libcuda.so.1` the process already
//! mapped is used (`RTLD_NOLOAD`), so a process that runs no CUDA gets no driver from
//! us. Handles cross this module as plain integers; every call returns the driver's
//! `CUresult` as an integer (0: success).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use super::real::dlopen;

type Res = c_int;
type Handle = *mut c_void;

/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

struct Api {
    ctx_get_current: unsafe extern "C" fn(*mut Handle) -> Res,
    ctx_set_current: unsafe extern "C" fn(Handle) -> Res,
    /// `cuCtxGetId` (CUDA 12.0+): absent, contexts are told apart by handle alone.
    ctx_get_id: Option<unsafe extern "C" fn(Handle, *mut u64) -> Res>,
    stream_get_ctx: unsafe extern "C" fn(Handle, *mut Handle) -> Res,
    stream_is_capturing: unsafe extern "C" fn(Handle, *mut c_int) -> Res,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> Res,
    exchange_capture_mode: unsafe extern "C" fn(*mut c_int) -> Res,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> Res,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> Res,
    launch_kernel: LaunchKernel,
    mem_host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> Res,
    host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> Res,
}

/// `cuLaunchKernel(f, gridDim xyz, blockDim xyz, sharedMemBytes, stream, params, extra)`.
type LaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> Res;

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
    // SAFETY (each): the field's type is the C signature of that driver function.
    unsafe {
        Some(Api {
            ctx_get_current: func(h, c"cuCtxGetCurrent")?,
            ctx_set_current: func(h, c"cuCtxSetCurrent")?,
            ctx_get_id: func(h, c"cuCtxGetId"),
            stream_get_ctx: func(h, c"cuStreamGetCtx")?,
            stream_is_capturing: func(h, c"cuStreamIsCapturing")?,
            stream_create: func(h, c"cuStreamCreate")?,
            exchange_capture_mode: func(h, c"cuThreadExchangeStreamCaptureMode")?,
            module_load_data: func(h, c"cuModuleLoadData")?,
            module_get_function: func(h, c"cuModuleGetFunction")?,
            launch_kernel: func(h, c"cuLaunchKernel")?,
            mem_host_register: func(h, c"cuMemHostRegister_v2").or_else(|| func(h, c"cuMemHostRegister"))?,
            host_get_device_pointer: func(h, c"cuMemHostGetDevicePointer_v2")?,
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

/// The driver's id of `ctx`, unique among the contexts the process ever had: a device
/// reset may give a new context the handle of the old one, never its id. 0 when the
/// driver cannot say (before CUDA 12.0, or an error).
pub fn ctx_id(ctx: usize) -> u64 {
    let Some(get) = api().and_then(|a| a.ctx_get_id) else {
        return 0;
    };
    let mut id = 0u64;
    // SAFETY: valid out-pointer; ctx came from cuStreamGetCtx or cuCtxGetCurrent.
    match unsafe { get(ctx as Handle, &mut id) } {
        0 => id,
        _ => 0,
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

/// Makes `ctx` current on the calling thread (0: none): the writer's, where the
/// stamp kernel, its slots and its own stream are made in the op's context; and a
/// program's thread for a stamp launch when another context was current there.
pub fn set_current(ctx: usize) -> Result<(), i32> {
    let a = api().ok_or(-1)?;
    // SAFETY: ctx came from cuStreamGetCtx on a stream the program used, or from
    // cuCtxGetCurrent on this thread (0: unbinds).
    match unsafe { (a.ctx_set_current)(ctx as Handle) } {
        0 => Ok(()),
        e => Err(e),
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

/// zcta's kernels (PTX, compiled by the driver for the GPU at hand), one thread each.
///
/// `zcta_stamp(p)` writes the GPU's `%globaltimer` (ns) to the address it is given.
/// Launched on an op's stream, it runs when everything ahead of it there is done, like
/// an event record, but it is a kernel: unlike a timing event's record it does not
/// make the GPU wait for its other streams' work (docs/PERFORMANCE.md, "What one timed
/// op costs").
///
/// `zcta_anchor(p, flag, running)` puts the GPU's clock on the host's (the writer's
/// clock anchors, on a stream of zcta's own): it writes `%globaltimer` to `running`,
/// waits until the host makes `flag` non-zero, and then writes `%globaltimer` to `p`;
/// the host's clock read just before it sets the flag and just after it sees `p`
/// written brackets that time by about a PCIe round trip, where a stamp's own launch
/// took tens of µs to bracket. It waits at most 1 ms of GPU time: then it writes 1 to
/// `p` (not a GPU time) and ends, so a host that went away never holds the GPU.
///
/// Each is a module of its own: where the driver refuses the anchor's, stamps still
/// work (anchors are then taken with stamps).
const STAMP_PTX: &CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry zcta_stamp(.param .u64 p)
{
  .reg .u64 %rd<3>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u64 %rd2, %globaltimer;
  st.volatile.global.u64 [%rd1], %rd2;
  ret;
}
";

/// The anchor kernel ([`STAMP_PTX`] says what it does).
const ANCHOR_PTX: &CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry zcta_anchor(.param .u64 p, .param .u64 flag, .param .u64 running)
{
  .reg .u64 %rd<9>;
  .reg .pred %pr<3>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd1, %rd1;
  ld.param.u64 %rd2, [flag];
  cvta.to.global.u64 %rd2, %rd2;
  ld.param.u64 %rd3, [running];
  cvta.to.global.u64 %rd3, %rd3;
  mov.u64 %rd4, %globaltimer;
  st.volatile.global.u64 [%rd3], %rd4;
WAIT:
  ld.volatile.global.u64 %rd5, [%rd2];
  setp.ne.u64 %pr1, %rd5, 0;
  @%pr1 bra SEEN;
  mov.u64 %rd6, %globaltimer;
  sub.u64 %rd7, %rd6, %rd4;
  setp.lt.u64 %pr2, %rd7, 1000000;
  @%pr2 bra WAIT;
  mov.u64 %rd8, 1;
  st.volatile.global.u64 [%rd1], %rd8;
  ret;
SEEN:
  mov.u64 %rd8, %globaltimer;
  st.volatile.global.u64 [%rd1], %rd8;
  ret;
}
";

/// zcta's kernels in one context ([`STAMP_PTX`]): the stamp, and the anchor where
/// the driver gave it (else anchors are taken with stamps).
pub struct Kernels {
    pub stamp: usize,
    pub anchor: Option<usize>,
}

/// Loads zcta's kernels into the current context: the stamp's module must load, the
/// anchor's may not.
pub fn kernels() -> Result<Kernels, i32> {
    Ok(Kernels {
        stamp: kernel(STAMP_PTX, c"zcta_stamp")?,
        anchor: kernel(ANCHOR_PTX, c"zcta_anchor").ok(),
    })
}

/// Loads the module `ptx` into the current context: its function `name`.
fn kernel(ptx: &CStr, name: &CStr) -> Result<usize, i32> {
    let a = api().ok_or(-1)?;
    let mut m: Handle = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX text; valid out-pointer.
    match unsafe { (a.module_load_data)(&mut m, ptx.as_ptr().cast()) } {
        0 if !m.is_null() => {}
        0 => return Err(-1),
        e => return Err(e),
    }
    let mut f: Handle = std::ptr::null_mut();
    // SAFETY: m is the module just loaded; the name is NUL-terminated.
    match unsafe { (a.module_get_function)(&mut f, m, name.as_ptr()) } {
        0 if !f.is_null() => Ok(f as usize),
        0 => Err(-1),
        e => Err(e),
    }
}

/// Slots the stamp kernel writes: host memory of zcta's own (never unmapped), pinned
/// and mapped for the GPU in one context, zeroed. Being zcta's, it stays readable
/// when that context goes (a device reset, CUDA's exit handlers): the writer may
/// still be reading it.
pub struct Slots {
    pub cells: &'static [AtomicU64],
    /// The device address of `cells[0]`.
    pub dev: u64,
}

/// `n` slots, registered in the current context (`CU_MEMHOSTREGISTER_PORTABLE |
/// DEVICEMAP`).
pub fn host_slots(n: usize) -> Result<Slots, i32> {
    let a = api().ok_or(-1)?;
    let bytes = n.checked_mul(8).ok_or(-1)?;
    // SAFETY: an anonymous private mapping of `bytes` (zeroed by the kernel); checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || p.is_null() {
        return Err(-1);
    }
    // SAFETY: p is page-aligned memory of `bytes` just mapped; flags PORTABLE (1) |
    // DEVICEMAP (2).
    match unsafe { (a.mem_host_register)(p, bytes, 0x01 | 0x02) } {
        0 => {}
        e => {
            // SAFETY: our mapping, not registered, referenced nowhere.
            unsafe { libc::munmap(p, bytes) };
            return Err(e);
        }
    }
    let mut dev: u64 = 0;
    // SAFETY: p was just registered; valid out-pointer. On failure the registered
    // mapping is left as it is (never handed out).
    match unsafe { (a.host_get_device_pointer)(&mut dev, p, 0) } {
        0 => {}
        e => return Err(e),
    }
    // SAFETY: `bytes` of zeroed, page-aligned memory that is never unmapped from here
    // on, written only through these atomics and by the GPU's stamp kernel.
    let cells: &'static [AtomicU64] = unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), n) };
    Ok(Slots { cells, dev })
}

/// Launches the stamp kernel `func` (of the stream's context) on `stream`, to write
/// the device address `dev` (a slot of [`host_slots`]).
#[inline]
pub fn stamp(func: usize, dev: u64, stream: usize) -> Result<(), i32> {
    // SAFETY: func is the stamp kernel, which takes one u64; the stream is the
    // program's, not capturing (checked by the caller just before) or our own.
    unsafe { launch(func, &mut [dev], stream) }
}

/// Launches the anchor kernel `func` on `stream` (zcta's own), with the device
/// addresses of three slots of [`host_slots`]: where it writes its time, the flag it
/// waits for, and where it says it is running.
pub fn anchor(func: usize, dev: u64, flag: u64, running: u64, stream: usize) -> Result<(), i32> {
    // SAFETY: func is the anchor kernel, which takes three u64; the stream is ours.
    unsafe { launch(func, &mut [dev, flag, running], stream) }
}

/// Launches one thread of kernel `func` on `stream` with the u64 parameters `args`.
///
/// # Safety
/// `func` takes exactly `args.len()` u64 parameters, and may be launched on `stream`.
#[inline]
unsafe fn launch(func: usize, args: &mut [u64], stream: usize) -> Result<(), i32> {
    let a = api().ok_or(-1)?;
    let mut params = [std::ptr::null_mut::<c_void>(); 3];
    for (p, v) in params.iter_mut().zip(args.iter_mut()) {
        *p = (v as *mut u64).cast::<c_void>();
    }
    // SAFETY: by the caller; `params` points at `args`, which outlive the call.
    match unsafe {
        (a.launch_kernel)(
            func as Handle,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            stream as Handle,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// Sets the calling thread's capture interaction mode: its previous mode, or `None`
/// when the driver refused.
fn exchange_capture_mode(mode: c_int) -> Option<c_int> {
    let a = api()?;
    let mut m = mode;
    // SAFETY: valid in/out pointer; affects only the calling thread.
    (unsafe { (a.exchange_capture_mode)(&mut m) } == 0).then_some(m)
}

/// Runs `f` with the calling thread in relaxed capture mode and puts its own mode
/// back after: driver calls that are unsafe during a capture (loading a module,
/// pinning memory) then never invalidate another thread's global-mode capture.
pub fn relaxed<T>(f: impl FnOnce() -> T) -> T {
    let own = exchange_capture_mode(CAPTURE_MODE_RELAXED);
    let r = f();
    if let Some(m) = own {
        exchange_capture_mode(m);
    }
    r
}

/// Puts the calling thread in relaxed capture mode, so its driver calls never count as
/// unsafe calls during another thread's global-mode capture (the writer thread).
pub fn relax_capture_mode() {
    exchange_capture_mode(CAPTURE_MODE_RELAXED);
}

#[cfg(test)]
mod tests {
    #[test]
    fn zctas_kernels_have_the_names_deep_mode_leaves_out() {
        for (ptx, name) in [super::STAMP_PTX, super::ANCHOR_PTX]
            .iter()
            .zip(zcta::gpu::ZCTA_KERNELS)
        {
            let ptx = ptx.to_str().unwrap();
            assert!(ptx.contains(&format!(".entry {name}(")), "{ptx}");
            assert_eq!(ptx.matches(".entry").count(), 1, "{ptx}");
        }
    }
}
