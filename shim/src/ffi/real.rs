//! Finding the real NCCL.
//!
//! PyTorch loads libnccl `RTLD_LOCAL` (as a dependency of a dlopen'ed library), so
//! `dlsym(RTLD_NEXT, ..)` finds nothing. Order used, once, at the first NCCL call:
//! 1. `ZCTA_NCCL_LIB`: that file (`RTLD_NOLOAD` first, so an already-mapped copy is
//!    reused), when it is NCCL (defines `ncclGetVersion`; anything else is warned
//!    about once and passed over);
//! 2. the libnccl already mapped in the process (`dl_iterate_phdr`), reopened with
//!    `RTLD_NOLOAD` — the copy the caller really loaded, even when another copy sits
//!    on the library path;
//! 3. `RTLD_NEXT` (a program linked directly against libnccl);
//! 4. `dlopen("libnccl.so.2")`.
//!
//! Each function is then looked up as `pncclX` (NCCL's PMPI-style strong alias)
//! before `ncclX`, and a result inside our own library (our export of the name) is
//! rejected.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};

/// The library calls are forwarded to.
#[derive(Clone, Debug, Default)]
pub struct LibraryInfo {
    pub path: Option<String>,
    pub version: Option<i32>,
}

struct Lib {
    handle: usize, // *mut c_void; 0 = none (use RTLD_NEXT)
    path: Option<String>,
}

/// Set once, with a compare-and-swap rather than a blocking `OnceLock`: a `fork()`
/// while another thread is inside `find_lib` must not leave the child waiting forever
/// (its first NCCL call still needs the real function).
static LIB: AtomicPtr<Lib> = AtomicPtr::new(std::ptr::null_mut());
static INFO: OnceLock<LibraryInfo> = OnceLock::new();

/// Path of this library (as the loader knows it).
pub fn own_path() -> Option<String> {
    object_of(own_path as *mut c_void)
}

/// Paths of the mapped objects whose file name starts with `prefix` (e.g. `libnccl.so`).
pub fn mapped_libs(prefix: &str) -> Vec<String> {
    struct Search<'a> {
        prefix: &'a str,
        out: Vec<String>,
    }
    unsafe extern "C" fn cb(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid dl_phdr_info; data is the &mut Search we
        // passed to dl_iterate_phdr below, alive for the whole iteration.
        unsafe {
            let search = &mut *(data as *mut Search<'_>);
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let s = CStr::from_ptr(name).to_string_lossy();
                let base = s.rsplit('/').next().unwrap_or("");
                if base.starts_with(search.prefix) {
                    search.out.push(s.into_owned());
                }
            }
        }
        0
    }
    let mut search = Search {
        prefix,
        out: Vec::new(),
    };
    // SAFETY: cb matches the expected signature and only touches `search`.
    unsafe { libc::dl_iterate_phdr(Some(cb), (&mut search as *mut Search<'_>).cast()) };
    search.out
}

pub fn dlopen(path: &str, flags: c_int) -> usize {
    let Ok(c) = CString::new(path) else { return 0 };
    // SAFETY: c is a valid NUL-terminated string.
    unsafe { libc::dlopen(c.as_ptr(), flags) as usize }
}

fn find_lib() -> Lib {
    let own = own_path();
    let asked = std::env::var_os("ZCTA_NCCL_LIB").filter(|s| !s.is_empty());
    if let Some(a) = asked.as_ref().filter(|a| a.to_str().is_none()) {
        zcta::warn(format_args!(
            "ZCTA_NCCL_LIB={a:?} is not UTF-8; looking for the mapped libnccl instead"
        ));
    }
    if let Some(p) = asked.and_then(|a| a.into_string().ok()) {
        let mut h = dlopen(&p, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        let opened_here = h == 0;
        if opened_here {
            h = dlopen(&p, libc::RTLD_LAZY | libc::RTLD_LOCAL);
        }
        if h != 0 && is_nccl(h) {
            return Lib {
                handle: h,
                path: Some(p),
            };
        }
        if h == 0 {
            zcta::warn(format_args!(
                "ZCTA_NCCL_LIB={p:?} cannot be loaded; looking for the mapped libnccl instead"
            ));
        } else {
            if opened_here {
                // SAFETY: h came from our own dlopen above and nothing of it is used.
                unsafe { libc::dlclose(h as *mut c_void) };
            }
            zcta::warn(format_args!(
                "ZCTA_NCCL_LIB={p:?} is not NCCL (it has no ncclGetVersion); looking for the mapped libnccl instead"
            ));
        }
    }
    let mut mapped = mapped_libs("libnccl.so");
    mapped.retain(|p| Some(p) != own.as_ref());
    mapped.dedup();
    if mapped.len() > 1 {
        // Calls cannot be told apart by caller: all go to the first copy.
        zcta::warn(format_args!(
            "{} copies of libnccl are mapped ({}); forwarding every NCCL call to {}. Set ZCTA_NCCL_LIB to choose",
            mapped.len(),
            mapped.join(", "),
            mapped[0]
        ));
    }
    for p in mapped {
        let h = dlopen(&p, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h != 0 {
            return Lib {
                handle: h,
                path: Some(p),
            };
        }
    }
    // SAFETY: RTLD_NEXT lookup with a valid NUL-terminated name.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, c"pncclGetVersion".as_ptr()) };
    if !next.is_null() {
        return Lib {
            handle: 0,
            path: object_of(next),
        };
    }
    let h = dlopen("libnccl.so.2", libc::RTLD_LAZY | libc::RTLD_LOCAL);
    Lib {
        handle: h,
        path: (h != 0).then(|| "libnccl.so.2".to_string()),
    }
}

/// Whether the library behind `handle` is NCCL: it (not our own library) defines
/// `pncclGetVersion` or `ncclGetVersion`.
fn is_nccl(handle: usize) -> bool {
    [c"pncclGetVersion", c"ncclGetVersion"].iter().any(|name| {
        // SAFETY: handle is a live dlopen handle; name is NUL-terminated.
        let f = unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr()) };
        !f.is_null() && !in_own_object(f)
    })
}

/// What the loader knows of the object (library) `addr` lies in.
fn dl_info(addr: *const c_void) -> Option<libc::Dl_info> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded.
    Some(unsafe { info.assume_init() })
}

/// Load address of the object (library) `addr` lies in.
fn object_base(addr: *const c_void) -> Option<usize> {
    let base = dl_info(addr)?.dli_fbase as usize;
    (base != 0).then_some(base)
}

/// Whether `addr` lies in this library. Unlike comparing with one of our exports'
/// addresses, it holds wherever the loader put us: an export's address as our own
/// code takes it resolves through the global scope, which is another library's
/// function of that name when NCCL dlopened us as its plugin only.
pub fn in_own_object(addr: *const c_void) -> bool {
    // A function that is not exported: its address is our own, never interposed.
    matches!((object_base(addr), object_base(in_own_object as *const c_void)), (Some(a), Some(b)) if a == b)
}

/// Whether `addr` lies in the main program (its executable): in one of the loaded
/// segments of the first object the loader lists.
pub fn in_main_program(addr: *const c_void) -> bool {
    struct Probe {
        addr: usize,
        inside: bool,
    }
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid dl_phdr_info whose dlpi_phdr holds
        // dlpi_phnum headers; data is the &mut Probe passed below, alive for the call.
        unsafe {
            let probe = &mut *(data as *mut Probe);
            let info = &*info;
            for i in 0..usize::from(info.dlpi_phnum) {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_LOAD {
                    let lo = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                    if probe.addr >= lo && probe.addr - lo < ph.p_memsz as usize {
                        probe.inside = true;
                    }
                }
            }
        }
        // The main program is listed first: stop there.
        1
    }
    let mut probe = Probe {
        addr: addr as usize,
        inside: false,
    };
    // SAFETY: `first` matches the expected signature and only touches `probe`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut probe as *mut Probe).cast()) };
    probe.inside
}

/// Whether `addr` (e.g. a global NCCL handed us) lies in the libnccl we forward to —
/// not in another copy of NCCL in the process, which may be unloaded later.
pub fn in_forwarded_nccl(addr: *const c_void) -> bool {
    let Some(f) = GET_VERSION.get() else {
        return false;
    };
    matches!((object_base(addr), object_base(f)), (Some(a), Some(b)) if a == b)
}

fn object_of(addr: *mut c_void) -> Option<String> {
    let info = dl_info(addr)?;
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null, loader-owned C string.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn lib() -> &'static Lib {
    let p = LIB.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: a non-null LIB points to a leaked, never-freed Lib.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(find_lib()));
    match LIB.compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: we just published our leaked Box.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: `fresh` was never published; reclaim it. `winner` is leaked.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: as above, a published Lib lives forever.
            unsafe { &*winner }
        }
    }
}

fn lookup(name: &CStr) -> *mut c_void {
    let l = lib();
    let h = if l.handle == 0 {
        libc::RTLD_NEXT
    } else {
        l.handle as *mut c_void
    };
    // SAFETY: h is a handle from dlopen or RTLD_NEXT; name is NUL-terminated.
    unsafe { libc::dlsym(h, name.as_ptr()) }
}

/// Lazily resolved address of one real NCCL function.
pub struct RealFn {
    pname: &'static CStr,
    name: &'static CStr,
    ptr: AtomicPtr<c_void>,
    state: AtomicU8, // 0 unresolved, 1 resolved, 2 missing
    reported: AtomicBool,
}

impl RealFn {
    pub const fn new(pname: &'static CStr, name: &'static CStr) -> Self {
        Self {
            pname,
            name,
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            state: AtomicU8::new(0),
            reported: AtomicBool::new(false),
        }
    }

    /// The real function, never one inside our own library (our export of the same
    /// name: [`in_own_object`]).
    #[inline]
    pub fn get(&self) -> Option<*mut c_void> {
        match self.state.load(Ordering::Acquire) {
            1 => Some(self.ptr.load(Ordering::Relaxed)),
            2 => None,
            _ => self.resolve(),
        }
    }

    #[cold]
    fn resolve(&self) -> Option<*mut c_void> {
        let mut p = lookup(self.pname);
        if p.is_null() || in_own_object(p) {
            p = lookup(self.name);
        }
        if p.is_null() || in_own_object(p) {
            self.state.store(2, Ordering::Release);
            return None;
        }
        self.ptr.store(p, Ordering::Relaxed);
        self.state.store(1, Ordering::Release);
        Some(p)
    }

    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }
}

/// Reported once per function when the real library lacks it.
pub fn missing(f: &RealFn) -> c_int {
    if !f.reported.swap(true, Ordering::Relaxed) {
        zcta::warn(format_args!(
            "the NCCL library ({}) has no {}; returning ncclInternalError",
            lib().path.as_deref().unwrap_or("not found"),
            f.name()
        ));
    }
    zcta::nccl::NCCL_INTERNAL_ERROR
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type CommQuery = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;

static GET_VERSION: RealFn = RealFn::new(c"pncclGetVersion", c"ncclGetVersion");
static COMM_COUNT: RealFn = RealFn::new(c"pncclCommCount", c"ncclCommCount");
static COMM_USER_RANK: RealFn = RealFn::new(c"pncclCommUserRank", c"ncclCommUserRank");
static COMM_CU_DEVICE: RealFn = RealFn::new(c"pncclCommCuDevice", c"ncclCommCuDevice");

/// Path and version of the forwarded-to library.
pub fn library_info() -> LibraryInfo {
    INFO.get_or_init(|| {
        let version = GET_VERSION.get().and_then(|p| {
            // SAFETY: p is ncclGetVersion(int*) of the real library.
            let f: GetVersion = unsafe { std::mem::transmute::<*mut c_void, GetVersion>(p) };
            let mut v: c_int = 0;
            // SAFETY: v is a valid out-pointer.
            (unsafe { f(&mut v) } == 0).then_some(v)
        });
        LibraryInfo {
            path: lib().path.clone(),
            version,
        }
    })
    .clone()
}

fn query(f: &RealFn, comm: usize) -> Option<i32> {
    if comm == 0 {
        return None;
    }
    let p = f.get()?;
    // SAFETY: p is one of ncclCommCount/UserRank/CuDevice(const ncclComm_t, int*).
    let q: CommQuery = unsafe { std::mem::transmute::<*mut c_void, CommQuery>(p) };
    let mut v: c_int = 0;
    // SAFETY: only called for communicators NCCL has just accepted (see hooks), with
    // a valid out-pointer.
    (unsafe { q(comm as *mut c_void, &mut v) } == 0).then_some(v)
}

/// `ncclCommUserRank`.
pub fn comm_rank(comm: usize) -> Option<i32> {
    query(&COMM_USER_RANK, comm)
}
/// `ncclCommCount`.
pub fn comm_count(comm: usize) -> Option<i32> {
    query(&COMM_COUNT, comm)
}
/// `ncclCommCuDevice`.
pub fn comm_device(comm: usize) -> Option<i32> {
    query(&COMM_CU_DEVICE, comm)
}

/// Reads a NUL-terminated C string of at most `max` bytes.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string.
pub unsafe fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: caller guarantees a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
