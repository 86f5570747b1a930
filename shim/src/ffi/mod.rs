//! Every unsafe line of zcta-prof lives in this module tree.
//!
//! - [`cuda`]: the CUDA driver calls of per-op timing (events, capture status);
//! - [`cupti`]: loading libcupti, its buffer callbacks, the CUPTI entry points we
//!   interpose to notice another CUPTI client;
//! - [`exports`]: the NCCL symbols we export (one line each) and their forwarding;
//! - [`real`]: finding the real libnccl and its functions, and querying it;
//! - [`process`]: constructor, fork/exit hooks, the `_exit` interposer;
//! - [`queue`]: the bounded record queue from NCCL-calling threads to the writer;
//! - [`sys`]: thin wrappers over libc calls.
#![allow(unsafe_code)]

pub mod cuda;
pub mod cupti;
pub mod exports;
pub mod plugin;
pub mod process;
pub mod queue;
pub mod real;
pub mod sys;
