//! NCCL's network transport between nodes (`NCCL_NET`, InfiniBand/RoCE or sockets).

use super::super::env;
use super::super::model::{Finding, Level};
use super::{Ctx, Judged, src_of};

/// More than one node: what carries the inter-node part.
pub fn inter_node(ctx: &Ctx<'_>) -> Option<String> {
    let f = ctx.f;
    (f.nodes.count > 1).then(|| {
        let net = ctx
            .ev
            .get("NCCL_NET")
            .map(|s| format!("{} chosen by {}", s.value, src_of(s)));
        let ib_off = env::nccl_param(ctx.ev.settings, "NCCL_IB_DISABLE", 0) == 1;
        net.unwrap_or_else(|| {
            if !f.host.ib_devices.is_empty() && !ib_off {
                format!("IB ({})", f.host.ib_devices.join(", "))
            } else if ib_off {
                "Socket (NCCL_IB_DISABLE=1)".into()
            } else {
                "Socket (no InfiniBand/RoCE device in /sys/class/infiniband)".into()
            }
        })
    })
}

/// A limited locked-memory limit for a multi-node job over IB.
pub fn memlock(j: &Judged<'_>, _: &str) -> Option<Finding> {
    let f = j.ctx.f;
    if f.nodes.count <= 1 || f.host.ib_devices.is_empty() {
        return None;
    }
    let m = f.host.memlock.as_deref().filter(|m| *m != "unlimited")?;
    Some(Finding {
        level: Level::Warning,
        what: format!(
            "locked-memory limit is {m} bytes: NCCL's IB transport registers its buffers with the NIC, which counts against it"
        ),
        fix: Some("raise it (ulimit -l unlimited; docker run --ulimit memlock=-1)".into()),
    })
}
