//! Shared helpers for the CPU-only integration tests (`mod common;`).
//!
//! [`fixtures()`] compiles the C fixtures in `tests/fixtures/` with the system C
//! compiler (`$CC`, default `cc`) once per test process:
//!
//! * `libnccl.so.2`: a stand-in NCCL (every API function as strong `pncclX` plus weak
//!   `ncclX`, like the real one; no data moves). `pncclBcast` re-enters `ncclBroadcast`
//!   and `pncclAlltoAll` re-enters `ncclGroupStart`/`ncclSend`/`ncclRecv`/`ncclGroupEnd`
//!   through the PLT, as NCCL does. Test-only exports: see `tests/fixtures/fake_nccl.h`.
//! * `libglue.so`: links `libnccl.so.2` (RUNPATH `$ORIGIN`), exports `glue_main`; the
//!   stand-in for `libtorch_cuda.so`.
//! * `cupti/libcupti.so.13`: a stand-in CUPTI (the activity API subset zcta uses,
//!   records in the exact CUPTI 13.0 layouts); the stand-in NCCL makes it emit GPU
//!   records where real NCCL launches work (`tests/fixtures/fake_cupti.c`).
//! * `cuda/libcuda.so.1`: a stand-in CUDA driver (the context/stream/module/launch/
//!   host-memory subset zcta's per-op GPU-stamp timing uses, and CUDA events; real C
//!   ABI and error codes; a fake GPU whose streams the stand-in NCCL keeps busy where
//!   real NCCL launches work and that writes each stamp when its stream reaches it,
//!   stream capture with the driver's rules, failure injection, counters in
//!   `FAKE_CUDA_STATS_FILE`: see [`read_cuda_stats`] and `tests/fixtures/fake_cuda.c`).
//! * `host`: dlopens `HOST_CUDA` then `HOST_CUPTI` (if set, `RTLD_GLOBAL`), then
//!   `libglue.so` `RTLD_LOCAL` (as python loads torch) and runs a scenario:
//!   `host ops RANK NRANKS IDFILE ITERS`, `errors`, `threads N ITERS`, `fork`,
//!   `exec HOSTPATH ARGS...`, `loop IDFILE`, `nonccl`, `split`, `register`, `bench N`,
//!   `exit_underscore`, `simulate`, `capture ITERS` (needs `HOST_CUDA`),
//!   `streams ITERS GAP_US`, ... (see `usage()` in `tests/fixtures/glue.c`).
//!
//! The output directory is keyed by a hash of the sources, compiler and flags, under
//! `CARGO_TARGET_TMPDIR`; each build goes to a unique temporary directory that is then
//! renamed into place, so test binaries running in parallel never see a half-built
//! directory.
#![allow(dead_code)]

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::ffi::OsString;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Paths of the built fixtures, all under `dir`.
#[derive(Debug, Clone)]
pub struct Fixtures {
    pub dir: PathBuf,
    /// The `host` executable (does not link libnccl).
    pub host: PathBuf,
    /// The stand-in `libnccl.so.2`.
    pub libnccl: PathBuf,
    /// `libglue.so` (links `libnccl.so.2` through RUNPATH `$ORIGIN`).
    pub libglue: PathBuf,
    /// The stand-in `libcupti.so.13`, in its own folder `cupti/` so nothing finds it
    /// unless a test asks (`HOST_CUPTI`, `ZCTA_CUPTI_LIB`).
    pub libcupti: PathBuf,
    /// The stand-in CUDA driver `libcuda.so.1`, in its own folder `cuda/` so nothing
    /// finds it unless a test asks (`HOST_CUDA`).
    pub libcuda: PathBuf,
    /// `libfakedisk.so`, for `LD_PRELOAD` next to the shim: a disk of
    /// `FAKE_DISK_BYTES` bytes (writes past it fail with ENOSPC;
    /// `tests/fixtures/fake_disk.c`).
    pub libdisk: PathBuf,
}

impl Fixtures {
    /// A `Command` for `host` (add the scenario and its arguments).
    pub fn host_cmd(&self) -> Command {
        Command::new(&self.host)
    }
}

const SOURCES: [&str; 11] = [
    "fake_disk.c",
    "fake_cupti.c",
    "fake_cuda.c",
    "nccl_min.h",
    "profiler_v5_min.h",
    "profiler_v7_min.h",
    "fake_nccl.h",
    "detached.h",
    "fake_nccl.c",
    "glue.c",
    "host.c",
];
const CFLAGS: [&str; 5] = ["-O2", "-fPIC", "-Wall", "-Werror", "-pthread"];

/// Builds the fixtures (once per process) and returns their paths.
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(build_fixtures)
}

/// The directory holding the fixture sources: `tests/fixtures` of this package or of
/// the nearest ancestor that has one (so crates of the workspace can share it).
pub fn fixtures_src_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|d| d.join("tests").join("fixtures"))
        .find(|d| d.join("fake_nccl.c").is_file())
        .unwrap_or_else(|| {
            panic!(
                "tests/fixtures/fake_nccl.c not found in {} or any parent",
                manifest.display()
            )
        })
}

fn compiler() -> OsString {
    std::env::var_os("CC")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| OsString::from("cc"))
}

fn build_fixtures() -> Fixtures {
    let src = fixtures_src_dir();
    let cc = compiler();

    let mut h = DefaultHasher::new();
    cc.hash(&mut h);
    CFLAGS.hash(&mut h);
    for name in SOURCES {
        let p = src.join(name);
        let text = fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
        name.hash(&mut h);
        text.hash(&mut h);
    }
    let key = h.finish();

    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("zcta-fixtures");
    let dir = root.join(format!("{key:016x}"));
    let fx = paths_in(&dir);
    if is_complete(&fx) {
        return fx;
    }

    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = root.join(format!(
        ".tmp-{}-{nanos}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("creating {}: {e}", tmp.display()));

    let result = compile_into(&cc, &src, &tmp);
    if let Err(msg) = result {
        let _ = fs::remove_dir_all(&tmp);
        panic!("building the C test fixtures failed:\n{msg}");
    }

    match fs::rename(&tmp, &dir) {
        Ok(()) => {}
        Err(e) => {
            // Lost a race with another test binary: its (identical) build is in place.
            let _ = fs::remove_dir_all(&tmp);
            if !is_complete(&fx) {
                panic!("moving {} to {}: {e}", tmp.display(), dir.display());
            }
        }
    }
    fx
}

fn paths_in(dir: &Path) -> Fixtures {
    Fixtures {
        dir: dir.to_path_buf(),
        host: dir.join("host"),
        libnccl: dir.join("libnccl.so.2"),
        libglue: dir.join("libglue.so"),
        libcupti: dir.join("cupti").join("libcupti.so.13"),
        libcuda: dir.join("cuda").join("libcuda.so.1"),
        libdisk: dir.join("libfakedisk.so"),
    }
}

fn is_complete(fx: &Fixtures) -> bool {
    fx.host.is_file()
        && fx.libnccl.is_file()
        && fx.libglue.is_file()
        && fx.libcupti.is_file()
        && fx.libcuda.is_file()
        && fx.libdisk.is_file()
}

fn compile_into(cc: &OsString, src: &Path, out: &Path) -> Result<(), String> {
    let mut lib_dir_arg = OsString::from("-L");
    lib_dir_arg.push(out);
    fs::create_dir_all(out.join("cupti")).map_err(|e| format!("creating cupti/: {e}"))?;
    fs::create_dir_all(out.join("cuda")).map_err(|e| format!("creating cuda/: {e}"))?;
    let steps: [(&str, Vec<OsString>); 6] = [
        (
            "libfakedisk.so",
            vec![
                "-shared".into(),
                "-o".into(),
                out.join("libfakedisk.so").into(),
                src.join("fake_disk.c").into(),
                "-ldl".into(),
            ],
        ),
        (
            "libcupti.so.13",
            vec![
                "-shared".into(),
                "-Wl,-soname,libcupti.so.13".into(),
                "-o".into(),
                out.join("cupti").join("libcupti.so.13").into(),
                src.join("fake_cupti.c").into(),
            ],
        ),
        (
            "libcuda.so.1",
            vec![
                "-shared".into(),
                "-Wl,-soname,libcuda.so.1".into(),
                "-o".into(),
                out.join("cuda").join("libcuda.so.1").into(),
                src.join("fake_cuda.c").into(),
            ],
        ),
        (
            "libnccl.so.2",
            vec![
                "-shared".into(),
                "-Wl,-soname,libnccl.so.2".into(),
                "-o".into(),
                out.join("libnccl.so.2").into(),
                src.join("fake_nccl.c").into(),
            ],
        ),
        (
            "libglue.so",
            vec![
                "-shared".into(),
                "-o".into(),
                out.join("libglue.so").into(),
                src.join("glue.c").into(),
                lib_dir_arg,
                "-l:libnccl.so.2".into(),
                // Literal $ORIGIN: no shell involved.
                "-Wl,-rpath,$ORIGIN".into(),
            ],
        ),
        (
            "host",
            vec![
                "-o".into(),
                out.join("host").into(),
                src.join("host.c").into(),
                "-ldl".into(),
            ],
        ),
    ];
    for (what, args) in steps {
        let mut cmd = Command::new(cc);
        cmd.args(CFLAGS).args(&args);
        let output = cmd
            .output()
            .map_err(|e| format!("running {:?} for {what}: {e} (is a C compiler installed?)", cc))?;
        if !output.status.success() {
            return Err(format!(
                "{cmd:?}\nexited with {}\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    Ok(())
}

/// The shim, `<target dir>/<profile>/libzcta_prof.so`, found from the test binary
/// (`<target dir>/<profile>/deps/<test>-<hash>`); `ZCTA_SHIM` overrides.
/// Panics when it is missing: cargo does not build a workspace cdylib for another
/// package's integration tests.
pub fn shim_path() -> PathBuf {
    if let Some(p) = std::env::var_os("ZCTA_SHIM").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "ZCTA_SHIM={} does not exist; build it with `cargo build -p zcta-shim`",
            p.display()
        );
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("test binary has a parent directory")
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let p = dir.join("libzcta_prof.so");
    assert!(
        p.is_file(),
        "the zcta shim is missing at {}: build it with `cargo build -p zcta-shim` \
         (same profile as the tests, e.g. add --release for `cargo test --release`), \
         or point ZCTA_SHIM at a libzcta_prof.so",
        p.display()
    );
    p
}

/// Writes a 128-byte NCCL unique id (random bytes) to `path`, for `host ops`/`loop`.
pub fn write_unique_id(path: &Path) {
    let mut id = vec![0u8; 128];
    match fs::File::open("/dev/urandom") {
        Ok(mut f) => {
            use std::io::Read;
            f.read_exact(&mut id).expect("reading /dev/urandom");
        }
        Err(_) => {
            let mut h = DefaultHasher::new();
            (std::process::id(), SystemTime::now()).hash(&mut h);
            let mut x = h.finish() | 1;
            for b in &mut id {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
        }
    }
    fs::write(path, &id).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Parses the file written by a scenario run with `GLUE_STATS_FILE=<path>`: how many
/// times each `pncclX` was entered in that process, keyed by bare name ("AllReduce").
pub fn read_glue_stats(path: &Path) -> HashMap<String, u64> {
    read_name_value_lines(path)
}

/// Parses the file the stand-in driver writes at exit with `FAKE_CUDA_STATS_FILE=<path>`
/// (and at every `fake_cuda_end_capture`): its counters by name, e.g. `stamps`,
/// `stamps_on_capturing`, `stamps_failed`, `stamps_written`, `modules`,
/// `host_allocs`, `launches`, `launches_captured`, `capture_queries`,
/// `unsafe_during_capture`, `captures_invalidated`, and the CUDA-event ones
/// (`events_created`, `records`, `queries`, ...) (the list is `STATS` in
/// `tests/fixtures/fake_cuda.c`).
pub fn read_cuda_stats(path: &Path) -> HashMap<String, u64> {
    read_name_value_lines(path)
}

/// The writer's clock-anchor launches in a stand-in driver's counters (`stats`), given
/// `timed` launching calls of two stamps each: its anchor kernels, and the stamps it
/// took as anchors (where no try of the anchor kernel answered in a round, as on a
/// loaded machine). Asserts there are at least the timed calls' stamps.
#[allow(dead_code)]
pub fn anchor_launches(stats: &HashMap<String, u64>, timed: u64) -> u64 {
    assert!(
        stats["stamps"] >= 2 * timed,
        "two stamps per timed call: {stats:?}"
    );
    stats["anchors"] + stats["stamps"] - 2 * timed
}

/// "name value" lines, as both stats files are written.
fn read_name_value_lines(path: &Path) -> HashMap<String, u64> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter_map(|l| {
            let (name, n) = l.split_once(' ')?;
            Some((name.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}
