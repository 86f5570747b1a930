//! Per-op GPU timing with GPU stamps (the default GPU capture), driven on the CPU: the
//! stand-in driver (tests/fixtures/fake_cuda.c) models each stream's work in time, so
//! a stamp (zcta's one-thread kernel that writes the GPU clock to a slot of host
//! memory) is written when the work ahead of it is done; the stand-in NCCL runs its
//! "kernels" on the op's stream. The shim must launch one stamp pair per launching
//! call, never into a capturing stream, never wait for a stamp, and put their times on
//! CLOCK_REALTIME.

mod common;
mod support;

use std::collections::HashMap;
use std::process::Output;

use support::{Row, Run, text};

fn cuda() -> String {
    common::fixtures().libcuda.display().to_string()
}

/// `host ARGS` under the shim with the stand-in driver loaded; returns its output and
/// the driver's counters.
fn run_with_driver(run: &Run, args: &[&str], env: &[(&str, &str)]) -> (Output, HashMap<String, u64>) {
    let stats = run.scratch("cuda-stats");
    let mut c = run.host(args);
    c.env("HOST_CUDA", cuda()).env("FAKE_CUDA_STATS_FILE", &stats);
    c.envs(env.iter().copied());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out.stderr));
    (out, common::read_cuda_stats(&stats))
}

fn process(run: &Run) -> Row {
    let mut p = run.rows("process");
    assert_eq!(p.len(), 1);
    p.remove(0)
}

fn ops_args(run: &Run, iters: u32) -> Vec<String> {
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    vec![
        "ops".into(),
        "0".into(),
        "1".into(),
        idf.display().to_string(),
        iters.to_string(),
    ]
}

#[test]
fn every_op_and_every_group_gets_one_stamp_pair() {
    let run = Run::new("timing-streams");
    let (out, stats) = run_with_driver(&run, &["streams", "3", "0"], &[("ZCTA_BUDGET", "all")]);
    assert!(text(&out.stdout).contains("ok"));
    let ops = run.rows("ops");
    // 3 AllReduces, 3 groups of a Send and a Recv, one group over two streams.
    assert_eq!(ops.len(), 3 + 6 + 2, "{ops:?}");
    let p = process(&run);
    assert!(
        p.req_str("gpu_timing").starts_with("on (GPU stamps, every op"),
        "{:?}",
        p.str("gpu_timing")
    );
    assert_eq!(p.u64("ops_timed"), Some(6), "3 ungrouped ops and 3 groups");
    assert_eq!(p.u64("timing_pool_empty"), Some(0));
    assert_eq!(p.u64("ops_timing_lost"), Some(0));
    assert_eq!(p.u64("timing_errors"), Some(0));
    // Two stamps per timed launching call; the rest are the writer's clock anchors on
    // a stream of its own (at most three tries of the anchor kernel and three stamps a
    // round).
    let anchors = common::anchor_launches(&stats, 6);
    assert!(anchors > 0 && anchors <= 6 * 8, "{stats:?}");
    assert_eq!(stats["anchors_failed"], 0, "{stats:?}");
    assert_eq!(stats["stamps_on_capturing"], 0, "{stats:?}");
    assert_eq!(stats["stamps_failed"], 0, "{stats:?}");
    // Every stamp ran (none was lost): the fake GPU wrote each one's slot.
    assert_eq!(stats["stamps_written"], stats["stamps"], "{stats:?}");
    // zcta's kernels (stamp and anchor, a module each) and their slots are made once
    // for the one context.
    assert_eq!((stats["modules"], stats["host_allocs"]), (2, 1), "{stats:?}");
    // And no CUDA event is made, recorded or asked about any more.
    for k in [
        "events_created",
        "records",
        "records_failed",
        "queries",
        "syncs",
        "elapsed_calls",
    ] {
        assert_eq!(stats[k], 0, "{k}: {stats:?}");
    }
    let kernel_ns = 20_000;
    let mut groups: HashMap<u64, Vec<&Row>> = HashMap::new();
    for o in &ops {
        match o.u64("group_id") {
            Some(g) => groups.entry(g).or_default().push(o),
            None => {
                assert_eq!(o.str("timing"), Some("timed"), "{o:?}");
                assert_eq!(o.u64("timing_level"), Some(0));
            }
        }
    }
    for o in ops.iter().filter(|o| o.str("timing") == Some("timed")) {
        assert_eq!(o.str("gpu_source"), Some("stamps"));
        assert!(o.is_null("gpu_start_ns"), "stamps see no kernel start");
        let (ready, end) = (o.req_i64("gpu_ready_ns"), o.req_i64("gpu_end_ns"));
        let dur = end - ready;
        // The stand-in's kernel takes 20 µs on an idle stream; the host may be slow.
        assert!(
            (kernel_ns..kernel_ns + 5_000_000).contains(&dur),
            "{dur} ns: {o:?}"
        );
        // Put on CLOCK_REALTIME: the ready stamp was launched at the call's entry on an
        // idle stream, so it ran about then (anchor error plus a slow host).
        let api = o.req_i64("api_start_ns");
        assert!(
            (ready - api).abs() < 50_000_000,
            "ready {ready} vs api_start {api}"
        );
        assert!(o.is_null("n_kernels"), "not counted without CUPTI");
        if o.u64("group_id").is_some() {
            // NCCL's KernelLaunch event gave the launch, its P2p plan the engine.
            // (Launched by the group's ncclGroupEnd, after this op's own call.)
            assert!(o.req_i64("launch_ns") >= api, "{o:?}");
            assert_eq!(o.str("engine"), Some("sm_kernel"));
        } else {
            // A one-rank collective: NCCL runs it without profiler events, so neither
            // its launch nor its engine is known.
            assert!(o.is_null("launch_ns") && o.is_null("engine"), "{o:?}");
        }
    }
    // The summary shows what the stamps measured, per op.
    let sum = std::process::Command::new(env!("CARGO_BIN_EXE_zcta"))
        .arg("summary")
        .arg(run.dir())
        .output()
        .unwrap();
    let sum = text(&sum.stdout);
    assert!(
        sum.lines()
            .any(|l| l.trim_start().starts_with("pid ") && l.contains(": on (GPU stamps, every op")),
        "{sum}"
    );
    let line = sum
        .lines()
        .find(|l| l.trim_start().starts_with("AllReduce ") && l.contains("GPU median"))
        .unwrap_or_else(|| panic!("{sum}"));
    assert!(
        line.contains("measured       3 of 3 ") && line.contains(" us "),
        "{line}"
    );
    assert_eq!(groups.len(), 4);
    for (g, members) in &groups {
        let t: Vec<_> = members.iter().map(|o| o.req_str("timing")).collect();
        if members.iter().any(|o| o.req_u64("stream") == 0x7000) {
            // The group over two streams is not timed (which stream would say?).
            assert!(t.iter().all(|t| *t == "streams"), "group {g}: {t:?}");
            continue;
        }
        assert!(t.iter().all(|t| *t == "timed"), "group {g}: {t:?}");
        let spans: Vec<_> = members
            .iter()
            .map(|o| (o.i64("gpu_ready_ns"), o.i64("gpu_end_ns")))
            .collect();
        assert!(
            spans.windows(2).all(|w| w[0] == w[1]),
            "ops of a group share its span"
        );
    }
}

#[test]
fn the_work_ahead_on_the_stream_is_queue_not_transfer() {
    // Three iterations of the scenario's ops, 5 ms of GPU work each, back to back on
    // one stream: the host returns at once, so each op waits on the GPU for the ones
    // before it.
    let run = Run::new("timing-queue");
    let args = ops_args(&run, 3);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_with_driver(
        &run,
        &args,
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "5000000")],
    );
    // One row per launching call: the ungrouped ops, and one op of each group.
    let mut groups = std::collections::HashSet::new();
    let mut ops: Vec<Row> = run
        .rows("ops")
        .into_iter()
        .filter(|o| o.u64("group_id").is_none_or(|g| groups.insert(g)))
        .collect();
    ops.sort_by_key(|o| o.req_i64("api_start_ns"));
    assert!(ops.len() >= 30, "{ops:?}");
    assert!(ops.iter().all(|o| o.str("timing") == Some("timed")), "{ops:?}");
    // Each op takes its 5 ms (more where the host was descheduled between its two
    // stamps on a loaded machine: the stand-in GPU then idles until the launch).
    let mut tight = 0;
    for o in &ops {
        let d = o.req_i64("gpu_end_ns") - o.req_i64("gpu_ready_ns");
        assert!((5_000_000..60_000_000).contains(&d), "{d}");
        tight += usize::from(d < 6_000_000);
    }
    assert!(
        tight * 10 >= ops.len() * 9,
        "{tight} of {} ops near 5 ms",
        ops.len()
    );
    // Each op's stream became free when the one before it ended: never before it, and
    // right then while the host ran ahead of the GPU.
    let mut at_end = 0;
    for w in ops.windows(2) {
        let gap = w[1].req_i64("gpu_ready_ns") - w[0].req_i64("gpu_end_ns");
        assert!(gap > -1_000_000, "ready {gap} ns after the previous end");
        at_end += usize::from(gap < 1_000_000);
    }
    assert!(
        at_end * 10 >= (ops.len() - 1) * 9,
        "{at_end} of {} readies at the previous end",
        ops.len() - 1
    );
    // And the report attributes every op's window to measured phases: init, queue,
    // barrier (one rank: 0), transfer. (A one-rank collective has no NCCL events: its
    // launch is taken as the call's return.)
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(["phases"])
        .arg(run.dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let phases = run.rows("phases");
    let timed: Vec<&Row> = phases.iter().filter(|p| !p.is_null("window_ns")).collect();
    assert!(!timed.is_empty());
    for p in timed {
        assert_eq!(p.i64("unresolved_ns"), Some(0), "{p:?}");
        assert!(
            p.i64("queue_ns").is_some() && p.i64("barrier_ns") == Some(0),
            "{p:?}"
        );
        assert!(
            p.is_null("sync_ns") && p.is_null("memcpy_ns"),
            "deep mode only: {p:?}"
        );
    }
}

#[test]
fn nothing_is_launched_into_a_capturing_stream() {
    let run = Run::new("timing-capture");
    // A stamp launched into the capture would be a node of the program's graph
    // (counted), and a call the driver deems unsafe during a global-mode capture
    // invalidates it (the scenario then fails).
    let (out, stats) = run_with_driver(&run, &["capture", "3"], &[("ZCTA_BUDGET", "all")]);
    assert!(text(&out.stdout).contains("ok"));
    assert_eq!(stats["stamps_on_capturing"], 0, "{stats:?}");
    assert_eq!(stats.get("captures_invalidated"), Some(&0), "{stats:?}");
    assert_eq!(stats["unsafe_during_capture"], 0, "{stats:?}");
    // The 6 ops outside the capture were stamped (two each); the rest are anchors.
    assert!(common::anchor_launches(&stats, 6) > 0, "{stats:?}");
    let ops = run.rows("ops");
    let captured: Vec<&Row> = ops.iter().filter(|o| o.u64("stream") == Some(0x6000)).collect();
    assert_eq!(captured.len(), 3 + 2);
    for o in &captured {
        assert_eq!(o.str("timing"), Some("graph_capture"), "{o:?}");
        for col in ["gpu_ready_ns", "gpu_end_ns", "engine"] {
            assert!(o.is_null(col), "{col}: not measured, {o:?}");
        }
    }
    let outside: Vec<&Row> = ops.iter().filter(|o| o.u64("stream") == Some(0x5000)).collect();
    assert_eq!(outside.len(), 6);
    assert!(outside.iter().all(|o| o.str("timing") == Some("timed")));
    let p = process(&run);
    assert_eq!(p.u64("timing_captured"), Some(4), "3 AllReduces and a group");
    assert_eq!(p.u64("ops_graph_captured"), Some(5));
}

/// The launching calls of a run (an ungrouped op, or a group: its ops share one
/// timing), each as its first row, in call order.
fn launching_calls(ops: &[Row]) -> Vec<&Row> {
    let mut seen = std::collections::HashSet::new();
    let mut calls: Vec<&Row> = ops
        .iter()
        .filter(|o| seen.insert(o.u64("group_id").map_or((o.req_u64("op_id"), 0), |g| (0, g))))
        .collect();
    calls.sort_by_key(|o| o.req_i64("api_start_ns"));
    calls
}

/// Slot pairs a context's pool hands out at most (`POOL_MAX` in shim/src/timing.rs).
const POOL_MAX: u64 = 4096;

#[test]
fn an_empty_pool_is_counted_and_never_waited_for() {
    // Each op's work takes 100 s on the stand-in GPU, so no op's end stamp runs before
    // the program ends and no slot pair ever comes back: once the pool's pairs are all
    // in flight, every later call finds it empty. 6,000 AllReduces 50 us apart (the
    // writer refills meanwhile), then 6,000 groups back to back, then the group over
    // two streams (not timed: `streams`).
    let run = Run::new("timing-pool");
    let t0 = std::time::Instant::now();
    let (_, stats) = run_with_driver(
        &run,
        &["streams", "6000", "50"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "100000000000")],
    );
    // Never waited for: the program ran through 1.2 million seconds of GPU work.
    let took = t0.elapsed();
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    let p = process(&run);
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 6000 + 2 * 6000 + 2);
    let calls = launching_calls(&ops);
    let n = |t: &str| calls.iter().filter(|o| o.str("timing") == Some(t)).count() as u64;
    let (timed, empty) = (n("timed"), n("pool_empty"));
    assert_eq!((timed + empty, n("streams")), (12_000, 1), "{p:?}");
    // Counted per launching call: an ungrouped op, or a group (whose ops share it).
    assert_eq!(p.u64("timing_pool_empty"), Some(empty), "{p:?}");
    assert_eq!(p.u64("ops_timed"), Some(timed), "{p:?}");
    assert_eq!(p.u64("timing_errors"), Some(0), "{p:?}");
    // Every pair was handed out, once: none is reused while its op is in flight.
    assert_eq!(timed, POOL_MAX, "{p:?}");
    for o in calls.iter().filter(|o| o.str("timing") == Some("pool_empty")) {
        assert!(o.is_null("gpu_ready_ns") && o.is_null("gpu_end_ns"), "{o:?}");
        assert!(o.is_null("timing_level"), "no level: {o:?}");
    }
    // Every timed call was still in flight at the end: lost, once each.
    assert_eq!(p.u64("ops_timing_lost"), Some(timed), "{p:?}");
    // Two stamps per timed call, the rest anchors; of the calls' stamps only the first
    // one's ready stamp ran (on an idle stream), the others wait behind the work (a
    // stamp taken as an anchor runs on the writer's own idle stream).
    assert!(common::anchor_launches(&stats, timed) > 0, "{stats:?}");
    assert_eq!(
        stats["stamps_written"],
        1 + stats["stamps"] - 2 * timed,
        "{stats:?}"
    );
    assert_eq!(stats["stamps_failed"], 0, "{stats:?}");
}

#[test]
fn slot_pairs_are_reused_once_their_ops_are_resolved() {
    // More launching calls than the pool has pairs, each done 20 us after it is
    // launched: a pair goes back to the pool once the writer has read its stamps, so
    // more calls than there are pairs are timed, and a reused slot always gives its
    // new op's time, never the one it held before. The groups come 20 us apart too:
    // back to back they outran the writer's refills of the pool on a loaded machine
    // (2 runs in 24 with four copies on two cores timed fewer than the pool's pairs,
    // the rest `pool_empty`, as the hot path never waits for a pair).
    let run = Run::new("timing-reuse");
    let (_, stats) = run_with_driver(&run, &["streams", "3000", "20", "20"], &[("ZCTA_BUDGET", "all")]);
    let p = process(&run);
    let ops = run.rows("ops");
    let calls = launching_calls(&ops);
    assert_eq!(calls.len(), 3000 + 3000 + 1);
    let timed: Vec<&Row> = calls
        .iter()
        .copied()
        .filter(|o| o.str("timing") == Some("timed"))
        .collect();
    assert!(timed.len() as u64 > POOL_MAX, "{} timed: {p:?}", timed.len());
    assert_eq!(p.u64("ops_timing_lost"), Some(0), "{p:?}");
    assert_eq!(p.u64("timing_errors"), Some(0), "{p:?}");
    // One stream: each op's span is its 20 us kernel at least, and starts after the
    // previous op's ended (one clock anchor for both, or two, each within its error).
    let slack = p.req_i64("gpu_clock_error_ns") * 2 + 100_000;
    for o in &timed {
        let (r, e) = (o.req_i64("gpu_ready_ns"), o.req_i64("gpu_end_ns"));
        assert!(e - r >= 20_000, "{} ns: {o:?}", e - r);
    }
    for w in timed.windows(2) {
        let (e0, r1) = (w[0].req_i64("gpu_end_ns"), w[1].req_i64("gpu_ready_ns"));
        assert!(
            r1 >= e0 - slack,
            "ready {r1} before the previous end {e0}: {:?}",
            w[1]
        );
    }
    assert_eq!(stats["stamps_written"], stats["stamps"], "{stats:?}");
}

#[test]
fn without_a_driver_ops_are_host_only_and_say_why() {
    let run = Run::new("timing-nodriver");
    let args = ops_args(&run, 2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run.host(&args).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let p = process(&run);
    assert!(
        p.req_str("gpu_timing").starts_with("off: no CUDA driver"),
        "{:?}",
        p.str("gpu_timing")
    );
    assert!(p.is_null("ops_timed"));
    for o in run.rows("ops") {
        assert_eq!(o.str("timing"), Some("off"));
        assert!(o.is_null("gpu_end_ns") && o.is_null("gpu_source"));
    }
    // ZCTA_GPU=off says so even with a driver.
    let run = Run::new("timing-off");
    let args = ops_args(&run, 2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, stats) = run_with_driver(&run, &args, &[("ZCTA_GPU", "off")]);
    assert_eq!(process(&run).str("gpu_timing"), Some("off: ZCTA_GPU=off"));
    assert_eq!(stats["stamps"] + stats["stamps_failed"], 0, "{stats:?}");
    assert_eq!(stats["modules"] + stats["host_allocs"], 0, "{stats:?}");
}

#[test]
fn the_budget_times_the_same_nested_subset_on_every_rank() {
    // A budget far below what timing costs: the level rises until few ops are timed.
    let run = Run::new("timing-budget");
    let args = ops_args(&run, 800);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_with_driver(
        &run,
        &args,
        &[("ZCTA_BUDGET", "0.001%"), ("HOST_ITER_GAP_MS", "1")],
    );
    let ops = run.rows("ops");
    let coll: Vec<&Row> = ops
        .iter()
        .filter(|o| o.str("op") == Some("AllReduce") && o.u64("group_id").is_none())
        .collect();
    let skipped = coll.iter().filter(|o| o.str("timing") == Some("budget")).count();
    let timed = coll.iter().filter(|o| o.str("timing") == Some("timed")).count();
    assert!(
        skipped > coll.len() / 2,
        "the level went up: {skipped} of {}",
        coll.len()
    );
    assert!(timed > 0);
    // Which ops a level selects is a function of (comm_id, seq) alone, so every rank
    // at that level selects the same ones, and a sparser level's ops are a subset; a
    // timed op was selected at its level (one selected while the rate limiter had no
    // room is not timed). An op that found the slot pool empty: no level.
    let mut selected_untimed = 0;
    for o in coll
        .iter()
        .filter(|o| matches!(o.str("timing"), Some("timed" | "budget")))
    {
        let level = o.u64("timing_level").expect("asked") as u8;
        let key = zcta::budget::coll_key(o.req_u64("comm_id"), o.req_u64("seq"));
        let want = zcta::budget::selected(key, level);
        if o.str("timing") == Some("timed") {
            assert!(want, "timed but not selected: {o:?}");
        } else if want {
            selected_untimed += 1;
        }
    }
    // The writer raises the level within its first evaluations, so the limiter skips
    // selected ops only until then.
    assert!(
        selected_untimed < coll.len() / 2,
        "{selected_untimed} of {}",
        coll.len()
    );
}
