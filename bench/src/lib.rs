//! Latency and throughput benchmarks for rpcrdmad.
#![forbid(unsafe_code)]
