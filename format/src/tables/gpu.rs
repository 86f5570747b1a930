//! `gpu`: one row per GPU activity (kernel, copy, memset) CUPTI attributed to NCCL.

use crate::cupti;
use crate::rows::GpuRow;

crate::define_table! {
    /// One row per GPU activity of an NCCL operation.
    pub struct GpuTable, GpuBuilder: "gpu", row = GpuRow;
    op_id: U64, nullable, delta, "the op whose call launched it (`ops.op_id`); NULL when it belongs to a group (see group_id) or to a CUDA graph launch (attribution graph_launch)" => |r, c| r.op_id;
    group_id: U64, nullable, delta, "the group whose ncclGroupEnd launched it (`ops.group_id`: every op of the group shares it); NULL for an ungrouped op" => |r, c| r.group_id;
    attribution: Utf8, required, default, "how it was tied to its op (docs/phases.md): nccl_call (launched by a CUDA call made inside the NCCL call), proxy_window (a copy NCCL's proxy thread issued, given to the op whose NCCL kernel on the device was running when it was issued) or graph_launch (an NCCL kernel run by a launch of a CUDA graph; op_id and group_id NULL: the ops captured into the graph are in ops with graph_captured, and which replay belongs to which op is not known)" => |r, c| Some(r.attribution.name());
    kind: Utf8, required, default, "kernel, memcpy or memset" => |r, c| Some(r.act.raw.kind.name());
    name: Utf8, nullable, default, "kernels: name, demangled to the function name (ncclDevKernel_AllReduce_Sum_f32_RING_LL names the kernel specialisation, not the algorithm run: see nccl_ops.algo)" => |r, c| r.act.name.as_deref();
    copy_kind: Utf8, nullable, default, "copies: HtoD, DtoH, DtoD, PtoP (peer device), HtoH, …" => |r, c| r.act.raw.copy_kind.map(cupti::copy_kind_name);
    bytes: U64, nullable, default, "copies and memsets: bytes" => |r, c| r.act.raw.bytes;
    start_ns: I64, required, delta, "start on the GPU, ns, CUPTI's clock (CLOCK_REALTIME: see process.gpu_clock)" => |r, c| Some(r.act.raw.start_ns);
    end_ns: I64, required, delta, "end on the GPU, same clock" => |r, c| Some(r.act.raw.end_ns);
    launch_ns: I64, nullable, delta, "entry into the CUDA call that issued it (cuLaunchKernel[Ex], cudaMemcpyBatchAsync, cudaMemcpyAsync, read in CUPTI's API callback), same clock; NULL when that call was not seen" => |r, c| r.launch_ns;
    api_thread: U32, nullable, default, "thread that issued it: pthread_self() truncated to 32 bits (as CUPTI reports threads; not gettid); NULL when that call was not seen" => |r, c| r.api_thread;
    device: U32, required, default, "CUDA device id" => |r, c| Some(r.act.raw.device);
    context: U32, required, default, "CUPTI context id" => |r, c| Some(r.act.raw.context);
    stream: U32, required, default, "CUPTI stream id (not the cudaStream_t address in ops.stream)" => |r, c| Some(r.act.raw.stream);
    correlation_id: U32, required, delta, "CUPTI correlation id of the issuing CUDA call" => |r, c| Some(r.act.raw.correlation_id);
    src_device: U32, nullable, default, "peer copies: source device" => |r, c| r.act.raw.src_device;
    dst_device: U32, nullable, default, "peer copies: destination device" => |r, c| r.act.raw.dst_device;
    grid_x: I32, nullable, default, "kernels: grid size x (NCCL: the number of channels)" => |r, c| r.act.raw.grid.map(|g| g[0]);
    grid_y: I32, nullable, default, "kernels: grid size y" => |r, c| r.act.raw.grid.map(|g| g[1]);
    block_x: I32, nullable, default, "kernels: threads per block x" => |r, c| r.act.raw.block_x;
    graph_id: U32, nullable, default, "CUDA graph id when launched from a graph; NULL otherwise" => |r, c| (r.act.raw.graph_id != 0).then_some(r.act.raw.graph_id);
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
