//! Opening the rdma-core provider: a clean "no RDMA devices" error on a kernel without RDMA
//! (this machine, CI), a working device where the kernel has one (`tests/vm/run`, which names
//! the device in `RPCRDMA_IBV_DEVICE`).
#![cfg(feature = "ibv")]

use std::path::Path;

use rpcrdma_verbs::ibv::{Exposure, IbvConfig, IbvProvider, OpenError};
use rpcrdma_verbs::{Error, Provider};

/// Whether the kernel has an RDMA core (the class directory exists once ib_core is loaded).
fn kernel_has_rdma() -> bool {
    Path::new("/sys/class/infiniband").exists()
}

fn wanted_device() -> Option<String> {
    std::env::var("RPCRDMA_IBV_DEVICE").ok()
}

#[test]
fn open_reports_no_kernel_support_or_opens_the_device() {
    let cfg = IbvConfig {
        device: wanted_device(),
        ..IbvConfig::default()
    };
    match IbvProvider::open(cfg) {
        Err(e @ OpenError::NoKernelSupport(_)) => {
            assert!(!kernel_has_rdma(), "kernel has RDMA but open said: {e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with("no RDMA devices (kernel has no RDMA support")
                    && msg.ends_with("use the soft provider"),
                "{msg}"
            );
            assert!(matches!(Error::from(e), Error::NoDevice));
        }
        Err(e) => panic!("unexpected open error: {e}"),
        Ok(mut p) => {
            assert!(kernel_has_rdma());
            let name = wanted_device().expect("a device opened, so the harness named one");
            assert_eq!(p.device_name(), name);
            // siw is iWARP, without memory windows, reading into one entry; rxe is RoCE whose
            // windows do not enforce their bounds, so exposure defaults to regions on both.
            let siw = name.starts_with("siw");
            assert_eq!(p.is_iwarp(), siw);
            assert!(!p.uses_memory_windows() && !p.remote_invalidation());
            assert_eq!(p.max_read_sge() == 1, siw);
            // The device's deepest completion queue is what poll threads size theirs by: a
            // queue of that depth is created, one entry more is refused. Send queues hold three
            // entries per request (window binds and invalidations of the provider's own).
            let max = p.max_cq_depth();
            assert!(max > 0 && max < u32::MAX, "{max}");
            let cq = p.create_cq(max).expect("a CQ as deep as the device allows");
            p.destroy_cq(cq).expect("destroy");
            assert!(p.create_cq(max + 1).is_err(), "a CQ deeper than {max}");
            assert_eq!(p.send_queue_entries(100), 300);
            let forced = IbvProvider::open(IbvConfig {
                device: Some(name),
                exposure: Exposure::MemoryWindow,
                ..IbvConfig::default()
            });
            match forced {
                Ok(p) => assert!(!siw && p.uses_memory_windows() && p.remote_invalidation()),
                Err(OpenError::Unsupported(_)) => assert!(siw),
                Err(e) => panic!("unexpected open error: {e}"),
            }
        }
    }
}

#[test]
fn open_unknown_device_is_refused_with_the_present_ones() {
    let cfg = IbvConfig {
        device: Some("no-such-device9".into()),
        ..IbvConfig::default()
    };
    match IbvProvider::open(cfg) {
        Err(OpenError::NoKernelSupport(_)) => assert!(!kernel_has_rdma()),
        Err(OpenError::NoSuchDevice { wanted, present }) => {
            assert_eq!(wanted, "no-such-device9");
            if let Some(d) = wanted_device() {
                assert!(present.contains(&d), "{present:?} lacks {d}");
            }
        }
        Err(e) => panic!("unexpected open error: {e}"),
        Ok(p) => panic!("opened {p:?} for a device that does not exist"),
    }
}
