//! One integration-test binary (fast to link): every module below starts
//! real servers on loopback.

mod audit;
mod cli;
mod codemode;
mod common;
mod context;
mod crash;
mod docs;
mod grpcurl;
mod hardening;
mod inspect;
mod lifecycle;
mod limits;
mod metrics;
mod offload;
mod payloads;
mod policies;
mod redaction;
mod roles;
mod sessions;
mod tls;
