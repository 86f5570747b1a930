//! NCCL facts zcta needs as data: operation and call names, datatype sizes, result
//! codes, and the nccl-tests message-size rule. Raw C enums cross the ABI as `i32`
//! and are only turned into Rust enums here, after validation.

/// An NCCL operation that moves data: one row of the `ops` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    AllReduce,
    Broadcast,
    Bcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl OpKind {
    pub const ALL: [OpKind; 11] = [
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Bcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AlltoAll,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::Send,
        OpKind::Recv,
    ];

    /// NCCL function name without the `nccl` prefix, as written in `ops.op`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "AllReduce",
            OpKind::Broadcast => "Broadcast",
            OpKind::Bcast => "Bcast",
            OpKind::Reduce => "Reduce",
            OpKind::AllGather => "AllGather",
            OpKind::ReduceScatter => "ReduceScatter",
            OpKind::AlltoAll => "AlltoAll",
            OpKind::Gather => "Gather",
            OpKind::Scatter => "Scatter",
            OpKind::Send => "Send",
            OpKind::Recv => "Recv",
        }
    }

    pub fn from_name(s: &str) -> Option<OpKind> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Point-to-point ops are matched by (sender, receiver, per-peer index), not by
    /// the communicator-wide collective sequence.
    pub fn is_p2p(self) -> bool {
        matches!(self, OpKind::Send | OpKind::Recv)
    }

    /// Message size in bytes as nccl-tests defines it, from the count argument.
    /// AllReduce/Broadcast/Reduce/Send/Recv: count×size; AllGather (sendcount),
    /// AlltoAll (per-peer count), Gather, Scatter (per-rank count) and ReduceScatter
    /// (recvcount): count×nranks×size. `None` for an unknown datatype or nranks.
    pub fn message_bytes(self, count: u64, dtype: i32, nranks: Option<i32>) -> Option<u64> {
        let size = dtype_size(dtype)?;
        let base = count.checked_mul(size)?;
        match self {
            OpKind::AllReduce
            | OpKind::Broadcast
            | OpKind::Bcast
            | OpKind::Reduce
            | OpKind::Send
            | OpKind::Recv => Some(base),
            OpKind::AllGather
            | OpKind::ReduceScatter
            | OpKind::AlltoAll
            | OpKind::Gather
            | OpKind::Scatter => {
                let n = u64::try_from(nranks?).ok().filter(|&n| n > 0)?;
                base.checked_mul(n)
            }
        }
    }
}

/// A control call of the NCCL API: one row of the `calls` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CallKind {
    GroupStart,
    GroupEnd,
    GroupSimulateEnd,
    CommInitRank,
    CommInitRankConfig,
    CommInitRankScalable,
    CommInitAll,
    CommSplit,
    CommShrink,
    CommFinalize,
    CommDestroy,
    CommAbort,
    CommRegister,
    CommDeregister,
    CommWindowRegister,
    CommWindowDeregister,
}

impl CallKind {
    pub fn name(self) -> &'static str {
        match self {
            CallKind::GroupStart => "GroupStart",
            CallKind::GroupEnd => "GroupEnd",
            CallKind::GroupSimulateEnd => "GroupSimulateEnd",
            CallKind::CommInitRank => "CommInitRank",
            CallKind::CommInitRankConfig => "CommInitRankConfig",
            CallKind::CommInitRankScalable => "CommInitRankScalable",
            CallKind::CommInitAll => "CommInitAll",
            CallKind::CommSplit => "CommSplit",
            CallKind::CommShrink => "CommShrink",
            CallKind::CommFinalize => "CommFinalize",
            CallKind::CommDestroy => "CommDestroy",
            CallKind::CommAbort => "CommAbort",
            CallKind::CommRegister => "CommRegister",
            CallKind::CommDeregister => "CommDeregister",
            CallKind::CommWindowRegister => "CommWindowRegister",
            CallKind::CommWindowDeregister => "CommWindowDeregister",
        }
    }
}

/// Size in bytes of an `ncclDataType_t`, `None` for values NCCL does not define.
pub fn dtype_size(dtype: i32) -> Option<u64> {
    Some(match dtype {
        0 | 1 => 1,   // int8, uint8
        2 | 3 => 4,   // int32, uint32
        4 | 5 => 8,   // int64, uint64
        6 | 9 => 2,   // float16, bfloat16
        7 => 4,       // float32
        8 => 8,       // float64
        10 | 11 => 1, // float8 e4m3, e5m2
        _ => return None,
    })
}

/// Name of an `ncclDataType_t`.
pub fn dtype_name(dtype: i32) -> Option<&'static str> {
    Some(match dtype {
        0 => "int8",
        1 => "uint8",
        2 => "int32",
        3 => "uint32",
        4 => "int64",
        5 => "uint64",
        6 => "float16",
        7 => "float32",
        8 => "float64",
        9 => "bfloat16",
        10 => "float8e4m3",
        11 => "float8e5m2",
        _ => return None,
    })
}

/// Function names NCCL's profiler plugin reports (`collectives.cc`), by code.
pub const PLUGIN_FUNCS: [&str; 11] = [
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "Send",
    "Recv",
    "AlltoAll",
    "Gather",
    "Scatter",
    "SendRecv",
];
/// `process.profiler_abi` / `nccl_comms.profiler_abi`: "v5", "v6" or "v7".
pub fn profiler_abi_name(abi: u8) -> Option<&'static str> {
    match abi {
        5 => Some("v5"),
        6 => Some("v6"),
        7 => Some("v7"),
        _ => None,
    }
}

/// Sync strategies of NCCL's copy-engine collectives (v6 `ceColl.syncStrategy`:
/// multicast or unicast memory flags).
pub const CE_SYNC_STRATEGIES: [&str; 2] = ["MC", "UC"];
/// Algorithm names NCCL's profiler plugin reports.
pub const PLUGIN_ALGOS: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
/// Protocol names NCCL's profiler plugin reports.
pub const PLUGIN_PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// Code of `name` in one of the `PLUGIN_*` tables (`u8::MAX`: not a known name).
pub fn name_code(table: &[&str], name: &str) -> u8 {
    table.iter().position(|n| *n == name).map_or(u8::MAX, |i| i as u8)
}

/// Name of a code from [`name_code`] (`None` for an unknown name).
pub fn code_name(table: &[&'static str], code: u8) -> Option<&'static str> {
    table.get(code as usize).copied()
}

/// `ncclDataType_t` of the name NCCL's profiler plugin reports ("ncclFloat32" ...).
pub fn dtype_from_plugin_name(name: &str) -> Option<i32> {
    Some(match name {
        "ncclInt8" => 0,
        "ncclUint8" => 1,
        "ncclInt32" => 2,
        "ncclUint32" => 3,
        "ncclInt64" => 4,
        "ncclUint64" => 5,
        "ncclFloat16" => 6,
        "ncclFloat32" => 7,
        "ncclFloat64" => 8,
        "ncclBfloat16" => 9,
        "ncclFloat8e4m3" => 10,
        "ncclFloat8e5m2" => 11,
        _ => return None,
    })
}

/// `ncclSuccess`.
pub const NCCL_SUCCESS: i32 = 0;
/// `ncclInternalError`, returned when the real library lacks a function.
pub const NCCL_INTERNAL_ERROR: i32 = 3;
/// `ncclInProgress`: a non-blocking communicator accepted the call.
pub const NCCL_IN_PROGRESS: i32 = 7;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: i32 = -1;

/// Whether a result code means the operation was accepted (and so took a sequence
/// number on every rank).
pub fn accepted(result: i32) -> bool {
    result == NCCL_SUCCESS || result == NCCL_IN_PROGRESS
}

/// Name of an `ncclResult_t`.
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "unknown",
    }
}

/// NCCL's integer version (`ncclGetVersion`) as (major, minor, patch): since 2.9 the
/// code is major × 10000 plus minor × 100 plus patch (22809 = 2.28.9), before it major
/// × 1000 plus minor × 100 plus patch (2708 = 2.7.8). `None` for a negative code.
pub fn version_parts(code: i32) -> Option<(u32, u32, u32)> {
    let c = u32::try_from(code).ok()?;
    Some(if c >= 10000 {
        (c / 10000, (c % 10000) / 100, c % 100)
    } else {
        (c / 1000, (c % 1000) / 100, c % 100)
    })
}

/// Decode NCCL's integer version (e.g. 22809) as "2.28.9".
pub fn version_string(code: i32) -> String {
    let (major, minor, patch) = version_parts(code).unwrap_or((0, 0, 0));
    format!("{major}.{minor}.{patch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_tests_sizes() {
        assert_eq!(OpKind::AllReduce.message_bytes(1024, 7, Some(8)), Some(4096));
        assert_eq!(OpKind::AllGather.message_bytes(100, 7, Some(2)), Some(800));
        assert_eq!(OpKind::AlltoAll.message_bytes(32, 7, Some(4)), Some(512));
        assert_eq!(OpKind::ReduceScatter.message_bytes(64, 9, Some(2)), Some(256));
        assert_eq!(OpKind::Send.message_bytes(8, 1, None), Some(8));
        assert_eq!(OpKind::AllGather.message_bytes(8, 1, None), None);
        assert_eq!(OpKind::AllReduce.message_bytes(8, 99, Some(2)), None);
        assert_eq!(OpKind::AllReduce.message_bytes(u64::MAX, 8, Some(2)), None);
    }

    #[test]
    fn names_round_trip() {
        for k in OpKind::ALL {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(2708), "2.7.8");
    }
}
