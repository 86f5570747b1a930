//! The shim's lifecycle: programs behave exactly as without it, processes that never
//! call NCCL stay silent and write nothing, fork children are not recorded, exec'ed
//! programs are, `_exit` closes files, and `ZCTA_ENABLE=0` turns everything off.
//!
//! Needs the shim: `cargo build -p zcta-shim` before `cargo test`.

mod common;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Output};

use support::{Row, Run, clean_cmd, host_plain, preload, text};

/// Functions the shim itself calls on the real library to learn about communicators
/// (version, rank, size, device). Every other counter must be the same with and
/// without the shim.
const SHIM_QUERIES: [&str; 4] = ["GetVersion", "CommCount", "CommUserRank", "CommCuDevice"];

fn assert_same_behaviour(what: &str, plain: &Output, shim: &Output) {
    assert_eq!(text(&shim.stdout), text(&plain.stdout), "{what}: stdout differs");
    assert_eq!(text(&shim.stderr), text(&plain.stderr), "{what}: stderr differs");
    assert_eq!(
        shim.status.code(),
        plain.status.code(),
        "{what}: exit status differs"
    );
}

fn stats_without_queries(p: &Path) -> HashMap<String, u64> {
    let mut m = common::read_glue_stats(p);
    for q in SHIM_QUERIES {
        m.remove(q);
    }
    assert!(m.len() > 20, "stats file {} looks empty: {m:?}", p.display());
    m
}

#[test]
fn behaviour_unchanged_under_the_shim() {
    let scratch = Run::new("scratch");
    let idf = scratch.scratch("uid");
    common::write_unique_id(&idf);
    let idp = idf.to_str().unwrap();
    let scenarios: [&[&str]; 6] = [
        &["ops", "0", "1", idp, "3"],
        &["errors"],
        &["split"],
        &["register"],
        &["simulate"],
        &["threads", "4", "300"],
    ];
    for args in scenarios {
        let what = args[0];
        let plain_stats = scratch.scratch(&format!("{what}-plain.stats"));
        let plain = host_plain(args)
            .env("GLUE_STATS_FILE", &plain_stats)
            .output()
            .unwrap();
        assert!(plain.status.success(), "{what} fails without the shim: {plain:?}");
        assert!(plain.stderr.is_empty(), "{what} without the shim: {plain:?}");

        let run = Run::new(what);
        let shim_stats = scratch.scratch(&format!("{what}-shim.stats"));
        let shim = run
            .host(args)
            .env("GLUE_STATS_FILE", &shim_stats)
            .output()
            .unwrap();
        assert_same_behaviour(what, &plain, &shim);
        assert_eq!(text(&shim.stderr), "", "{what}: the shim printed something");
        assert_eq!(
            stats_without_queries(&shim_stats),
            stats_without_queries(&plain_stats),
            "{what}: NCCL functions were entered a different number of times under the shim"
        );
        // ... and it did record.
        let procs = run.rows("process");
        assert_eq!(procs.len(), 1, "{what}");
        assert_eq!(procs[0].str("end_reason"), Some("exit"), "{what}");
    }
}

/// Run dir name `YYYYMMDDTHHMMSSZ-<host>-<pid>` for a time between `t0` and `t1`.
fn is_time_run_id(name: &str, host: &str, pid: u32, t0: i64, t1: i64) -> bool {
    let Some(rest) = name.strip_suffix(&format!("-{host}-{pid}")) else {
        return false;
    };
    (t0 - 1..=t1 + 1).any(|s| zcta::config::format_utc(s) == rest)
}

#[test]
fn warns_once_without_a_run_id() {
    let run = Run::new("unused");
    let plain = host_plain(&["simulate"]).output().unwrap();
    let t0 = zcta::clock::now_ns() / 1_000_000_000;
    let mut cmd = host_plain(&["simulate"]);
    preload(&mut cmd).env("ZCTA_OUT", run.out_dir());
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let t1 = zcta::clock::now_ns() / 1_000_000_000;
    assert_eq!(text(&out.stdout), text(&plain.stdout));
    assert_eq!(out.status.code(), plain.status.code());
    let err = text(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one warning line: {err:?}");
    assert!(lines[0].starts_with("zcta:"), "{err:?}");
    assert!(lines[0].contains("ZCTA_RUN_ID"), "{err:?}");

    let dirs: Vec<String> = std::fs::read_dir(run.out_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let host = support::host_name();
    assert!(
        is_time_run_id(&dirs[0], &host, pid, t0, t1),
        "run dir {:?} is not <UTC time>-{host}-{pid}",
        dirs[0]
    );
    assert!(dirs[0].contains(&format!("-{host}-")), "{:?}", dirs[0]);
    let p = support::read_rows(&run.out_dir().join(&dirs[0]), "process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("run_id_source"), Some("time"));
    assert_eq!(p[0].str("run_id"), Some(dirs[0].as_str()));
}

/// Runs `cmd` with and without the shim (ZCTA_OUT pointing at a directory that does
/// not exist, with and without ZCTA_RUN_ID) and checks that nothing differs, nothing
/// is printed and nothing is created.
fn check_silent(what: &str, make: &dyn Fn() -> Command) {
    let plain = make().output().unwrap();
    assert!(plain.status.success(), "{what}: {plain:?}");
    for with_id in [false, true] {
        let run = Run::new("silent");
        let out = run.out_dir().join("never-created");
        let mut cmd = make();
        preload(&mut cmd).env("ZCTA_OUT", &out);
        if with_id {
            cmd.env("ZCTA_RUN_ID", "silent");
        }
        let shim = cmd.output().unwrap();
        assert_same_behaviour(what, &plain, &shim);
        assert!(shim.stdout.is_empty(), "{what}: {shim:?}");
        assert!(shim.stderr.is_empty(), "{what}: {shim:?}");
        assert!(!out.exists(), "{what}: {} was created", out.display());
    }
}

#[test]
fn processes_without_nccl_stay_silent() {
    check_silent("host nonccl", &|| host_plain(&["nonccl"]));
    check_silent("true", &|| clean_cmd("true"));
    // A bad developer setting is reported at activation, never by a bystander.
    check_silent("true with a bad ZCTA_NCCL_MASK", &|| {
        let mut c = clean_cmd("true");
        c.env("ZCTA_NCCL_MASK", "coll");
        c
    });

    // python3 may be a wrapper script (pyenv): run the real interpreter directly.
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output();
    match exe {
        Ok(o) if o.status.success() => {
            let exe = text(&o.stdout).trim().to_string();
            check_silent("python3 -c pass", &|| {
                let mut c = clean_cmd(&exe);
                c.args(["-c", "pass"]);
                c
            });
        }
        _ => eprintln!("python3 not available: part of processes_without_nccl_stay_silent skipped"),
    }
}

/// Every preloaded process looks for a profiler plugin chosen in NCCL's configuration
/// files before `main`: a file that is not a regular one is not read, so a pipe given as
/// `NCCL_CONF_FILE` keeps its data for the program and a FIFO does not hold it up.
#[test]
fn a_configuration_file_that_is_no_regular_file_is_left_alone() {
    use std::io::Write;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut cmd = clean_cmd("cat");
    preload(&mut cmd)
        .env("NCCL_CONF_FILE", "/dev/stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"NCCL_PROFILER_PLUGIN=x\nthe program's input\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "NCCL_PROFILER_PLUGIN=x\nthe program's input\n");
    assert!(out.stderr.is_empty(), "{out:?}");

    let run = Run::new("conf-fifo");
    let fifo = run.scratch(".nccl.conf");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for (var, value) in [
        ("NCCL_CONF_FILE", fifo.clone()),
        ("HOME", fifo.parent().unwrap().to_path_buf()),
    ] {
        let mut cmd = clean_cmd("true");
        preload(&mut cmd)
            .env(var, &value)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            status.is_some_and(|s| s.success()),
            "{var}={}: {status:?} (a FIFO must not hold the process up)",
            value.display()
        );
    }

    // A writer waiting on the FIFO is neither released nor broken: what it writes
    // reaches the reader it waits for.
    let writer = Command::new("sh")
        .arg("-c")
        .arg(format!("echo NCCL_DEBUG=INFO > '{}'", fifo.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut cmd = clean_cmd("true");
    preload(&mut cmd).env("NCCL_CONF_FILE", &fifo);
    assert!(cmd.status().unwrap().success());
    let mut read = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::open(&fifo).unwrap(), &mut read).unwrap();
    let w = writer.wait_with_output().unwrap();
    assert!(w.status.success(), "the writer: {w:?}");
    assert_eq!(read, "NCCL_DEBUG=INFO\n");
}

#[test]
fn fork_child_is_not_recorded() {
    let run = Run::new("fork");
    let child = run
        .host(&["fork"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let out = child.wait_with_output().unwrap();
    support::assert_ok(&out, &["fork"]);

    let ops = run.rows("ops");
    assert_eq!(ops.len(), 2, "{ops:#?}");
    for o in &ops {
        assert_eq!(o.i32("pid"), Some(pid));
        assert_eq!(o.str("op"), Some("AllReduce"));
    }
    let mut seqs: Vec<u64> = ops.iter().map(|o| o.req_u64("seq")).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [0, 1], "the child's 5 calls took no sequence numbers");
    let files = support::list_files(&run.dir());
    let pre = support::prefix_of(&run.dir(), None, pid);
    let want = [
        format!("calls/{pre}-00000.parquet"),
        format!("comms/{pre}-00000.parquet"),
        format!("nccl_comms/{pre}-00000.parquet"),
        format!("ops/{pre}-00000.parquet"),
        format!("process/{pre}.parquet"),
    ];
    assert_eq!(files, want, "only the parent's files");
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("end_reason"), Some("exit"));
    assert_eq!(p[0].u64("ops_rows"), Some(2));
}

#[test]
fn exec_child_records_its_own_rows() {
    let run = Run::new("exec");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let cid = support::comm_id_of(&support::read_id(&idf));
    let hostp = common::fixtures().host.to_str().unwrap().to_string();
    let args = [
        "exec",
        hostp.as_str(),
        "ops",
        "0",
        "1",
        idf.to_str().unwrap(),
        "2",
    ];
    let child = run
        .host(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ppid = child.id() as i32;
    let out = child.wait_with_output().unwrap();
    support::assert_ok(&out, &args);
    assert_eq!(text(&out.stdout), "ok\n");

    let procs = run.rows("process");
    assert_eq!(procs.len(), 2, "{procs:#?}");
    let parent = procs
        .iter()
        .find(|p| p.i32("pid") == Some(ppid))
        .expect("parent row");
    let kid = procs.iter().find(|p| p.i32("pid") != Some(ppid)).unwrap();
    let kpid = kid.req_i32("pid");
    assert_eq!(kid.i32("ppid"), Some(ppid));
    let kid_cmd = format!("{hostp} ops 0 1 {} 2", idf.display());
    assert_eq!(kid.str("cmdline"), Some(kid_cmd.as_str()));
    assert_eq!(parent.str("end_reason"), Some("exit"));
    assert_eq!(kid.str("end_reason"), Some("exit"));
    assert_eq!(parent.u64("ops_rows"), Some(1));
    assert_eq!(kid.u64("ops_rows"), Some(22));

    let ops = run.rows("ops");
    let mine: Vec<_> = ops.iter().filter(|o| o.i32("pid") == Some(ppid)).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].str("op"), Some("AllReduce"));
    let theirs: Vec<_> = ops.iter().filter(|o| o.i32("pid") == Some(kpid)).collect();
    assert_eq!(theirs.len(), 22);
    let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
    for o in &theirs {
        *per_op.entry(o.req_str("op")).or_default() += 1;
        assert_eq!(o.u64("comm_id"), Some(cid));
        assert_eq!((o.i32("rank"), o.i32("nranks")), (Some(0), Some(1)));
    }
    assert_eq!(per_op.len(), 11, "{per_op:?}");
    assert!(per_op.values().all(|&n| n == 2), "{per_op:?}");
    assert_eq!(ops.len(), 23);

    let files = support::list_files(&run.dir());
    let mut want = Vec::new();
    // nccl_comms: the stand-in NCCL loads the shim as its profiler plugin, like NCCL.
    let pre = |p| support::prefix_of(&run.dir(), None, p);
    for t in ["calls", "comms", "nccl_comms", "ops"] {
        for p in [ppid, kpid] {
            want.push(format!("{t}/{}-00000.parquet", pre(p)));
        }
    }
    for p in [ppid, kpid] {
        want.push(format!("process/{}.parquet", pre(p)));
    }
    // The child's grouped Send/Recv to itself are P2p events even on one rank.
    want.push(format!("nccl_ops/{}-00000.parquet", pre(kpid)));
    want.sort();
    assert_eq!(files, want);
}

#[test]
fn underscore_exit_closes_the_files() {
    let run = Run::new("uexit");
    let out = run.host(&["exit_underscore"]).output().unwrap();
    support::assert_ok(&out, &["exit_underscore"]);
    let files = support::list_files(&run.dir());
    assert_eq!(files.len(), 5, "{files:?}"); // ops, calls, comms, nccl_comms, process
    assert!(
        files.iter().all(|f| f.ends_with(".parquet") && !f.contains("/_")),
        "leftovers: {files:?}"
    );
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3);
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("end_reason"), Some("_exit"));
    assert_eq!(p[0].u64("ops_rows"), Some(3));
    assert!(p[0].i64("end_ns").is_some());
}

#[test]
fn disabled_records_nothing() {
    let scratch = Run::new("scratch");
    let idf = scratch.scratch("uid");
    common::write_unique_id(&idf);
    let idp = idf.to_str().unwrap();
    for (args, value) in [
        (&["ops", "0", "1", idp, "2"][..], "0"),
        (&["errors"][..], "off"),
        (&["split"][..], "false"),
    ] {
        let plain = host_plain(args).output().unwrap();
        let run = Run::new("disabled");
        let shim = run.host(args).env("ZCTA_ENABLE", value).output().unwrap();
        assert_same_behaviour(args[0], &plain, &shim);
        assert!(shim.stderr.is_empty());
        assert!(
            !run.dir().exists(),
            "ZCTA_ENABLE={value}: {} created",
            run.dir().display()
        );
        assert_eq!(std::fs::read_dir(run.out_dir()).unwrap().count(), 0);
    }
}

#[test]
fn launcher_rank_names_the_files() {
    let run = Run::new("ranked");
    let child = run
        .host(&["simulate"])
        .env("RANK", "3")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    support::assert_ok(&out, &["simulate"]);
    let pre = support::prefix_of(&run.dir(), Some(3), pid);
    assert_eq!(
        support::list_files(&run.dir()),
        [
            format!("calls/{pre}-00000.parquet"),
            format!("comms/{pre}-00000.parquet"),
            format!("nccl_comms/{pre}-00000.parquet"),
            format!("ops/{pre}-00000.parquet"),
            format!("process/{pre}.parquet"),
        ]
    );
    let p = run.rows("process");
    assert_eq!(p[0].i32("rank_env"), Some(3));
    let env: serde_json::Value = serde_json::from_str(p[0].req_str("env_json")).unwrap();
    assert_eq!(env["RANK"], "3");
}

#[test]
fn unwritable_output_warns_once_and_changes_nothing() {
    let scratch = Run::new("scratch");
    let idf = scratch.scratch("uid");
    common::write_unique_id(&idf);
    let args = ["ops", "0", "1", idf.to_str().unwrap(), "2"];
    let blocker = scratch.scratch("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let plain = host_plain(&args).output().unwrap();
    let shim = host_plain(&args)
        .env("LD_PRELOAD", common::shim_path())
        .env("ZCTA_OUT", blocker.join("out"))
        .env("ZCTA_RUN_ID", "r")
        .output()
        .unwrap();
    assert_eq!(text(&shim.stdout), text(&plain.stdout));
    assert_eq!(shim.status.code(), plain.status.code());
    let err = text(&shim.stderr);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("zcta: cannot write"), "{err:?}");
    assert!(
        err.contains(blocker.to_str().unwrap()),
        "the message names the path: {err:?}"
    );
}

/// `threads THREADS ITERS` with `ZCTA_QUEUE_CAPACITY=1024`, checked to succeed
/// untouched; returns the process rows.
fn threads_with_the_smallest_queue(run: &Run, threads: u64, iters: u64) -> Vec<Row> {
    let out = run
        .host(&["threads", &threads.to_string(), &iters.to_string()])
        .env("ZCTA_QUEUE_CAPACITY", "1024")
        .output()
        .unwrap();
    support::assert_ok(&out, &["threads"]);
    run.rows("process")
}

#[test]
fn queue_overflow_is_counted_never_silent() {
    const THREADS: u64 = 8;
    const ITERS: u64 = 5000;
    let run = Run::new("overflow");
    let p = threads_with_the_smallest_queue(&run, THREADS, ITERS);
    assert_eq!(p.len(), 1);
    let p = &p[0];
    let (ops, calls, comms) = (
        run.rows("ops").len(),
        run.rows("calls").len(),
        run.rows("comms").len(),
    );
    assert_eq!(p.u64("ops_rows"), Some(ops as u64));
    assert_eq!(p.u64("calls_rows"), Some(calls as u64));
    assert_eq!(p.u64("comms_rows"), Some(comms as u64));
    // Every record made is either written or counted as dropped: 8 comms rows,
    // 8 CommInitRank + 8 CommDestroy calls rows, 8 nccl_comms rows (plugin init; a
    // 1-rank communicator has no plugin events), THREADS x ITERS ops rows.
    let made = THREADS * ITERS + 4 * THREADS;
    let plugin_comms = run.rows("nccl_comms").len() as u64;
    let dropped = p.req_u64("records_dropped");
    assert_eq!(
        ops as u64 + calls as u64 + comms as u64 + plugin_comms + dropped,
        made,
        "{p:?}"
    );
}

/// A C program that forks before anything touched NCCL; the child then loads
/// libglue.so (as a `multiprocessing` fork child imports torch), runs a scenario and
/// leaves with `_exit` (as `multiprocessing` does). The parent prints the child's
/// pid and exits with its status.
const FORKER_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char** argv) {
  if (argc < 3) return 2;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return 120;
  if (pid == 0) {
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) { fprintf(stderr, "dlopen: %s\n", dlerror()); _exit(121); }
    int (*gm)(int, char**) = (int (*)(int, char**))dlsym(h, "glue_main");
    if (gm == NULL) _exit(122);
    int rc = gm(argc - 1, argv + 1);
    fflush(NULL);
    _exit(rc);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) < 0) return 123;
  printf("child %d\n", (int)pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 124;
}
"#;

/// A process that forks before it ever called NCCL has nothing to hand down: its
/// fork children must record their own NCCL calls (shim/src/ffi/process.rs names
/// "multiprocessing fork children" among the reasons for the `_exit` hook).
#[test]
fn fork_child_of_a_process_without_nccl_records() {
    let run = Run::new("forker");
    let src = run.scratch("forker.c");
    std::fs::write(&src, FORKER_C).unwrap();
    let exe = run.scratch("forker");
    let cc = std::env::var_os("CC")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cc".into());
    let st = Command::new(cc)
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(st.success());
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let fx = common::fixtures();
    let mut cmd = clean_cmd(&exe);
    cmd.arg(&fx.libglue)
        .args(["ops", "0", "1", idf.to_str().unwrap(), "2"]);
    let out = run.apply(&mut cmd).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let stdout = text(&out.stdout);
    let kpid: i32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {stdout:?}"));
    assert!(stdout.starts_with("ok\n"), "{stdout:?}");

    assert!(
        run.dir().exists(),
        "the fork child's 22 NCCL ops were not recorded: nothing was written"
    );
    let procs = run.rows("process");
    assert_eq!(procs.len(), 1, "{procs:#?}");
    assert_eq!(procs[0].i32("pid"), Some(kpid));
    assert_eq!(procs[0].str("end_reason"), Some("_exit"));
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 22);
    assert!(ops.iter().all(|o| o.i32("pid") == Some(kpid)));
    // Thread ids are cached per thread; the child's only thread is its own.
    assert!(ops.iter().all(|o| o.i32("tid") == Some(kpid)));
}

/// Starts `host loop` under the shim with `env` and times its first NCCL call (the
/// communicator creation that starts recording, after which the host prints
/// "started"); returns that time (None: not within `limit`) and the process's resident
/// memory then, in bytes. The process is killed before returning.
fn first_call(
    run: &Run,
    env: &[(&str, &str)],
    limit: std::time::Duration,
) -> (Option<std::time::Duration>, u64) {
    use std::io::{BufRead, BufReader};
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let mut cmd = run.host(&["loop", idf.to_str().unwrap()]);
    cmd.envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let t0 = std::time::Instant::now();
    let mut child = cmd.spawn().expect("spawn host loop");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let started = match rx.recv_timeout(limit) {
        Ok(line) => {
            assert_eq!(line, "started\n");
            Some(t0.elapsed())
        }
        Err(_) => None,
    };
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let _ = child.kill();
    let _ = child.wait();
    (started, rss_kb * 1024)
}

/// The largest `ZCTA_QUEUE_CAPACITY` allowed costs nothing up front: the first NCCL
/// call returns as fast, and the process holds no more memory, than with the default
/// capacity (the queues' slots take memory only once records reach them). A value
/// above the maximum (16777216 was allowed once, and made the first call block for
/// 12 s while 7.4 GB were filled in) gets the default.
#[test]
fn the_largest_queue_costs_nothing_up_front() {
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(3);
    let run = Run::new("queue-default");
    let (t, base_rss) = first_call(&run, &[], LIMIT);
    let base = t.expect("first call with the default queue");
    let max = zcta::config::QUEUE_CAPACITY_MAX.to_string();
    for cap in [max.as_str(), "16777216"] {
        let run = Run::new("queue-max");
        let (t, rss) = first_call(&run, &[("ZCTA_QUEUE_CAPACITY", cap)], LIMIT);
        let t = t.unwrap_or_else(|| panic!("ZCTA_QUEUE_CAPACITY={cap}: first call not done in {LIMIT:?}"));
        eprintln!(
            "ZCTA_QUEUE_CAPACITY={cap}: started after {t:?} (default {base:?}), {} MB resident (default {} MB)",
            rss >> 20,
            base_rss >> 20
        );
        assert!(
            t < base + std::time::Duration::from_millis(500),
            "ZCTA_QUEUE_CAPACITY={cap}: started after {t:?}, {base:?} with the default"
        );
        assert!(
            rss < base_rss + (32 << 20),
            "ZCTA_QUEUE_CAPACITY={cap}: {} MB resident, {} MB with the default",
            rss >> 20,
            base_rss >> 20
        );
    }
}

/// A burst of ops from many threads through the smallest queue drops ops, never a
/// communicator: every thread's comms row and its CommInitRank and CommDestroy calls
/// rows are written (op records leave part of the queue to them), so every ops row
/// joins its communicator; and `zcta summary` and `zcta report` say how many records
/// were dropped.
#[test]
fn a_burst_drops_ops_but_keeps_every_communicator() {
    const THREADS: u64 = 32;
    const ITERS: u64 = 3000;
    let run = Run::new("burst");
    let p = threads_with_the_smallest_queue(&run, THREADS, ITERS);
    let dropped = p[0].req_u64("records_dropped");
    assert!(dropped > 0, "the burst overflowed the queue: {:?}", p[0]);
    let comms = run.rows("comms");
    let calls = run.rows("calls");
    let ops = run.rows("ops");
    let ids: std::collections::HashSet<u64> = comms.iter().map(|c| c.req_u64("comm_id")).collect();
    let orphans = ops
        .iter()
        .filter(|o| !o.u64("comm_id").is_some_and(|c| ids.contains(&c)))
        .count();
    let n = |k: &str| calls.iter().filter(|c| c.str("call") == Some(k)).count() as u64;
    assert_eq!(
        (comms.len() as u64, n("CommInitRank"), n("CommDestroy"), orphans),
        (THREADS, THREADS, THREADS, 0),
        "comms rows, CommInitRank and CommDestroy calls rows, ops rows without their comms row ({} ops rows, {dropped} dropped)",
        ops.len()
    );
    let zcta = |cmd: &str| {
        let o = clean_cmd(env!("CARGO_BIN_EXE_zcta"))
            .arg(cmd)
            .arg(run.dir())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "zcta {cmd}: {o:?}");
        text(&o.stdout)
    };
    let summary = zcta("summary");
    assert!(
        summary.contains(&format!(
            "dropped    {dropped:>10} records (process.records_dropped) in 1 of 1 process"
        )),
        "{summary}"
    );
    let report = zcta("report");
    assert!(
        report.contains(&format!("{dropped} records dropped")) && report.contains("process.records_dropped"),
        "{report}"
    );
}
