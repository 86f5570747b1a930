//! `proxy`: what NCCL's proxy thread did for each operation (network and other
//! proxy-driven transports), from its profiler plugin.

use crate::record::ProxyRecord;

crate::define_table! {
    /// One row per ProxyOp, ProxyStep or ProxyCtrl event.
    pub struct ProxyTable, ProxyBuilder: "proxy", row = ProxyRecord;
    event: Utf8, required, default, "ProxyOp (one channel's share of an op), ProxyStep (one step of it), ProxyCtrl (the proxy thread's own state) or KernelCh (one channel's GPU timers; only with ZCTA_NCCL_KERNEL_CH=1)" => |r, c| Some(r.kind.name());
    op_id: U64, nullable, delta, "the ops row it works for (`ops.op_id`); NULL for ProxyCtrl, for ops of another process (PXN) and when the link was lost" => |r, c| r.op_id;
    comm_hash: U64, nullable, default, "NCCL's commHash" => |r, c| r.comm_hash;
    rank: I32, nullable, default, "rank in the communicator" => |r, c| r.rank;
    proxy_pid: I32, nullable, default, "ProxyOp: pid of the process whose op this is (differs from `pid` for PXN)" => |r, c| r.pid;
    channel: I32, nullable, default, "ProxyOp, KernelCh: channel id" => |r, c| r.channel;
    peer: I32, nullable, default, "ProxyOp: peer rank" => |r, c| r.peer;
    n_steps: I32, nullable, default, "ProxyOp: steps" => |r, c| r.n_steps;
    chunk_size: I32, nullable, default, "ProxyOp: bytes per step" => |r, c| r.chunk_size;
    is_send: Bool, nullable, default, "ProxyOp: send side" => |r, c| r.is_send;
    step: I32, nullable, default, "ProxyStep: step index" => |r, c| r.step;
    start_ns: I64, required, delta, "event start, ns since the UNIX epoch (CLOCK_REALTIME)" => |r, c| Some(r.start_ns);
    stop_ns: I64, nullable, delta, "event stop (rows are written at the stop: an event NCCL never stops, such as a ProxyOp off the network transport, has no row)" => |r, c| r.stop_ns;
    in_progress_ns: I64, nullable, delta, "ProxyOp: progress began (state 19)" => |r, c| r.in_progress_ns;
    send_gpu_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for the GPU to fill the send buffer (state 8)" => |r, c| r.send_gpu_wait_ns;
    send_peer_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for the peer's credit (state 20, first time)" => |r, c| r.send_peer_wait_ns;
    send_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for the network send to complete (state 9)" => |r, c| r.send_wait_ns;
    recv_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for data from the network (state 10)" => |r, c| r.recv_wait_ns;
    recv_flush_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for the receive flush (state 11)" => |r, c| r.recv_flush_wait_ns;
    recv_gpu_wait_ns: I64, nullable, delta, "ProxyStep: start of the wait for the GPU to consume the data (state 12)" => |r, c| r.recv_gpu_wait_ns;
    trans_size: U64, nullable, default, "ProxyStep: bytes transferred (from states 9/11)" => |r, c| r.trans_size;
    ctrl_first_state: I32, nullable, default, "ProxyCtrl: first state (13 Idle, 14 Active, 15 Sleep, 16 Wakeup, 17 Append, 18 AppendEnd)" => |r, c| r.ctrl_first_state;
    ctrl_first_ns: I64, nullable, delta, "ProxyCtrl: when it was entered" => |r, c| r.ctrl_first_ns;
    ctrl_last_state: I32, nullable, default, "ProxyCtrl: last state" => |r, c| r.ctrl_last_state;
    ctrl_last_ns: I64, nullable, delta, "ProxyCtrl: when it was entered" => |r, c| r.ctrl_last_ns;
    appended_ops: I32, nullable, default, "ProxyCtrl AppendEnd: proxy ops appended" => |r, c| r.appended_ops;
    gpu_timer_start: U64, nullable, delta, "KernelCh: the GPU's %globaltimer (ns) when the channel started the op; its offset to CLOCK_REALTIME is not calibrated" => |r, c| r.gpu_timer_start;
    gpu_timer_stop: U64, nullable, delta, "KernelCh: %globaltimer when the channel finished it" => |r, c| r.gpu_timer_stop;
    pid: I32, required, default, "process id" => |r, c| Some(c.pid);
    tid: I32, required, default, "Linux thread id that stopped the event (usually NCCL's proxy thread)" => |r, c| Some(r.tid);
    host: Utf8, required, default, "host name" => |r, c| Some(&*c.host);
}
