//! The shim as NCCL's profiler plugin, driven by the stand-in NCCL, which loads and
//! calls plugins the way NCCL 2.28.9 does (tests/fixtures/fake_nccl.c): dlopen of
//! `NCCL_PROFILER_PLUGIN`, `ncclProfiler_v5`, `init` per communicator, v5 event
//! descriptors from the calling thread and from a proxy thread; and, with
//! `FAKE_NCCL_PROFILER_ABI`, the way NCCL 2.29 (v6: copy-engine events) and 2.31 (v7)
//! do.

mod common;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Output, Stdio};

use support::{Row, Run, comm_id_of, read_id};

/// Our activation mask: Coll, P2p, ProxyOp, ProxyStep, ProxyCtrl, CollApi, P2pApi.
const MASK: i32 = 2 | 4 | 8 | 16 | 32 | 512 | 1024 | 2048;

/// Runs `plugin RANK 2 ID ITERS` for both ranks at once, with extra env.
fn two_ranks(run: &Run, iters: u32, env: &[(&str, &str)]) -> Vec<Output> {
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    let children: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| {
            let mut c = run.host(&["plugin", r, "2", idf.to_str().unwrap(), &iters.to_string()]);
            c.envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
            out
        })
        .collect()
}

fn stdout_field(out: &Output, key: &str) -> i64 {
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")).map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("no {key}= in {s:?}"))
}

/// ops rows by (pid, op_id).
fn ops_by_id(run: &Run) -> BTreeMap<(i32, u64), Row> {
    run.rows("ops")
        .into_iter()
        .map(|o| ((o.req_i32("pid"), o.req_u64("op_id")), o))
        .collect()
}

#[test]
fn nccl_view_joins_every_op() {
    let run = Run::new("plugin");
    let outs = two_ranks(&run, 3, &[]);
    for out in &outs {
        // Loaded, used, then unloaded at the last CommDestroy (state back to 0).
        assert!(
            stdout_field(out, "events") > 0,
            "the stand-in NCCL drove the shim's plugin"
        );
        assert_eq!(stdout_field(out, "state"), 0);
        assert_eq!(stdout_field(out, "mask") as i32, MASK);
    }
    let procs = run.rows("process");
    assert_eq!(procs.len(), 2);
    for p in &procs {
        assert_eq!(p.str("profiler_plugin"), Some("zcta"));
        assert_eq!(p.u64("plugin_comms"), Some(1));
    }

    // nccl_comms: NCCL's commHash on both ranks, joined to our comm_id.
    let comm_id = comm_id_of(&read_id(&run.scratch("id")));
    let nc = run.rows("nccl_comms");
    assert_eq!(nc.len(), 2);
    let hashes: BTreeSet<u64> = nc.iter().map(|r| r.req_u64("comm_hash")).collect();
    assert_eq!(hashes.len(), 1, "same commHash on every rank");
    for r in &nc {
        assert_eq!(r.u64("comm_id"), Some(comm_id));
        assert_eq!((r.req_i32("nranks"), r.req_i32("n_nodes")), (2, 1));
    }
    let ranks: BTreeSet<i32> = nc.iter().map(|r| r.req_i32("rank")).collect();
    assert_eq!(ranks, BTreeSet::from([0, 1]));

    // Every nccl_ops row belongs to an ops row; every op has its events.
    let ops = ops_by_id(&run);
    let nops = run.rows("nccl_ops");
    let mut per_op: BTreeMap<(i32, u64), Vec<&Row>> = BTreeMap::new();
    for e in &nops {
        let id = e
            .u64("op_id")
            .unwrap_or_else(|| panic!("unjoined plugin event {e:?}"));
        per_op.entry((e.req_i32("pid"), id)).or_default().push(e);
        assert_eq!(e.u64("comm_hash"), hashes.first().copied());
    }
    let mut seq_by_rank: BTreeMap<(i32, &str), Vec<u64>> = BTreeMap::new();
    for (key, o) in &ops {
        let evs = per_op.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let op = o.req_str("op");
        match op {
            "AllReduce" | "Broadcast" => {
                assert_eq!(evs.len(), 1, "{op}: one Coll event: {evs:?}");
                let e = evs[0];
                assert_eq!(e.str("event"), Some("Coll"));
                assert_eq!(e.str("func"), Some(op));
                assert_eq!((e.str("algo"), e.str("proto")), (Some("RING"), Some("LL")));
                assert_eq!((e.req_i32("n_channels"), e.i32("n_warps")), (2, Some(16)));
                assert_eq!(e.i32("rank"), o.i32("rank"));
                if op == "Broadcast" {
                    // NCCL reports Broadcast in bytes of int8.
                    assert_eq!((e.req_u64("count"), e.i32("dtype")), (4096, Some(0)));
                } else {
                    assert_eq!((e.req_u64("count"), e.i32("dtype")), (1024, Some(7)));
                }
                seq_by_rank
                    .entry((o.req_i32("rank"), op))
                    .or_default()
                    .push(e.req_u64("seq_number"));
                assert!(e.req_i64("stop_ns") >= e.req_i64("start_ns"));
            }
            "AlltoAll" => {
                // One P2p per peer and direction (self included).
                assert_eq!(evs.len(), 4, "{evs:?}");
                assert!(evs.iter().all(|e| e.str("event") == Some("P2p")));
                let peers: BTreeSet<(Option<&str>, i32)> =
                    evs.iter().map(|e| (e.str("func"), e.req_i32("peer"))).collect();
                assert_eq!(
                    peers,
                    BTreeSet::from([
                        (Some("Send"), 0),
                        (Some("Send"), 1),
                        (Some("Recv"), 0),
                        (Some("Recv"), 1)
                    ])
                );
            }
            "Send" | "Recv" => {
                assert_eq!(evs.len(), 1, "{op}: {evs:?}");
                assert_eq!(evs[0].str("func"), Some(op));
                assert_eq!(evs[0].i32("peer"), o.i32("peer"));
                assert_eq!(evs[0].req_i32("n_channels"), 2);
            }
            other => panic!("unexpected op {other}"),
        }
    }
    assert_eq!(per_op.len(), ops.len(), "no event without its op");
    for ((rank, op), seqs) in seq_by_rank {
        assert_eq!(
            seqs,
            vec![0, 1, 2],
            "rank {rank} {op}: NCCL's per-function counter"
        );
    }
    // NVLink-like path (no FAKE_NCCL_PROXY): no proxy work at all.
    assert!(run.rows("proxy").is_empty());

    // `zcta summary` tells the same story.
    let out = summary(&run);
    assert!(out.contains("loaded by NCCL for 1 communicator\n"), "{out}");
    assert!(out.contains("AllReduce             6 of 6"), "{out}");
    assert!(
        out.contains("AllReduce      RING       LL        2 channels"),
        "{out}"
    );
}

fn summary(run: &Run) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zcta"))
        .arg("summary")
        .arg(run.dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn proxy_steps_carry_their_op_and_wait_states() {
    let run = Run::new("proxy");
    two_ranks(&run, 2, &[("FAKE_NCCL_PROXY", "1")]);
    let ops = ops_by_id(&run);
    let proxy = run.rows("proxy");
    let by = |kind: &str| {
        proxy
            .iter()
            .filter(|p| p.str("event") == Some(kind))
            .collect::<Vec<_>>()
    };
    let (pops, steps, ctrl) = (by("ProxyOp"), by("ProxyStep"), by("ProxyCtrl"));
    assert!(!pops.is_empty() && !steps.is_empty() && !ctrl.is_empty());

    // Every op that crosses to the other rank has ProxyOps on both channels and steps.
    let key = |r: &Row| (r.req_i32("pid"), r.u64("op_id").expect("joined"));
    let with_ops: BTreeMap<(i32, u64), BTreeSet<i32>> = pops.iter().fold(BTreeMap::new(), |mut m, p| {
        m.entry(key(p)).or_default().insert(p.req_i32("channel"));
        m
    });
    let with_steps: BTreeSet<(i32, u64)> = steps.iter().map(|s| key(s)).collect();
    for (k, o) in &ops {
        let to_self = matches!(o.req_str("op"), "Send" | "Recv") && o.i32("peer") == o.i32("rank");
        if to_self {
            continue;
        }
        assert_eq!(with_ops.get(k), Some(&BTreeSet::from([0, 1])), "{o:?}");
        assert!(with_steps.contains(k), "{o:?}");
    }
    for p in &pops {
        assert_eq!((p.i32("n_steps"), p.i32("chunk_size")), (Some(2), Some(131072)));
        assert!(p.i64("in_progress_ns").is_some());
        assert!(p.req_i64("stop_ns") >= p.req_i64("start_ns"));
    }
    // Each wait state starts in NCCL's order, inside the step.
    for s in &steps {
        let t = |c: &str| s.i64(c);
        let (start, stop) = (s.req_i64("start_ns"), s.req_i64("stop_ns"));
        let chain: Vec<i64> = if t("send_gpu_wait_ns").is_some() {
            ["send_gpu_wait_ns", "send_peer_wait_ns", "send_wait_ns"]
                .iter()
                .map(|c| t(c).unwrap_or_else(|| panic!("{c} missing: {s:?}")))
                .collect()
        } else {
            ["recv_wait_ns", "recv_flush_wait_ns", "recv_gpu_wait_ns"]
                .iter()
                .map(|c| t(c).unwrap_or_else(|| panic!("{c} missing: {s:?}")))
                .collect()
        };
        assert!(
            start <= chain[0] && chain.windows(2).all(|w| w[0] <= w[1]) && chain[2] <= stop,
            "{s:?}"
        );
        assert!(stop > start, "steps take time: {s:?}");
    }
    assert!(steps.iter().any(|s| s.u64("trans_size").is_some_and(|v| v > 0)));
    // ProxyCtrl: the Append batches report how many ops they appended.
    assert!(
        ctrl.iter()
            .any(|c| c.i32("ctrl_last_state") == Some(18) && c.i32("appended_ops") > Some(0))
    );
    assert!(ctrl.iter().all(|c| c.is_null("op_id")));
}

#[test]
fn kernel_channel_timers_on_request() {
    let run = Run::new("kch");
    let outs = two_ranks(&run, 1, &[("ZCTA_NCCL_KERNEL_CH", "1")]);
    assert_eq!(stdout_field(&outs[0], "mask") as i32, MASK | 64);
    let ops = ops_by_id(&run);
    let kch: Vec<Row> = run
        .rows("proxy")
        .into_iter()
        .filter(|p| p.str("event") == Some("KernelCh"))
        .collect();
    for (k, o) in &ops {
        if matches!(o.req_str("op"), "AllReduce" | "Broadcast") {
            let mine: Vec<&Row> = kch
                .iter()
                .filter(|r| (r.req_i32("pid"), r.u64("op_id").unwrap_or(0)) == *k)
                .collect();
            assert_eq!(mine.len(), 2, "one per channel: {o:?}");
            for r in mine {
                let (a, b) = (r.req_u64("gpu_timer_start"), r.req_u64("gpu_timer_stop"));
                assert!(a > 0 && b >= a, "{r:?}");
            }
        }
    }
}

#[test]
fn a_users_plugin_is_left_alone() {
    let run = Run::new("userplugin");
    let outs = two_ranks(
        &run,
        1,
        &[("NCCL_PROFILER_PLUGIN", "/nonexistent/libnccl-profiler-user.so")],
    );
    for out in &outs {
        assert_eq!(
            stdout_field(out, "state"),
            2,
            "NCCL tried the user's plugin (and failed)"
        );
    }
    for p in run.rows("process") {
        assert_eq!(
            p.str("profiler_plugin"),
            Some("user: /nonexistent/libnccl-profiler-user.so")
        );
        assert_eq!(p.u64("plugin_comms"), Some(0));
    }
    assert!(!run.rows("ops").is_empty());
    let out = summary(&run);
    assert!(
        out.contains(
            "missing: your NCCL_PROFILER_PLUGIN=/nonexistent/libnccl-profiler-user.so was left in place"
        ),
        "{out}"
    );
    assert_no_plugin_tables(&run);
}

#[test]
fn zcta_nccl_plugin_0_turns_it_off() {
    let run = Run::new("noplugin");
    let outs = two_ranks(&run, 1, &[("ZCTA_NCCL_PLUGIN", "0")]);
    for out in &outs {
        assert_eq!(stdout_field(out, "events"), 0, "no plugin loaded");
    }
    for p in run.rows("process") {
        assert_eq!(p.str("profiler_plugin"), Some("off: ZCTA_NCCL_PLUGIN=0"));
    }
    assert_no_plugin_tables(&run);
}

/// `ZCTA_NCCL_MASK` (a developers' setting, to measure what NCCL's events cost)
/// replaces the mask: with Coll|CollApi only, collectives keep their Coll rows and
/// point-to-point ops get none; the process row says so.
#[test]
fn a_developer_event_mask_replaces_ours() {
    let run = Run::new("devmask");
    let outs = two_ranks(&run, 2, &[("ZCTA_NCCL_MASK", "0x202")]);
    for out in &outs {
        assert_eq!(stdout_field(out, "mask"), 0x202);
    }
    for p in run.rows("process") {
        assert_eq!(
            p.str("profiler_plugin"),
            Some("zcta (developer setting: event mask 0x202)")
        );
    }
    let events: BTreeSet<String> = run
        .rows("nccl_ops")
        .iter()
        .map(|e| e.req_str("event").to_string())
        .collect();
    assert_eq!(events, BTreeSet::from(["Coll".to_string()]));
}

/// A bad `ZCTA_NCCL_MASK` is said once, at activation, and our events are asked for.
#[test]
fn a_bad_developer_event_mask_warns_once_and_is_ignored() {
    let run = Run::new("badmask");
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    let out = run
        .host(&["plugin", "0", "1", idf.to_str().unwrap(), "1"])
        .env("ZCTA_NCCL_MASK", "coll")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("ZCTA_NCCL_MASK").count(), 1, "{err}");
    assert!(err.contains("using zcta's events"), "{err}");
    assert_eq!(stdout_field(&out, "mask") as i32, MASK);
    for p in run.rows("process") {
        assert_eq!(p.str("profiler_plugin"), Some("zcta"));
    }
}

fn assert_no_plugin_tables(run: &Run) {
    let files = support::list_files(&run.dir());
    assert!(
        files
            .iter()
            .all(|f| !f.starts_with("nccl_") && !f.starts_with("proxy")),
        "{files:?}"
    );
}

#[test]
fn a_plugin_chosen_in_nccl_conf_or_empty_is_the_users() {
    let run = Run::new("conf");
    let conf = run.scratch("nccl.conf");
    std::fs::write(
        &conf,
        "NCCL_DEBUG=WARN\nNCCL_PROFILER_PLUGIN = /opt/other/libprof.so\n",
    )
    .unwrap();
    two_ranks(&run, 1, &[("NCCL_CONF_FILE", conf.to_str().unwrap())]);
    for p in run.rows("process") {
        let want = format!("user: NCCL_PROFILER_PLUGIN in {}", conf.display());
        assert_eq!(p.str("profiler_plugin"), Some(want.as_str()));
    }
    assert_no_plugin_tables(&run);

    let run = Run::new("empty");
    two_ranks(&run, 1, &[("NCCL_PROFILER_PLUGIN", "")]);
    for p in run.rows("process") {
        assert_eq!(p.str("profiler_plugin"), Some("user: "));
    }
    assert_no_plugin_tables(&run);
}

/// A process that inherited NCCL_PROFILER_PLUGIN but does not preload the shim: NCCL
/// loads the library as its plugin only, which asks for no events and records nothing,
/// whether libnccl sits in a library's local scope (python loading libtorch_cuda) or
/// in the global scope (a program linked directly against libnccl), where the
/// plugin's own reference to `ncclAllReduce` finds libnccl's.
#[test]
fn plugin_only_load_records_nothing() {
    for global in ["0", "1"] {
        let run = Run::new(&format!("pluginonly-{global}"));
        let idf = run.scratch("id");
        common::write_unique_id(&idf);
        let out = support::host_plain(&["plugin", "0", "1", idf.to_str().unwrap(), "2"])
            .env("NCCL_PROFILER_PLUGIN", common::shim_path())
            .env("HOST_GLUE_GLOBAL", global)
            .env("ZCTA_OUT", run.out_dir())
            .env("ZCTA_RUN_ID", &run.id)
            .output()
            .unwrap();
        assert!(out.status.success(), "global {global}: {out:?}");
        assert!(
            out.stderr.is_empty(),
            "global {global}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout_field(&out, "mask"),
            0,
            "global {global}: no events asked for"
        );
        assert!(!run.dir().exists(), "global {global}: nothing written");
    }
}

#[test]
fn nccl_events_follow_the_budget() {
    // With a CUDA driver the default times ops under the budget, and NCCL is asked for
    // its events for the ops the budget times only: a budget far below what timing
    // costs raises the level until most ops are skipped, and those have no events.
    let run = Run::new("plugin-follow");
    let cuda = common::fixtures().libcuda.display().to_string();
    let outs = two_ranks(
        &run,
        300,
        &[
            ("HOST_CUDA", cuda.as_str()),
            ("ZCTA_BUDGET", "0.001%"),
            ("HOST_ITER_GAP_MS", "0"),
        ],
    );
    for out in &outs {
        assert!(stdout_field(out, "events") > 0);
    }
    let ops = ops_by_id(&run);
    // Records dropped under load (a starved writer) can take a selected op's events;
    // nothing can give an unselected op events.
    let dropped = run
        .rows("process")
        .iter()
        .any(|p| p.u64("records_dropped").is_some_and(|d| d > 0));
    let mut events: BTreeMap<(i32, u64), usize> = BTreeMap::new();
    for e in run.rows("nccl_ops") {
        let id = e
            .u64("op_id")
            .unwrap_or_else(|| panic!("unjoined plugin event {e:?}"));
        *events.entry((e.req_i32("pid"), id)).or_default() += 1;
    }
    let (mut with, mut without) = (0, 0);
    for (key, o) in &ops {
        let Some(level) = o.u64("timing_level") else {
            continue;
        };
        let (comm, seq, rank) = (o.req_u64("comm_id"), o.req_u64("seq"), o.req_i32("rank"));
        let k = match o.req_str("op") {
            "Send" => zcta::budget::p2p_key(comm, rank, o.req_i32("peer"), seq),
            "Recv" => zcta::budget::p2p_key(comm, o.req_i32("peer"), rank, seq),
            _ => zcta::budget::coll_key(comm, seq),
        };
        // Selected at its level, and timed (the rate limiter had room for it): an op
        // the limiter skipped gets no events either.
        let selected = zcta::budget::selected(k, level as u8) && o.str("timing") == Some("timed");
        let n = events.get(key).copied().unwrap_or(0);
        if dropped {
            assert!(selected || n == 0, "events {n} for {o:?}");
        } else {
            assert_eq!(n > 0, selected, "events {n} for {o:?}");
        }
        if selected {
            with += 1;
        } else {
            without += 1;
        }
    }
    assert!(
        without > ops.len() / 2,
        "the level went up: {without} of {} skipped",
        ops.len()
    );
    assert!(with > 0, "some ops were selected");
    // `zcta summary` says why most ops have no NCCL view.
    let out = summary(&run);
    assert!(out.contains("not selected by the budget"), "{out}");
    // The budget applies only while ops are timed.
    let procs = run.rows("process");
    assert!(
        procs
            .iter()
            .all(|p| p.str("gpu_timing").is_some_and(|s| s.starts_with("on")))
    );
}

/// The CE event bits (CeColl, CeSync, CeBatch) asked for from a v6+ NCCL.
const CE_BITS: i32 = (1 << 12) | (1 << 13) | (1 << 14);

fn bool_col(r: &Row, col: &str) -> Option<bool> {
    match r.get(col) {
        support::Val::Bool(b) => Some(*b),
        _ => None,
    }
}

#[test]
fn each_profiler_abi_is_loaded_newest_first() {
    for abi in [5, 6, 7] {
        let run = Run::new(&format!("abi{abi}"));
        let v = abi.to_string();
        let outs = two_ranks(&run, 2, &[("FAKE_NCCL_PROFILER_ABI", v.as_str())]);
        let want_mask = if abi >= 6 { MASK | CE_BITS } else { MASK };
        for out in &outs {
            assert!(stdout_field(out, "events") > 0);
            // KernelPhase (1 << 15) is never asked for by default.
            assert_eq!(stdout_field(out, "mask") as i32, want_mask, "v{abi}");
        }
        let name = format!("v{abi}");
        for p in run.rows("process") {
            assert_eq!(p.str("profiler_abi"), Some(name.as_str()));
        }
        for c in run.rows("nccl_comms") {
            assert_eq!(c.str("profiler_abi"), Some(name.as_str()));
        }
        // Every version's descriptors decode to the same rows.
        let nops = run.rows("nccl_ops");
        assert!(nops.iter().all(|e| e.u64("op_id").is_some()));
        let coll: Vec<&Row> = nops.iter().filter(|e| e.str("event") == Some("Coll")).collect();
        assert_eq!(
            coll.len(),
            2 * 2 * 2,
            "AllReduce and Broadcast, 2 iterations, 2 ranks"
        );
        for e in coll {
            assert_eq!((e.str("algo"), e.str("proto")), (Some("RING"), Some("LL")));
            assert_eq!((e.req_i32("n_channels"), e.i32("n_warps")), (2, Some(16)));
            // v7's columns are NULL before v7; v7 without a tag says 0.
            let tag = (abi == 7).then_some(0);
            assert_eq!(e.u64("user_tag"), tag, "v{abi}: {e:?}");
            assert_eq!(bool_col(e, "is_sym_coll"), (abi == 7).then_some(false));
        }
        let p2p = nops.iter().filter(|e| e.str("event") == Some("P2p")).count();
        assert_eq!(p2p, 2 * 2 * (4 + 2), "AlltoAll's 4 and the group's Send and Recv");
    }
    // Not loaded: NULL.
    let run = Run::new("abi-none");
    two_ranks(&run, 1, &[("ZCTA_NCCL_PLUGIN", "0")]);
    for p in run.rows("process") {
        assert!(p.is_null("profiler_abi"), "{p:?}");
    }
}

/// Runs the plugin scenario with every op timed by CUDA events (the default mode's
/// engine comes from NCCL's events during the launching call).
fn timed_ranks(run: &Run, env: &[(&str, &str)]) -> Vec<Output> {
    let cuda = common::fixtures().libcuda.display().to_string();
    let mut e: Vec<(&str, &str)> = vec![("HOST_CUDA", cuda.as_str()), ("ZCTA_BUDGET", "all")];
    e.extend_from_slice(env);
    two_ranks(run, 3, &e)
}

#[test]
fn copy_engine_collectives_come_from_ce_events() {
    let run = Run::new("ce-v6");
    timed_ranks(&run, &[("FAKE_NCCL_PROFILER_ABI", "6"), ("FAKE_NCCL_CE", "1")]);
    let ops = ops_by_id(&run);
    let mut per_op: BTreeMap<(i32, u64), Vec<Row>> = BTreeMap::new();
    for e in run.rows("nccl_ops") {
        let id = e.u64("op_id").unwrap_or_else(|| panic!("unjoined {e:?}"));
        per_op.entry((e.req_i32("pid"), id)).or_default().push(e);
    }
    let mut ce_seqs: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    for (k, o) in &ops {
        assert_eq!(o.str("gpu_source"), Some("stamps"), "{o:?}");
        let evs = per_op.get(k).map(Vec::as_slice).unwrap_or(&[]);
        if o.req_str("op") == "AlltoAll" {
            assert_eq!(o.str("engine"), Some("copy_engine"), "{o:?}");
            assert_eq!(evs.len(), 1, "one CeColl, no P2p: {evs:?}");
            let e = &evs[0];
            assert_eq!(e.str("event"), Some("CeColl"));
            assert_eq!(e.str("func"), Some("AlltoAll"));
            assert_eq!((e.req_u64("count"), e.i32("dtype")), (32, Some(7)));
            assert_eq!(e.str("sync_strategy"), Some("UC"));
            assert_eq!(e.req_i32("n_channels"), 0);
            // One batch of a copy per rank (32 floats each), a sync on either side.
            assert_eq!(e.u64("ce_batches"), Some(1));
            assert_eq!(e.u64("ce_batch_ops"), Some(2));
            assert_eq!(e.u64("ce_batch_bytes"), Some(2 * 128));
            assert_eq!(e.u64("ce_syncs"), Some(2));
            assert!(e.is_null("user_tag"), "v6 has no tag");
            assert_eq!(e.i32("rank"), o.i32("rank"));
            ce_seqs
                .entry(o.req_i32("rank"))
                .or_default()
                .push(e.req_u64("seq_number"));
        } else {
            assert_eq!(o.str("engine"), Some("sm_kernel"), "{o:?}");
            assert!(evs.iter().all(|e| e.str("event") != Some("CeColl")));
        }
    }
    for (rank, seqs) in ce_seqs {
        assert_eq!(seqs, vec![0, 2, 4], "rank {rank}: two syncs per CE collective");
    }

    // The same NCCL with a v5 plugin (NCCL 2.29 loading an older plugin): the CE
    // events are dropped, so the copy-engine ops' engine is not known.
    let run = Run::new("ce-v5");
    timed_ranks(&run, &[("FAKE_NCCL_PROFILER_ABI", "5"), ("FAKE_NCCL_CE", "1")]);
    let ops = ops_by_id(&run);
    let joined: BTreeSet<(i32, u64)> = run
        .rows("nccl_ops")
        .iter()
        .map(|e| (e.req_i32("pid"), e.req_u64("op_id")))
        .collect();
    for (k, o) in &ops {
        if o.req_str("op") == "AlltoAll" {
            assert!(o.is_null("engine"), "{o:?}");
            assert!(!joined.contains(k));
        } else {
            assert_eq!(o.str("engine"), Some("sm_kernel"), "{o:?}");
        }
    }
}

#[test]
fn v7_fields_fill_their_columns() {
    let run = Run::new("v7");
    timed_ranks(
        &run,
        &[
            ("FAKE_NCCL_PROFILER_ABI", "7"),
            ("FAKE_NCCL_CE", "1"),
            ("FAKE_NCCL_SYM", "1"),
            ("FAKE_NCCL_USER_TAG", "42"),
        ],
    );
    let ops = ops_by_id(&run);
    let nops = run.rows("nccl_ops");
    assert!(!nops.is_empty());
    for e in &nops {
        assert_eq!(e.u64("user_tag"), Some(42), "{e:?}");
        let o = &ops[&(e.req_i32("pid"), e.req_u64("op_id"))];
        match e.req_str("event") {
            "Coll" => {
                assert_eq!(bool_col(e, "is_sym_coll"), Some(true));
                let want = format!("{}_AGxLL_R", o.req_str("op"));
                if o.req_str("op") == "AllReduce" {
                    assert_eq!(e.str("kernel_variant"), Some(want.as_str()));
                }
                assert!(e.str("kernel_variant").is_some());
            }
            "P2p" => {
                assert!(e.is_null("is_sym_coll") && e.is_null("kernel_variant"));
            }
            "CeColl" => assert_eq!(o.req_str("op"), "AlltoAll"),
            other => panic!("{other}"),
        }
    }
    for o in ops.values() {
        let want = match o.req_str("op") {
            "AllReduce" | "Broadcast" => "symmetric_kernel",
            "AlltoAll" => "copy_engine",
            _ => "sm_kernel",
        };
        assert_eq!(o.str("engine"), Some(want), "{o:?}");
    }
}

#[test]
fn a_kernel_phase_mask_brings_kernel_channels() {
    // Timed ops: the shim writes NCCL's mask before every op, past NCCL's own check at
    // init, so the dependency must be the shim's too.
    let run = Run::new("kphase");
    let outs = timed_ranks(
        &run,
        &[("FAKE_NCCL_PROFILER_ABI", "7"), ("ZCTA_NCCL_MASK", "0x8002")],
    );
    for out in &outs {
        assert_eq!(stdout_field(out, "mask"), 0x8042, "KernelPhase needs KernelCh");
    }
    let kch = run
        .rows("proxy")
        .iter()
        .filter(|p| p.str("event") == Some("KernelCh") && p.u64("op_id").is_some())
        .count();
    // Per channel (2) of every Coll (AllReduce, Broadcast) and of every P2p to the other
    // rank (AlltoAll's two, the group's Send and Recv): 12 per iteration and rank.
    assert_eq!(kch, 12 * 3 * 2);
}
