//! What the shim records for each kind of NCCL call, checked row by row against what
//! the C fixture scenarios (tests/fixtures/glue.c) pass to NCCL.
//!
//! Needs the shim: `cargo build -p zcta-shim` before `cargo test`.

mod common;
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Stdio;

use support::{Row, Run, comm_id_of, read_id, with_str};

const NCCL_VERSION: i32 = 22809;

/// The data-moving calls of one iteration of `host ops`, in issue order.
const OPS_PATTERN: [&str; 11] = [
    "AllReduce",
    "Broadcast",
    "Bcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AlltoAll",
    "Gather",
    "Scatter",
    "Send",
    "Recv",
];

/// What glue.c's `sc_ops` passes for each op (count, dtype, root, redop) and the
/// nccl-tests message size for nranks ranks.
fn expected(op: &str, nranks: u64) -> (u64, i32, Option<i32>, Option<i32>, u64) {
    match op {
        "AllReduce" => (1024, 7, None, Some(0), 1024 * 4),
        "Broadcast" => (1000, 0, Some(0), None, 1000),
        "Bcast" => (10, 8, Some(0), None, 10 * 8),
        "Reduce" => (256, 6, Some(0), Some(0), 256 * 2),
        "AllGather" => (100, 7, None, None, 100 * nranks * 4),
        "ReduceScatter" => (64, 7, None, Some(0), 64 * nranks * 4),
        "AlltoAll" => (32, 7, None, None, 32 * nranks * 4),
        "Gather" => (16, 2, Some(0), None, 16 * nranks * 4),
        "Scatter" => (16, 2, Some(0), None, 16 * nranks * 4),
        "Send" | "Recv" => (8, 1, None, None, 8),
        _ => unreachable!("{op}"),
    }
}

fn pid_of(child: &std::process::Child) -> i32 {
    i32::try_from(child.id()).unwrap()
}

#[test]
fn ops_two_ranks_rows_bytes_and_joins() {
    const ITERS: usize = 20;
    const NRANKS: usize = 2;
    let run = Run::new("ops2");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let cid = comm_id_of(&read_id(&idf));
    let iters = ITERS.to_string();
    let idp = idf.to_str().unwrap();

    let children: Vec<_> = (0..NRANKS)
        .map(|r| {
            let rank = r.to_string();
            run.host(&["ops", &rank, "2", idp, &iters])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn host ops")
        })
        .collect();
    let pids: Vec<i32> = children.iter().map(pid_of).collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        support::assert_ok(&out, &["ops"]);
        assert_eq!(support::text(&out.stdout), "ok\n");
    }

    // Files: one segment per table per process, nothing left over.
    let host = support::host_name();
    let mut want_files = Vec::new();
    let pre = |p| support::prefix_of(&run.dir(), None, p);
    // nccl_comms / nccl_ops: the stand-in NCCL loads the shim as its profiler plugin.
    for t in ["calls", "comms", "nccl_comms", "nccl_ops", "ops"] {
        for p in &pids {
            want_files.push(format!("{t}/{}-00000.parquet", pre(p)));
        }
    }
    for p in &pids {
        want_files.push(format!("process/{}.parquet", pre(p)));
    }
    want_files.sort();
    assert_eq!(support::list_files(&run.dir()), want_files);

    let ops = run.rows("ops");
    assert_eq!(ops.len(), NRANKS * ITERS * OPS_PATTERN.len());

    let comms = run.rows("comms");
    assert_eq!(comms.len(), NRANKS);
    let calls = run.rows("calls");

    // (comm_id, seq) -> op, per rank, for the cross-rank join.
    let mut coll_by_rank: Vec<BTreeMap<(u64, u64), String>> = vec![BTreeMap::new(); NRANKS];
    // (rank, peer, seq) of Sends and Recvs.
    let mut sends = BTreeSet::new();
    let mut recvs = BTreeSet::new();
    let mut comm_ptrs = Vec::new();

    for (r, &pid) in pids.iter().enumerate() {
        let mine: Vec<&Row> = ops.iter().filter(|o| o.req_i32("pid") == pid).collect();
        assert_eq!(mine.len(), ITERS * OPS_PATTERN.len(), "rank {r}");
        let peer = ((r + 1) % NRANKS) as i32;
        let comm_ptr = mine[0].req_u64("comm_ptr");
        assert_ne!(comm_ptr, 0);
        comm_ptrs.push(comm_ptr);

        // Per op kind: exactly ITERS rows (no extra Broadcast from Bcast, no Send/Recv
        // from AlltoAll) with the arguments glue.c passes.
        for op in OPS_PATTERN {
            let n = mine.iter().filter(|o| o.req_str("op") == op).count();
            assert_eq!(n, ITERS, "rank {r}: {op} rows");
        }
        let sb: BTreeSet<u64> = mine
            .iter()
            .filter(|o| !matches!(o.req_str("op"), "Bcast" | "Recv"))
            .map(|o| o.req_u64("sendbuff"))
            .collect();
        let rb: BTreeSet<u64> = mine
            .iter()
            .filter(|o| o.req_str("op") != "Send")
            .map(|o| o.req_u64("recvbuff"))
            .collect();
        assert_eq!(sb.len(), 1, "rank {r}: one send buffer");
        assert_eq!(rb.len(), 1, "rank {r}: one receive buffer");
        let (sb, rb) = (*sb.first().unwrap(), *rb.first().unwrap());
        assert!(sb != 0 && rb != 0 && sb != rb);

        for o in &mine {
            let op = o.req_str("op");
            let (count, dtype, root, redop, bytes) = expected(op, NRANKS as u64);
            let ctx = format!("rank {r} {o:?}");
            assert_eq!(o.u64("count"), Some(count), "{ctx}");
            assert_eq!(o.i32("dtype"), Some(dtype), "{ctx}");
            assert_eq!(o.u64("bytes"), Some(bytes), "{ctx}");
            assert_eq!(o.i32("root"), root, "{ctx}");
            assert_eq!(o.i32("redop"), redop, "{ctx}");
            let want_peer = match op {
                "Send" | "Recv" => Some(peer),
                _ => None,
            };
            assert_eq!(o.i32("peer"), want_peer, "{ctx}");
            assert_eq!(o.u64("stream"), Some(0x5000 + r as u64), "{ctx}");
            assert_eq!(o.i32("rank"), Some(r as i32), "{ctx}");
            assert_eq!(o.i32("nranks"), Some(NRANKS as i32), "{ctx}");
            assert_eq!(o.i32("device"), Some(r as i32), "{ctx}");
            assert_eq!(o.u64("comm_id"), Some(cid), "{ctx}");
            assert_eq!(o.u64("comm_ptr"), Some(comm_ptr), "{ctx}");
            assert_eq!(o.i32("result"), Some(0), "{ctx}");
            assert_eq!(o.i32("tid"), Some(pid), "{ctx}: single-threaded host");
            assert_eq!(o.str("host"), Some(host.as_str()), "{ctx}");
            assert!(o.req_i64("api_end_ns") >= o.req_i64("api_start_ns"), "{ctx}");
            let (want_sb, want_rb) = match op {
                "Bcast" => (rb, rb),
                "Send" => (sb, 0),
                "Recv" => (0, rb),
                _ => (sb, rb),
            };
            assert_eq!(
                (o.req_u64("sendbuff"), o.req_u64("recvbuff")),
                (want_sb, want_rb),
                "{ctx}"
            );
            let p2p = matches!(op, "Send" | "Recv");
            assert_eq!(o.is_null("group_id"), !p2p, "{ctx}: group_id only on Send/Recv");
        }

        // call_seq: 0.. in issue order, and issue order is the scenario's order.
        let mut by_call: Vec<&Row> = mine.clone();
        by_call.sort_by_key(|o| o.req_u64("call_seq"));
        for (i, o) in by_call.iter().enumerate() {
            assert_eq!(o.req_u64("call_seq"), i as u64, "rank {r}");
            assert_eq!(
                o.req_str("op"),
                OPS_PATTERN[i % OPS_PATTERN.len()],
                "rank {r} call_seq {i}"
            );
            if i > 0 {
                assert!(
                    o.req_i64("api_start_ns") >= by_call[i - 1].req_i64("api_end_ns"),
                    "rank {r}: call_seq {i} starts before the previous call returned"
                );
            }
        }

        // Collectives: seq 0..9*ITERS-1 in issue order.
        let colls: Vec<&&Row> = by_call
            .iter()
            .filter(|o| !matches!(o.req_str("op"), "Send" | "Recv"))
            .collect();
        assert_eq!(colls.len(), 9 * ITERS);
        for (i, o) in colls.iter().enumerate() {
            assert_eq!(o.u64("seq"), Some(i as u64), "rank {r}: collective seq");
            coll_by_rank[r].insert((cid, i as u64), o.req_str("op").to_string());
        }
        // Send/Recv: per-peer index 0..ITERS-1.
        for kind in ["Send", "Recv"] {
            let seqs: Vec<u64> = by_call
                .iter()
                .filter(|o| o.req_str("op") == kind)
                .map(|o| o.u64("seq").expect("p2p seq"))
                .collect();
            assert_eq!(seqs, (0..ITERS as u64).collect::<Vec<_>>(), "rank {r} {kind}");
            for o in by_call.iter().filter(|o| o.req_str("op") == kind) {
                let key = (
                    r as i32,
                    o.req_i32("peer"),
                    o.req_u64("seq"),
                    o.req_u64("comm_id"),
                );
                if kind == "Send" {
                    sends.insert(key);
                } else {
                    recvs.insert(key);
                }
            }
        }

        // Groups: the Send and Recv of one iteration share a group id, distinct per
        // iteration, matching exactly the GroupStart/GroupEnd calls rows.
        let mut group_ids = Vec::new();
        for it in 0..ITERS {
            let s = by_call[it * 11 + 9];
            let v = by_call[it * 11 + 10];
            assert_eq!((s.req_str("op"), v.req_str("op")), ("Send", "Recv"));
            assert_eq!(s.u64("group_id"), v.u64("group_id"), "rank {r} iteration {it}");
            group_ids.push(s.req_u64("group_id"));
        }
        let distinct: BTreeSet<u64> = group_ids.iter().copied().collect();
        assert_eq!(distinct.len(), ITERS, "rank {r}: one group id per iteration");

        // calls: CommInitRank, ITERS x (GroupStart, GroupEnd), CommDestroy; the
        // group AlltoAll makes inside NCCL adds nothing.
        let my_calls: Vec<&Row> = calls.iter().filter(|c| c.req_i32("pid") == pid).collect();
        assert_eq!(my_calls.len(), 2 + 2 * ITERS, "rank {r} calls: {my_calls:#?}");
        let names: BTreeMap<&str, usize> = my_calls.iter().fold(BTreeMap::new(), |mut m, c| {
            *m.entry(c.req_str("call")).or_default() += 1;
            m
        });
        let want: BTreeMap<&str, usize> = [
            ("CommDestroy", 1),
            ("CommInitRank", 1),
            ("GroupEnd", ITERS),
            ("GroupStart", ITERS),
        ]
        .into_iter()
        .collect();
        assert_eq!(names, want, "rank {r}");
        for c in &my_calls {
            assert_eq!(c.i32("result"), Some(0), "{c:?}");
            assert!(c.req_i64("api_end_ns") >= c.req_i64("api_start_ns"));
            match c.req_str("call") {
                "CommInitRank" | "CommDestroy" => {
                    assert_eq!(c.u64("comm_id"), Some(cid), "{c:?}");
                    assert_eq!(c.u64("comm_ptr"), Some(comm_ptr), "{c:?}");
                    assert!(c.is_null("group_id"), "{c:?}");
                }
                "GroupStart" => assert!(c.is_null("n_ops"), "{c:?}"),
                "GroupEnd" => assert_eq!(c.int("n_ops"), Some(2), "{c:?}"),
                _ => unreachable!(),
            }
        }
        for call in ["GroupStart", "GroupEnd"] {
            let ids: BTreeSet<u64> = my_calls
                .iter()
                .filter(|c| c.req_str("call") == call)
                .map(|c| c.req_u64("group_id"))
                .collect();
            assert_eq!(ids, distinct, "rank {r}: {call} group ids = ops group ids");
        }
        let init = my_calls
            .iter()
            .find(|c| c.req_str("call") == "CommInitRank")
            .unwrap();
        let first_op = by_call[0].req_i64("api_start_ns");
        assert!(
            init.req_i64("api_end_ns") <= first_op,
            "init returns before the first op"
        );

        // comms row of this rank.
        let c: Vec<&Row> = comms.iter().filter(|c| c.req_i32("pid") == pid).collect();
        assert_eq!(c.len(), 1);
        let c = c[0];
        assert_eq!(c.u64("comm_id"), Some(cid));
        assert_eq!(c.u64("comm_ptr"), Some(comm_ptr));
        assert_eq!(c.i32("rank"), Some(r as i32));
        assert_eq!(c.i32("nranks"), Some(2));
        assert_eq!(c.i32("device"), Some(r as i32));
        assert_eq!(c.str("init"), Some("CommInitRank"));
        assert_eq!(c.i32("result"), Some(0));
        assert_eq!(c.i32("nccl_version"), Some(NCCL_VERSION));
        for col in [
            "parent_comm_id",
            "color",
            "key",
            "comm_name",
            "blocking",
            "cta_policy",
        ] {
            assert!(c.is_null(col), "comms.{col} should be NULL: {c:?}");
        }
        assert!(c.req_i64("init_end_ns") >= c.req_i64("init_start_ns"));
    }

    // Cross-rank joins.
    assert_eq!(
        coll_by_rank[0], coll_by_rank[1],
        "same op at the same (comm_id, seq)"
    );
    let flipped: BTreeSet<_> = recvs.iter().map(|&(r, p, s, c)| (p, r, s, c)).collect();
    assert_eq!(sends, flipped, "every Send joins exactly one Recv");
    assert_eq!(sends.len(), NRANKS * ITERS);

    // process rows.
    let procs = run.rows("process");
    assert_eq!(procs.len(), NRANKS);
    // The loader reports real paths (the host finds libglue, and libglue libnccl,
    // through /proc/self/exe).
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).unwrap().to_string_lossy().into_owned();
    let libnccl = canon(&common::fixtures().libnccl);
    let exe = canon(&common::fixtures().host);
    for (r, &pid) in pids.iter().enumerate() {
        let p: Vec<&Row> = procs.iter().filter(|p| p.req_i32("pid") == pid).collect();
        assert_eq!(p.len(), 1, "one process row for pid {pid}");
        let p = p[0];
        assert_eq!(p.str("end_reason"), Some("exit"), "{p:?}");
        assert_eq!(p.u64("ops_rows"), Some((ITERS * 11) as u64));
        assert_eq!(p.u64("calls_rows"), Some((2 + 2 * ITERS) as u64));
        assert_eq!(p.u64("comms_rows"), Some(1));
        assert_eq!(p.u64("records_dropped"), Some(0));
        assert_eq!(p.i32("nccl_version"), Some(NCCL_VERSION));
        assert_eq!(p.u64("schema_version"), Some(zcta::SCHEMA_VERSION as u64));
        assert_eq!(p.str("clock"), Some("CLOCK_REALTIME"));
        assert_eq!(p.str("run_id"), Some("ops2"));
        assert_eq!(p.str("run_id_source"), Some("ZCTA_RUN_ID"));
        assert_eq!(p.i32("ppid"), Some(std::process::id() as i32));
        assert!(p.is_null("rank_env"));
        assert!(p.is_null("write_errors"), "{p:?}");
        assert_eq!(p.str("nccl_lib"), Some(libnccl.as_str()));
        assert_eq!(p.str("exe"), Some(exe.as_str()));
        let cmdline = format!("{} ops {r} 2 {idp} {ITERS}", common::fixtures().host.display());
        assert_eq!(p.str("cmdline"), Some(cmdline.as_str()));
        assert!(p.req_i64("end_ns") >= p.req_i64("start_ns"));
        let env: serde_json::Value = serde_json::from_str(p.req_str("env_json")).unwrap();
        assert_eq!(env["ZCTA_RUN_ID"], "ops2", "{env}");
        assert!(
            env.get("PATH").is_none(),
            "PATH is not a recorded variable: {env}"
        );
    }
}

#[test]
fn failing_calls_are_recorded_with_their_result() {
    let want_stdout =
        "rc ncclAllReduce 4\nrc ncclAllReduce 4\nrc ncclBroadcast 4\nrc ncclSend 4\nrc ncclGroupEnd 5\n";
    let plain = support::host_plain(&["errors"]).output().unwrap();
    assert_eq!(support::text(&plain.stdout), want_stdout);
    let run = Run::new("errors");
    let shim = run.host(&["errors"]).output().unwrap();
    assert_eq!(support::text(&shim.stdout), want_stdout);
    assert_eq!(shim.status.code(), plain.status.code());
    assert_eq!(shim.status.code(), Some(0));
    assert_eq!(support::text(&shim.stderr), support::text(&plain.stderr));
    assert_eq!(support::text(&shim.stderr), "");

    let comms = run.rows("comms");
    assert_eq!(comms.len(), 1);
    let cid = comms[0].req_u64("comm_id");
    let ptr = comms[0].req_u64("comm_ptr");

    let mut ops = run.rows("ops");
    ops.sort_by_key(|o| o.req_i64("api_start_ns"));
    assert_eq!(ops.len(), 4, "{ops:#?}");
    for o in &ops {
        assert_eq!(o.i32("result"), Some(4), "{o:?}");
        assert!(o.is_null("seq"), "failed call got a seq: {o:?}");
        assert!(o.is_null("group_id"));
    }
    // ncclAllReduce on a NULL communicator: nothing known about the communicator.
    let o = &ops[0];
    assert_eq!(o.str("op"), Some("AllReduce"));
    assert_eq!(o.u64("comm_ptr"), Some(0));
    for col in ["comm_id", "rank", "nranks", "device"] {
        assert!(o.is_null(col), "NULL-comm row has {col}: {o:?}");
    }
    assert_eq!(o.u64("bytes"), Some(4));
    // Invalid datatype: bytes unknown.
    let o = &ops[1];
    assert_eq!(
        (
            o.str("op"),
            o.u64("comm_id"),
            o.i32("rank"),
            o.i32("dtype"),
            o.u64("bytes")
        ),
        (Some("AllReduce"), Some(cid), Some(0), Some(99), None)
    );
    assert_eq!(o.u64("comm_ptr"), Some(ptr));
    let o = &ops[2];
    assert_eq!(
        (o.str("op"), o.u64("comm_id"), o.i32("root"), o.u64("bytes")),
        (Some("Broadcast"), Some(cid), Some(2), Some(4))
    );
    let o = &ops[3];
    assert_eq!(
        (o.str("op"), o.u64("comm_id"), o.i32("peer"), o.u64("bytes")),
        (Some("Send"), Some(cid), Some(5), Some(4))
    );
    let call_seqs: Vec<u64> = ops[1..].iter().map(|o| o.req_u64("call_seq")).collect();
    assert_eq!(call_seqs, vec![0, 1, 2]);

    let mut calls = run.rows("calls");
    calls.sort_by_key(|c| c.req_i64("api_start_ns"));
    let summary: Vec<(&str, i32)> = calls
        .iter()
        .map(|c| (c.req_str("call"), c.req_i32("result")))
        .collect();
    assert_eq!(
        summary,
        vec![("CommInitRank", 0), ("GroupEnd", 5), ("CommDestroy", 0)]
    );
    assert!(
        calls[1].is_null("group_id") && calls[1].is_null("n_ops"),
        "{:?}",
        calls[1]
    );

    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].u64("ops_rows"), Some(4));
    assert_eq!(p[0].u64("calls_rows"), Some(3));
    assert_eq!(p[0].str("end_reason"), Some("exit"));
}

#[test]
fn many_threads_many_comms() {
    const THREADS: usize = 8;
    const ITERS: u64 = 2000;
    let run = Run::new("threads");
    run.run_ok(&["threads", &THREADS.to_string(), &ITERS.to_string()]);

    let ops = run.rows("ops");
    assert_eq!(ops.len(), THREADS * ITERS as usize);
    let mut by_comm: HashMap<u64, Vec<&Row>> = HashMap::new();
    for o in &ops {
        assert_eq!(o.str("op"), Some("AllReduce"));
        assert_eq!(o.i32("result"), Some(0));
        assert_eq!((o.u64("count"), o.u64("bytes")), (Some(16), Some(64)));
        assert_eq!((o.i32("rank"), o.i32("nranks")), (Some(0), Some(1)));
        by_comm.entry(o.req_u64("comm_id")).or_default().push(o);
    }
    assert_eq!(by_comm.len(), THREADS, "one comm_id per thread");
    let mut tids = BTreeSet::new();
    let mut streams = BTreeSet::new();
    for (cid, rows) in &by_comm {
        let mut seqs: Vec<u64> = rows.iter().map(|o| o.u64("seq").unwrap()).collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..ITERS).collect::<Vec<_>>(), "comm {cid}: seq");
        let mut cs: Vec<u64> = rows.iter().map(|o| o.req_u64("call_seq")).collect();
        cs.sort_unstable();
        assert_eq!(cs, (0..ITERS).collect::<Vec<_>>(), "comm {cid}: call_seq");
        let t: BTreeSet<i32> = rows.iter().map(|o| o.req_i32("tid")).collect();
        assert_eq!(t.len(), 1, "comm {cid} used from one thread");
        tids.extend(t);
        let s: BTreeSet<u64> = rows.iter().map(|o| o.req_u64("stream")).collect();
        assert_eq!(s.len(), 1);
        streams.extend(s);
    }
    assert_eq!(tids.len(), THREADS, "distinct tids");
    let want_streams: BTreeSet<u64> = (0..THREADS as u64).map(|i| 0x7000 + i).collect();
    assert_eq!(streams, want_streams);

    let comms = run.rows("comms");
    let ids: BTreeSet<u64> = comms.iter().map(|c| c.req_u64("comm_id")).collect();
    let want: BTreeSet<u64> = by_comm.keys().copied().collect();
    assert_eq!(ids, want);
    assert_eq!(comms.len(), THREADS);

    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].u64("records_dropped"), Some(0));
    assert_eq!(p[0].u64("ops_rows"), Some(THREADS as u64 * ITERS));
    assert_eq!(p[0].str("end_reason"), Some("exit"));
}

/// A communicator created inside a group, then used only inside groups: its ops are
/// numbered at each group's end, and there, the group having returned ncclSuccess,
/// NCCL has initialised it and is asked what its record lacked (the device), so every
/// op of it has its communicator's fields.
#[test]
fn a_communicator_made_inside_a_group_gives_its_grouped_ops_their_device() {
    let run = Run::new("init_in_group");
    run.run_ok(&["init_in_group"]);
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 4, "{ops:#?}");
    let comm_id = ops[0].req_u64("comm_id");
    let mut seqs: Vec<(Option<&str>, u64)> = Vec::new();
    for o in &ops {
        assert_eq!(o.u64("comm_id"), Some(comm_id));
        assert_eq!((o.i32("rank"), o.i32("nranks")), (Some(0), Some(1)));
        assert_eq!(o.i32("device"), Some(0), "known after the group's end: {o:?}");
        assert!(o.u64("group_id").is_some());
        seqs.push((o.str("op"), o.req_u64("seq")));
    }
    seqs.sort();
    assert_eq!(
        seqs,
        [
            (Some("Recv"), 0),
            (Some("Recv"), 1),
            (Some("Send"), 0),
            (Some("Send"), 1)
        ]
    );
}

/// A communicator destroyed inside a group that uses it: at the group's end NCCL is
/// not asked about it (the scenario counts the identity queries), even where another
/// communicator, made inside a group, had its identity completed there; the group's
/// rows are written, those of the destroyed communicator without its fields.
#[test]
fn a_communicator_destroyed_inside_a_group_is_not_asked_about() {
    let run = Run::new("destroy_in_group");
    // Without the profiler plugin: the stand-in NCCL keeps no profiler tasks, which
    // would point at the destroyed communicator at the group's end (in NCCL too this
    // misuse is undefined).
    let out = run
        .host(&["destroy_in_group"])
        .env("ZCTA_NCCL_PLUGIN", "0")
        .output()
        .unwrap();
    support::assert_ok(&out, &["destroy_in_group"]);
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 2, "{ops:#?}");
    for o in &ops {
        assert!(o.u64("group_id").is_some());
        assert!(o.is_null("comm_id") && o.is_null("device"), "{o:?}");
    }
}

/// The `split` scenario, shared by the tests below.
fn split_run(id: &str) -> Run {
    let run = Run::new(id);
    run.run_ok(&["split"]);
    run
}

#[test]
fn split_shrink_initall_config_scalable() {
    let run = split_run("split");
    let comms = run.rows("comms");
    assert_eq!(comms.len(), 7, "{comms:#?}");
    let by_init = |k: &str| with_str(&comms, "init", k);

    let parent = by_init("CommInitRank");
    assert_eq!(parent.len(), 1);
    let parent = parent[0];
    let pid = parent.req_u64("comm_id");
    assert_eq!((parent.i32("rank"), parent.i32("nranks")), (Some(0), Some(2)));

    // Split colour 0, key 0: derived from the parent, first split.
    let split = by_init("CommSplit");
    assert_eq!(split.len(), 1, "NOCOLOR split creates no comms row");
    let split = split[0];
    let split_id = split.req_u64("comm_id");
    assert_eq!(split_id, zcta::hash::comm_id_derived(pid, "split", 0, 0));
    assert_eq!(split.u64("parent_comm_id"), Some(pid));
    assert_eq!((split.i32("color"), split.i32("key")), (Some(0), Some(0)));
    assert_eq!((split.i32("rank"), split.i32("nranks")), (Some(0), Some(1)));
    assert_eq!(split.i32("device"), Some(0));

    let shrink = by_init("CommShrink");
    assert_eq!(shrink.len(), 1);
    let shrink = shrink[0];
    let shrink_id = shrink.req_u64("comm_id");
    assert_eq!(shrink.u64("parent_comm_id"), Some(pid));
    assert_eq!(shrink_id, zcta::hash::comm_id_derived(pid, "shrink", 0, 0));
    assert_eq!((shrink.i32("rank"), shrink.i32("nranks")), (Some(0), Some(1)));
    assert!(shrink.is_null("color") && shrink.is_null("key"));

    let mut all = by_init("CommInitAll");
    all.sort_by_key(|c| c.req_i32("rank"));
    assert_eq!(all.len(), 2);
    let all_id = all[0].req_u64("comm_id");
    assert_eq!(all[1].u64("comm_id"), Some(all_id));
    assert_eq!(
        all.iter()
            .map(|c| (c.req_i32("rank"), c.req_i32("nranks"), c.req_i32("device")))
            .collect::<Vec<_>>(),
        vec![(0, 2, 0), (1, 2, 1)]
    );
    assert_ne!(all[0].u64("comm_ptr"), all[1].u64("comm_ptr"));

    let cfg = by_init("CommInitRankConfig");
    assert_eq!(cfg.len(), 1);
    let cfg = cfg[0];
    assert_eq!(cfg.str("comm_name"), Some("cfgcomm"));
    assert_eq!(cfg.i32("blocking"), Some(1));
    assert!(cfg.is_null("cta_policy"), "CTAPolicy left undefined: {cfg:?}");
    assert_eq!((cfg.i32("rank"), cfg.i32("nranks")), (Some(0), Some(1)));

    let sc = by_init("CommInitRankScalable");
    assert_eq!(sc.len(), 1);
    let sc = sc[0];
    assert_eq!(
        (sc.i32("rank"), sc.i32("nranks"), sc.i32("device")),
        (Some(0), Some(2), Some(0))
    );
    assert!(sc.is_null("parent_comm_id"));

    let ids: BTreeSet<u64> = comms.iter().map(|c| c.req_u64("comm_id")).collect();
    assert_eq!(ids.len(), 6, "all distinct but the two CommInitAll rows");
    for c in &comms {
        assert_eq!(c.i32("result"), Some(0));
        assert_eq!(c.i32("nccl_version"), Some(NCCL_VERSION));
    }

    // calls: the NOCOLOR split is there, with no communicator.
    let calls = run.rows("calls");
    let splits = with_str(&calls, "call", "CommSplit");
    assert_eq!(splits.len(), 2);
    let mut splits = splits;
    splits.sort_by_key(|c| c.req_i64("api_start_ns"));
    assert_eq!(splits[0].u64("comm_id"), Some(split_id));
    assert_eq!(splits[0].i32("flags"), Some(0));
    assert!(splits[1].is_null("comm_id"), "NOCOLOR split: {:?}", splits[1]);
    assert!(splits[1].is_null("comm_ptr"), "NOCOLOR split: {:?}", splits[1]);
    assert_eq!(splits[1].i32("flags"), Some(-1));
    assert_eq!(splits[1].i32("result"), Some(0));
    let ia = with_str(&calls, "call", "CommInitAll");
    assert_eq!(ia.len(), 1);
    assert_eq!((ia[0].u64("comm_id"), ia[0].u64("size")), (Some(all_id), Some(2)));
    let n = |k: &str| with_str(&calls, "call", k).len();
    assert_eq!(
        [
            n("CommInitRank"),
            n("CommShrink"),
            n("CommInitRankConfig"),
            n("CommInitRankScalable"),
            n("GroupStart"),
            n("GroupEnd"),
            n("CommDestroy"),
        ],
        [1, 1, 1, 1, 1, 1, 7]
    );
    assert_eq!(calls.len(), 16);
    let shrink_call = with_str(&calls, "call", "CommShrink")[0];
    assert_eq!(shrink_call.u64("comm_id"), Some(shrink_id));

    // ops carry the comm_id of the communicator they ran on.
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 6);
    let on = |id: u64| -> Vec<&Row> { ops.iter().filter(|o| o.u64("comm_id") == Some(id)).collect() };
    let mut s = on(split_id);
    s.sort_by_key(|o| o.req_u64("seq"));
    assert_eq!(
        s.iter().map(|o| o.req_u64("seq")).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(
        s.iter()
            .all(|o| o.i32("nranks") == Some(1) && o.is_null("group_id"))
    );
    let sh = on(shrink_id);
    assert_eq!(sh.len(), 1);
    assert_eq!((sh[0].u64("seq"), sh[0].i32("nranks")), (Some(0), Some(1)));
    let mut a = on(all_id);
    a.sort_by_key(|o| o.req_i32("rank"));
    assert_eq!(a.len(), 2);
    assert_eq!(
        a.iter()
            .map(|o| (o.req_i32("rank"), o.req_i32("device"), o.req_u64("seq")))
            .collect::<Vec<_>>(),
        vec![(0, 0, 0), (1, 1, 0)]
    );
    let gid = a[0].req_u64("group_id");
    assert_eq!(a[1].u64("group_id"), Some(gid));
    let ge = with_str(&calls, "call", "GroupEnd");
    assert_eq!((ge[0].u64("group_id"), ge[0].int("n_ops")), (Some(gid), Some(2)));
}

/// `calls.flags` is documented as "CommShrink: shrinkFlags" (format/src/tables/calls.rs);
/// the split scenario passes NCCL_SHRINK_DEFAULT (0).
#[test]
fn shrink_call_records_shrink_flags() {
    let run = split_run("shrinkflags");
    let calls = run.rows("calls");
    let shrink = with_str(&calls, "call", "CommShrink");
    assert_eq!(shrink.len(), 1);
    assert_eq!(
        shrink[0].i32("flags"),
        Some(0),
        "calls.flags of CommShrink should hold shrinkFlags (NCCL_SHRINK_DEFAULT = 0): {:?}",
        shrink[0]
    );
}

#[test]
fn registration_calls() {
    let run = Run::new("register");
    run.run_ok(&["register"]);
    assert!(run.rows("ops").is_empty());
    let comms = run.rows("comms");
    assert_eq!(comms.len(), 1);
    let cid = comms[0].req_u64("comm_id");
    let ptr = comms[0].req_u64("comm_ptr");
    let mut calls = run.rows("calls");
    calls.sort_by_key(|c| c.req_i64("api_start_ns"));
    let names: Vec<&str> = calls.iter().map(|c| c.req_str("call")).collect();
    assert_eq!(
        names,
        [
            "CommInitRank",
            "CommRegister",
            "CommDeregister",
            "CommWindowRegister",
            "CommWindowDeregister",
            "CommDestroy"
        ]
    );
    for c in &calls {
        assert_eq!(c.i32("result"), Some(0), "{c:?}");
        assert_eq!(c.u64("comm_id"), Some(cid), "{c:?}");
        assert_eq!(c.u64("comm_ptr"), Some(ptr), "{c:?}");
    }
    let (reg, dereg, wreg, wdereg) = (&calls[1], &calls[2], &calls[3], &calls[4]);
    let buff = reg.req_u64("buff");
    assert_ne!(buff, 0);
    assert_eq!(reg.u64("size"), Some(4096));
    assert!(reg.is_null("flags"));
    let h = reg.req_u64("handle");
    assert_ne!(h, 0);
    assert_eq!(dereg.u64("handle"), Some(h));
    assert!(dereg.is_null("buff") && dereg.is_null("size"));

    assert_eq!(wreg.u64("buff"), Some(buff), "same buffer registered as a window");
    assert_eq!(wreg.u64("size"), Some(8192));
    assert_eq!(wreg.i32("flags"), Some(1));
    let w = wreg.req_u64("handle");
    // (w may equal h: the registration handle was freed before the window was made.)
    assert_ne!(w, 0);
    assert_eq!(wdereg.u64("handle"), Some(w));
    assert!(wdereg.is_null("buff") && wdereg.is_null("size"));
}

/// NCCL 2.31's per-collective config entry points (`ncclAllReduceConfig` & co.) are
/// interposed like the plain collectives: each forwarded to its own real function
/// with its arguments and config pointer unchanged (the program checks that), and
/// recorded as the plain op.
#[test]
fn per_collective_config_calls_are_ops() {
    let run = Run::new("config-ops");
    run.run_ok(&["config_ops"]);
    let mut ops = run.rows("ops");
    ops.sort_by_key(|o| o.req_u64("op_id"));
    let got: Vec<(&str, Option<u64>, Option<u64>)> = ops
        .iter()
        .map(|o| (o.req_str("op"), o.u64("count"), o.u64("seq")))
        .collect();
    let want: Vec<(&str, Option<u64>, Option<u64>)> = [
        "AllReduce",
        "Broadcast",
        "Reduce",
        "AllGather",
        "ReduceScatter",
        "AlltoAll",
        "Gather",
        "Scatter",
    ]
    .iter()
    .enumerate()
    .map(|(i, op)| (*op, Some(16), Some(i as u64)))
    .collect();
    assert_eq!(got, want);
    assert!(ops.iter().all(|o| o.i32("result") == Some(0)), "{ops:?}");
}

#[test]
fn group_simulate_end() {
    let run = Run::new("simulate");
    run.run_ok(&["simulate"]);
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 1);
    // A simulated group never runs: its ops take no sequence number.
    assert!(ops[0].is_null("seq"), "{:?}", ops[0]);
    let gid = ops[0].req_u64("group_id");
    let mut calls = run.rows("calls");
    calls.sort_by_key(|c| c.req_i64("api_start_ns"));
    let got: Vec<(&str, Option<u64>, Option<i128>)> = calls
        .iter()
        .map(|c| (c.req_str("call"), c.u64("group_id"), c.int("n_ops")))
        .collect();
    assert_eq!(
        got,
        vec![
            ("CommInitRank", None, None),
            ("GroupStart", Some(gid), None),
            ("GroupSimulateEnd", Some(gid), Some(1)),
            ("CommDestroy", None, None),
        ]
    );
}

/// ncclGroupSimulateEnd refused for a simInfo NCCL did not initialise still closes the
/// group (NCCL lowers its depth before it looks at simInfo): the refused call's row
/// closes the group, whose op takes no sequence number, and the next op is outside any
/// group.
#[test]
fn a_refused_group_simulate_end_closes_its_group() {
    let run = Run::new("simulate_bad");
    run.run_ok(&["simulate_bad"]);
    let mut ops = run.rows("ops");
    ops.sort_by_key(|o| o.req_u64("op_id"));
    assert_eq!(ops.len(), 2, "{ops:?}");
    let gid = ops[0].req_u64("group_id");
    assert!(ops[0].is_null("seq"), "{:?}", ops[0]);
    assert!(ops[1].u64("group_id").is_none(), "{:?}", ops[1]);
    assert_eq!(ops[1].u64("seq"), Some(0));
    let mut calls = run.rows("calls");
    calls.sort_by_key(|c| c.req_i64("api_start_ns"));
    let got: Vec<(&str, Option<u64>, Option<i32>)> = calls
        .iter()
        .map(|c| (c.req_str("call"), c.u64("group_id"), c.i32("result")))
        .collect();
    assert_eq!(
        got,
        vec![
            ("CommInitRank", None, Some(0)),
            ("GroupStart", Some(gid), Some(0)),
            ("GroupSimulateEnd", Some(gid), Some(4)),
            ("CommDestroy", None, Some(0)),
        ]
    );
}

/// Two communicators created one after the other from the same ncclUniqueId (what
/// `NCCL_COMM_ID` or a saved id does) are different communicators: distinct comm_ids,
/// agreed on by both ranks, and each with its own sequence numbers from 0.
#[test]
fn communicators_from_a_reused_unique_id_stay_distinct() {
    let run = Run::new("reinit");
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    let id = idf.to_str().unwrap();
    let children: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| {
            run.host(&["reinit", r, "2", id])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let ids = two_communicators_of_two_ranks(&run, &idf, "two processes");
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 4);
    for o in &ops {
        assert!(ids.contains(&o.req_u64("comm_id")));
        assert_eq!(o.req_u64("seq"), 0, "each communicator starts at seq 0: {o:?}");
    }
}

/// A run's comms rows hold two communicators made one after the other from the id in
/// `idf`, each seen by ranks 0 and 1, the first with the id's own hash: their ids.
fn two_communicators_of_two_ranks(run: &Run, idf: &std::path::Path, what: &str) -> BTreeSet<u64> {
    let comms = run.rows("comms");
    assert_eq!(comms.len(), 4, "{what}: {comms:?}");
    let ids: BTreeSet<u64> = comms.iter().map(|c| c.req_u64("comm_id")).collect();
    assert_eq!(
        ids.len(),
        2,
        "{what}: two communicators, each seen by both ranks: {comms:?}"
    );
    assert!(
        ids.contains(&comm_id_of(&read_id(idf))),
        "{what}: the first keeps the id's own hash"
    );
    for cid in &ids {
        let ranks: BTreeSet<i32> = comms
            .iter()
            .filter(|c| c.req_u64("comm_id") == *cid)
            .map(|c| c.req_i32("rank"))
            .collect();
        assert_eq!(ranks, BTreeSet::from([0, 1]), "{what}: {comms:?}");
    }
    ids
}

/// Both ranks of a communicator created by one process (NCCL's "multiple devices per
/// thread"), after calls NCCL refused: one comm_id for both ranks, the id's own hash
/// for the first communicator (a refused call made nothing), and a second one from
/// the same id distinct from it and again shared by both ranks.
#[test]
fn ranks_of_one_communicator_in_one_process_share_its_id() {
    for refused in ["0", "2"] {
        let run = Run::new("two-ranks");
        let idf = run.scratch("id");
        common::write_unique_id(&idf);
        let out = run
            .host(&["two_ranks", idf.to_str().unwrap(), refused])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
        let ids = two_communicators_of_two_ranks(&run, &idf, &format!("refused {refused}"));
        for o in &run.rows("ops") {
            assert!(ids.contains(&o.req_u64("comm_id")), "{o:?}");
            assert_eq!(o.req_u64("seq"), 0, "{o:?}");
        }
    }
}

/// A group of more ops than one reservation of the queue takes (256 records) goes in
/// pieces: every op's row is written, in order, with its sequence number, and the
/// group's end row counts them all.
#[test]
fn a_group_larger_than_a_queue_batch_keeps_every_row() {
    const N: u64 = 600;
    let run = Run::new("wide");
    run.run_ok(&["wide_group", &N.to_string()]);
    let mut ops = run.rows("ops");
    assert_eq!(ops.len() as u64, 2 * N);
    ops.sort_by_key(|o| o.req_u64("op_id"));
    let seqs: Vec<u64> = ops.iter().map(|o| o.req_u64("seq")).collect();
    assert_eq!(seqs, (0..2 * N).collect::<Vec<_>>());
    assert!(ops.iter().all(|o| o.u64("bytes") == Some(256)), "{:?}", ops[0]);
    let groups: BTreeSet<u64> = ops.iter().map(|o| o.req_u64("group_id")).collect();
    assert_eq!(groups.len(), 2);
    let ends: Vec<(Option<u64>, Option<i128>)> = run
        .rows("calls")
        .iter()
        .filter(|c| c.req_str("call") == "GroupEnd")
        .map(|c| (c.u64("group_id"), c.int("n_ops")))
        .collect();
    assert_eq!(ends.len(), 2);
    for (g, n) in ends {
        assert!(g.is_some_and(|g| groups.contains(&g)));
        assert_eq!(n, Some(i128::from(N as u32)));
    }
}
