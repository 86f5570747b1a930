//! `libzcta_prof.so`: injected with `LD_PRELOAD`, it interposes NCCL's API, forwards
//! every call unchanged to the real libnccl and records what happened.
//!
//! Layout:
//! - [`ffi`]: every unsafe line — the exported NCCL symbols, finding the real
//!   library, process hooks (constructor, atfork, atexit, `_exit`);
//! - [`hooks`]: what is recorded for each kind of call (safe);
//! - [`timing`]: each op's GPU side timed with GPU stamps on its stream (the default);
//! - [`gpu`]: GPU capture through CUPTI (deep mode) (start, coexistence, the writer's source);
//! - [`comms`]: communicators known to this process and their sequence counters;
//! - [`state`]: the lifecycle (lazy activation on the first NCCL call, fork children
//!   disabled, flush at exit, self-disable on internal failure) and the bounded queue
//!   to the writer thread.

// Under `cfg(test)` the exports are not `no_mangle` (tests must not interpose on
// themselves), so most of the crate is unreachable from the test harness.
#![cfg_attr(test, allow(dead_code))]

mod comms;
mod control;
mod ffi;
mod gpu;
mod hooks;
mod plugin;
mod state;
mod timing;
