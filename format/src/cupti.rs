//! CUPTI activity records: the constants zcta uses and a safe decoder.
//!
//! The layouts are cudarc's bindings of the CUPTI 13.0 headers (`cuda-13000`), read
//! here only through `size_of` / `offset_of!`: a record handed over by CUPTI is copied
//! into a byte slice by the shim and decoded field by field, so no unsafe code is
//! needed and a truncated record is rejected instead of read past its end.
//! cudarc's library loader is never used (it panics when libcupti is missing and may
//! map a second copy); the shim loads libcupti itself (`shim/src/ffi/cupti.rs`).
//!
//! Newer CUPTI versions append fields to these records (e.g. `Kernel11` in 13.1); the
//! prefix read here is unchanged, and CUPTI's own iterator gives each record's stride.

use std::mem::{offset_of, size_of};

use cudarc::cupti::sys::{
    CUpti_ActivityAPI as Api, CUpti_ActivityExternalCorrelation as ExtCorr, CUpti_ActivityKernel10 as Kernel,
    CUpti_ActivityMemcpy6 as Memcpy, CUpti_ActivityMemcpyPtoP4 as MemcpyPtoP,
    CUpti_ActivityMemset4 as Memset,
};

/// `CUpti_ActivityKind` values used by zcta.
pub mod kind {
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const DRIVER: u32 = 4;
    pub const RUNTIME: u32 = 5;
    pub const CONCURRENT_KERNEL: u32 = 10;
    pub const MEMCPY2: u32 = 22;
    pub const EXTERNAL_CORRELATION: u32 = 39;
}

/// The activity kinds zcta enables by default, in the order it enables them.
/// Driver/runtime API records are not among them: tracing them (which CUPTI needs
/// before it writes EXTERNAL_CORRELATION records) cost +30 µs per 8-byte all_reduce on
/// the GPU machine (docs/PERFORMANCE.md); zcta learns each launch's correlation id from
/// CUPTI's callback API instead, for the few calls below only.
pub const DEFAULT_KINDS: [u32; 4] = [kind::CONCURRENT_KERNEL, kind::MEMCPY, kind::MEMCPY2, kind::MEMSET];

/// The names of the activity kinds zcta can enable (`ZCTA_CUPTI_KINDS`).
const KIND_NAMES: [(&str, u32); 4] = [
    ("kernel", kind::CONCURRENT_KERNEL),
    ("memcpy", kind::MEMCPY),
    ("memcpy2", kind::MEMCPY2),
    ("memset", kind::MEMSET),
];

/// `ZCTA_CUPTI_KINDS` (a developer's knob for measuring what each kind costs): the
/// activity kinds to enable, a comma-separated subset of `kernel`, `memcpy`, `memcpy2`,
/// `memset`, or `none`. Anything else is an error (then the default set is used).
pub fn parse_kinds(text: &str) -> Result<Vec<u32>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim) {
        let k = KIND_NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, k)| k)
            .ok_or_else(|| {
                format!("unknown activity kind {name:?} (kernel, memcpy, memcpy2, memset, none)")
            })?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out)
}

/// The names `parse_kinds` takes, for the kinds given (`none` for none).
pub fn kind_names(kinds: &[u32]) -> String {
    let names: Vec<&str> = kinds
        .iter()
        .map(|&k| {
            KIND_NAMES
                .iter()
                .find(|&&(_, v)| v == k)
                .map_or("other", |&(n, _)| n)
        })
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(",")
    }
}

/// Driver API calls zcta takes a callback on: the kernel launches NCCL uses, and the
/// stream memory operations (flag syncs) of its copy-engine collectives, which have no
/// GPU activity record of their own.
pub const DRIVER_CBIDS: [u32; 3] = [
    652, // cuLaunchKernelEx
    307, // cuLaunchKernel
    CBID_STREAM_BATCH_MEMOP,
];
/// Whether a traced launch call produces activity records of its own: every one but
/// `cuStreamBatchMemOp` (CUPTI records no memory operations; docs/dev/cupti.md).
pub fn launch_has_records(api: &RawApi) -> bool {
    !(api.driver && api.cbid == CBID_STREAM_BATCH_MEMOP)
}

/// Driver callback id of `cuStreamBatchMemOp_v2`.
pub const CBID_STREAM_BATCH_MEMOP: u32 = 667;

/// Runtime API calls likewise: the copy-engine batch copy of NCCL's CE collectives
/// and the copies its proxy thread issues (`NCCL_*_USE_CUDA_MEMCPY=1`).
pub const RUNTIME_CBIDS: [u32; 4] = [
    509, // cudaMemcpyBatchAsync_v13000
    510, // cudaMemcpyBatchAsync_ptsz_v13000
    41,  // cudaMemcpyAsync_v3020
    161, // cudaMemcpyPeerAsync_v4000
];

/// Bytes zcta copies out of CUPTI's buffer for a record of this kind (the CUPTI 13.0
/// struct size); `None` for kinds zcta does not decode.
pub const fn record_size(kind: u32) -> Option<usize> {
    match kind {
        kind::CONCURRENT_KERNEL => Some(size_of::<Kernel>()),
        kind::MEMCPY => Some(size_of::<Memcpy>()),
        kind::MEMCPY2 => Some(size_of::<MemcpyPtoP>()),
        kind::MEMSET => Some(size_of::<Memset>()),
        kind::DRIVER | kind::RUNTIME => Some(size_of::<Api>()),
        kind::EXTERNAL_CORRELATION => Some(size_of::<ExtCorr>()),
        _ => None,
    }
}

/// What ran on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuKind {
    Kernel,
    Memcpy,
    Memset,
}

impl GpuKind {
    pub fn name(self) -> &'static str {
        match self {
            GpuKind::Kernel => "kernel",
            GpuKind::Memcpy => "memcpy",
            GpuKind::Memset => "memset",
        }
    }
}

/// `CUpti_ActivityMemcpyKind` as text.
pub fn copy_kind_name(k: u8) -> &'static str {
    match k {
        1 => "HtoD",
        2 => "DtoH",
        3 => "HtoA",
        4 => "AtoH",
        5 => "AtoA",
        6 => "AtoD",
        7 => "DtoA",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "unknown",
    }
}

/// One GPU activity (kernel, copy or memset) as CUPTI reported it. Times are CUPTI
/// timestamps (ns; CLOCK_REALTIME unless another client changed CUPTI's clock).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RawActivity {
    pub kind: GpuKind,
    pub start_ns: i64,
    pub end_ns: i64,
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    pub correlation_id: u32,
    /// Copies and memsets.
    pub bytes: Option<u64>,
    /// Copies: `CUpti_ActivityMemcpyKind`.
    pub copy_kind: Option<u8>,
    /// Peer copies (MEMCPY2).
    pub src_device: Option<u32>,
    pub dst_device: Option<u32>,
    /// Kernels: grid and block size (NCCL: grid x = channels).
    pub grid: Option<[i32; 3]>,
    pub block_x: Option<i32>,
    /// Kernels: address of the (mangled) name, owned by CUPTI; resolved by the shim.
    pub name_ptr: u64,
    /// 0 when not launched from a CUDA graph.
    pub graph_id: u32,
}

/// A driver or runtime API call (only the few zcta enables: launches and copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawApi {
    pub driver: bool,
    pub cbid: u32,
    pub start_ns: i64,
    pub end_ns: i64,
    /// `pthread_self()` of the calling thread, truncated to 32 bits (not gettid).
    pub thread: u32,
    pub correlation_id: u32,
}

/// A decoded record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Raw {
    Activity(RawActivity),
    Api(RawApi),
    /// The CUDA call `correlation_id` ran while `external_id` was pushed for `external_kind`.
    ExtCorr {
        external_kind: u32,
        external_id: u64,
        correlation_id: u32,
    },
}

fn u8_at(b: &[u8], off: usize) -> u8 {
    b[off]
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn i32_at(b: &[u8], off: usize) -> i32 {
    u32_at(b, off) as i32
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}
fn ts(b: &[u8], off: usize) -> i64 {
    u64_at(b, off) as i64
}

/// Kind of the record at the start of `b` (its first field), if `b` holds one.
pub fn record_kind(b: &[u8]) -> Option<u32> {
    (b.len() >= 4).then(|| u32_at(b, 0))
}

/// Decodes one record (the bytes CUPTI's iterator pointed at, at least
/// [`record_size`] of them). `None`: a kind zcta does not use, or too few bytes.
pub fn decode(b: &[u8]) -> Option<Raw> {
    let k = record_kind(b)?;
    if b.len() < record_size(k)? {
        return None;
    }
    Some(match k {
        kind::CONCURRENT_KERNEL => Raw::Activity(RawActivity {
            kind: GpuKind::Kernel,
            start_ns: ts(b, offset_of!(Kernel, start)),
            end_ns: ts(b, offset_of!(Kernel, end)),
            device: u32_at(b, offset_of!(Kernel, deviceId)),
            context: u32_at(b, offset_of!(Kernel, contextId)),
            stream: u32_at(b, offset_of!(Kernel, streamId)),
            correlation_id: u32_at(b, offset_of!(Kernel, correlationId)),
            bytes: None,
            copy_kind: None,
            src_device: None,
            dst_device: None,
            grid: Some([
                i32_at(b, offset_of!(Kernel, gridX)),
                i32_at(b, offset_of!(Kernel, gridY)),
                i32_at(b, offset_of!(Kernel, gridZ)),
            ]),
            block_x: Some(i32_at(b, offset_of!(Kernel, blockX))),
            name_ptr: u64_at(b, offset_of!(Kernel, name)),
            graph_id: u32_at(b, offset_of!(Kernel, graphId)),
        }),
        kind::MEMCPY => Raw::Activity(RawActivity {
            kind: GpuKind::Memcpy,
            start_ns: ts(b, offset_of!(Memcpy, start)),
            end_ns: ts(b, offset_of!(Memcpy, end)),
            device: u32_at(b, offset_of!(Memcpy, deviceId)),
            context: u32_at(b, offset_of!(Memcpy, contextId)),
            stream: u32_at(b, offset_of!(Memcpy, streamId)),
            correlation_id: u32_at(b, offset_of!(Memcpy, correlationId)),
            bytes: Some(u64_at(b, offset_of!(Memcpy, bytes))),
            copy_kind: Some(u8_at(b, offset_of!(Memcpy, copyKind))),
            src_device: None,
            dst_device: None,
            grid: None,
            block_x: None,
            name_ptr: 0,
            graph_id: u32_at(b, offset_of!(Memcpy, graphId)),
        }),
        kind::MEMCPY2 => Raw::Activity(RawActivity {
            kind: GpuKind::Memcpy,
            start_ns: ts(b, offset_of!(MemcpyPtoP, start)),
            end_ns: ts(b, offset_of!(MemcpyPtoP, end)),
            device: u32_at(b, offset_of!(MemcpyPtoP, deviceId)),
            context: u32_at(b, offset_of!(MemcpyPtoP, contextId)),
            stream: u32_at(b, offset_of!(MemcpyPtoP, streamId)),
            correlation_id: u32_at(b, offset_of!(MemcpyPtoP, correlationId)),
            bytes: Some(u64_at(b, offset_of!(MemcpyPtoP, bytes))),
            copy_kind: Some(u8_at(b, offset_of!(MemcpyPtoP, copyKind))),
            src_device: Some(u32_at(b, offset_of!(MemcpyPtoP, srcDeviceId))),
            dst_device: Some(u32_at(b, offset_of!(MemcpyPtoP, dstDeviceId))),
            grid: None,
            block_x: None,
            name_ptr: 0,
            graph_id: u32_at(b, offset_of!(MemcpyPtoP, graphId)),
        }),
        kind::MEMSET => Raw::Activity(RawActivity {
            kind: GpuKind::Memset,
            start_ns: ts(b, offset_of!(Memset, start)),
            end_ns: ts(b, offset_of!(Memset, end)),
            device: u32_at(b, offset_of!(Memset, deviceId)),
            context: u32_at(b, offset_of!(Memset, contextId)),
            stream: u32_at(b, offset_of!(Memset, streamId)),
            correlation_id: u32_at(b, offset_of!(Memset, correlationId)),
            bytes: Some(u64_at(b, offset_of!(Memset, bytes))),
            copy_kind: None,
            src_device: None,
            dst_device: None,
            grid: None,
            block_x: None,
            name_ptr: 0,
            graph_id: u32_at(b, offset_of!(Memset, graphId)),
        }),
        kind::DRIVER | kind::RUNTIME => Raw::Api(RawApi {
            driver: k == kind::DRIVER,
            cbid: u32_at(b, offset_of!(Api, cbid)),
            start_ns: ts(b, offset_of!(Api, start)),
            end_ns: ts(b, offset_of!(Api, end)),
            thread: u32_at(b, offset_of!(Api, threadId)),
            correlation_id: u32_at(b, offset_of!(Api, correlationId)),
        }),
        kind::EXTERNAL_CORRELATION => Raw::ExtCorr {
            external_kind: u32_at(b, offset_of!(ExtCorr, externalKind)),
            external_id: u64_at(b, offset_of!(ExtCorr, externalId)),
            correlation_id: u32_at(b, offset_of!(ExtCorr, correlationId)),
        },
        _ => return None,
    })
}

/// A kernel's readable name: `_Z<len><name>…` (Itanium mangling of a function in the
/// global namespace) becomes `<name>`; anything else is returned unchanged.
/// `_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE`
/// → `ncclDevKernel_AllReduce_Sum_f32_RING_LL`.
pub fn short_kernel_name(mangled: &str) -> &str {
    let Some(rest) = mangled.strip_prefix("_Z") else {
        return mangled;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(len) = rest[..digits].parse::<usize>() else {
        return mangled;
    };
    rest.get(digits..digits + len).unwrap_or(mangled)
}

/// Whether a kernel is NCCL's (its device kernels, symmetric-memory kernels included).
pub fn is_nccl_kernel(short_name: &str) -> bool {
    short_name.starts_with("nccl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_cupti_13_0() {
        // Sizes from cupti_activity.h 13.0.85, checked with gcc (also in the
        // integration test's C fixture, which asserts the same numbers).
        assert_eq!(record_size(kind::CONCURRENT_KERNEL), Some(216));
        assert_eq!(record_size(kind::MEMCPY), Some(96));
        assert_eq!(record_size(kind::MEMCPY2), Some(96));
        assert_eq!(record_size(kind::MEMSET), Some(88));
        assert_eq!(record_size(kind::RUNTIME), Some(40));
        assert_eq!(record_size(kind::EXTERNAL_CORRELATION), Some(24));
        assert_eq!(record_size(36), None, "CUDA event records are not decoded");
        assert_eq!(record_size(38), None, "synchronisation records are not decoded");
        assert_eq!(record_size(37), None);
    }

    #[test]
    fn kernel_names() {
        assert_eq!(
            short_kernel_name(
                "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"
            ),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        );
        assert_eq!(short_kernel_name("plain"), "plain");
        assert_eq!(short_kernel_name("_Z99x"), "_Z99x");
        assert_eq!(short_kernel_name("_ZN2at6native"), "_ZN2at6native");
        assert!(is_nccl_kernel("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_f32"));
        assert!(!is_nccl_kernel("vectorized_elementwise_kernel"));
    }

    /// Builds a record the way CUPTI 13.0 lays it out, with offsets read from
    /// cupti_activity.h 13.0.85 by gcc (not from cudarc, which the decoder uses).
    fn rec(size: usize, fields: &[(usize, &[u8])]) -> Vec<u8> {
        let mut b = vec![0u8; size];
        for (off, v) in fields {
            b[*off..*off + v.len()].copy_from_slice(v);
        }
        b
    }

    #[test]
    fn decodes_cupti_13_0_records() {
        let k = rec(
            216,
            &[
                (0, &10u32.to_le_bytes()),
                (16, &1_000u64.to_le_bytes()),
                (24, &2_500u64.to_le_bytes()),
                (40, &1u32.to_le_bytes()),
                (44, &7u32.to_le_bytes()),
                (48, &13u32.to_le_bytes()),
                (52, &24i32.to_le_bytes()),
                (56, &1i32.to_le_bytes()),
                (60, &1i32.to_le_bytes()),
                (64, &640i32.to_le_bytes()),
                (92, &99u32.to_le_bytes()),
                (104, &0xdead_beefu64.to_le_bytes()),
                (156, &3u32.to_le_bytes()),
            ],
        );
        let Some(Raw::Activity(a)) = decode(&k) else {
            panic!()
        };
        assert_eq!(a.kind, GpuKind::Kernel);
        assert_eq!(
            (a.start_ns, a.end_ns, a.device, a.context, a.stream),
            (1_000, 2_500, 1, 7, 13)
        );
        assert_eq!(
            (a.correlation_id, a.grid, a.block_x),
            (99, Some([24, 1, 1]), Some(640))
        );
        assert_eq!((a.name_ptr, a.graph_id), (0xdead_beef, 3));

        let m = rec(
            96,
            &[
                (0, &1u32.to_le_bytes()),
                (4, &[8]),
                (8, &4096u64.to_le_bytes()),
                (16, &10u64.to_le_bytes()),
                (24, &20u64.to_le_bytes()),
                (32, &0u32.to_le_bytes()),
                (44, &55u32.to_le_bytes()),
            ],
        );
        let Some(Raw::Activity(a)) = decode(&m) else {
            panic!()
        };
        assert_eq!(
            (a.kind, a.copy_kind, a.bytes, a.correlation_id),
            (GpuKind::Memcpy, Some(8), Some(4096), 55)
        );
        assert_eq!((a.src_device, a.dst_device), (None, None));

        let p = rec(
            96,
            &[
                (0, &22u32.to_le_bytes()),
                (4, &[10]),
                (8, &8u64.to_le_bytes()),
                (16, &10u64.to_le_bytes()),
                (24, &20u64.to_le_bytes()),
                (44, &0u32.to_le_bytes()),
                (52, &1u32.to_le_bytes()),
                (60, &77u32.to_le_bytes()),
            ],
        );
        let Some(Raw::Activity(a)) = decode(&p) else {
            panic!()
        };
        assert_eq!(
            (a.copy_kind, a.src_device, a.dst_device, a.correlation_id),
            (Some(10), Some(0), Some(1), 77)
        );

        let s = rec(
            88,
            &[
                (0, &2u32.to_le_bytes()),
                (8, &64u64.to_le_bytes()),
                (44, &5u32.to_le_bytes()),
            ],
        );
        let Some(Raw::Activity(a)) = decode(&s) else {
            panic!()
        };
        assert_eq!(
            (a.kind, a.bytes, a.correlation_id),
            (GpuKind::Memset, Some(64), 5)
        );

        let api = rec(
            40,
            &[
                (0, &4u32.to_le_bytes()),
                (4, &652u32.to_le_bytes()),
                (8, &100u64.to_le_bytes()),
                (16, &200u64.to_le_bytes()),
                (28, &0xabcdu32.to_le_bytes()),
                (32, &9u32.to_le_bytes()),
            ],
        );
        assert_eq!(
            decode(&api),
            Some(Raw::Api(RawApi {
                driver: true,
                cbid: 652,
                start_ns: 100,
                end_ns: 200,
                thread: 0xabcd,
                correlation_id: 9
            }))
        );

        let e = rec(
            24,
            &[
                (0, &39u32.to_le_bytes()),
                (4, &5u32.to_le_bytes()),
                (8, &(1u64 << 63 | 4).to_le_bytes()),
                (16, &9u32.to_le_bytes()),
            ],
        );
        assert_eq!(
            decode(&e),
            Some(Raw::ExtCorr {
                external_kind: 5,
                external_id: 1 << 63 | 4,
                correlation_id: 9
            })
        );
    }

    #[test]
    fn short_or_unknown_records_are_rejected() {
        assert_eq!(decode(&[]), None);
        let mut b = vec![0u8; 23];
        b[0] = kind::EXTERNAL_CORRELATION as u8;
        assert_eq!(decode(&b), None);
        let mut b = vec![0u8; 64];
        b[0] = 37;
        assert_eq!(decode(&b), None);
        let mut b = vec![0u8; 56];
        b[0] = 38;
        b[4] = 2;
        assert_eq!(decode(&b), None, "a stream wait is not decoded");
    }

    #[test]
    fn kinds_knob() {
        assert_eq!(parse_kinds("none").unwrap(), Vec::<u32>::new());
        assert_eq!(
            parse_kinds(" Kernel,memset,kernel ").unwrap(),
            vec![kind::CONCURRENT_KERNEL, kind::MEMSET]
        );
        assert!(parse_kinds("kernel,api").unwrap_err().contains("\"api\""));
        assert!(
            parse_kinds("kernel,event").is_err(),
            "CUPTI's event records are not used"
        );
        assert!(parse_kinds("").is_err());
        assert_eq!(
            kind_names(&parse_kinds("memset,kernel").unwrap()),
            "memset,kernel"
        );
        assert_eq!(kind_names(&[]), "none");
    }
}
