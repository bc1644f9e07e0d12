//! The device's port events on a real device: taking the device's network interface down and
//! up again is reported as its port going down and becoming active again
//! ([`Provider::device_events`]), and wakes a sleeper on the provider's event fd. It needs an
//! RDMA device and root: `tests/vm/run` runs it inside the VM on rxe0 and siw0, after the
//! device's other suites but siw's interop one (it takes the device's link down for a moment),
//! naming the device and its address in `RPCRDMA_IBV_DEVICE` and `RPCRDMA_IBV_ADDR`. Without a
//! device it fails (this suite never passes by skipping).
#![cfg(feature = "ibv")]

use std::process::Command;
use std::time::{Duration, Instant};

use rpcrdma_verbs::conformance::readable;
use rpcrdma_verbs::ibv::{IbvConfig, IbvProvider};
use rpcrdma_verbs::{DeviceEvents, Provider};

const DEADLINE: Duration = Duration::from_secs(20);

/// The network interface that holds `addr` (`ip -o addr show to ADDR`: "N: NAME inet ...").
fn interface_of(addr: &str) -> String {
    let out = Command::new("ip")
        .args(["-o", "addr", "show", "to", addr])
        .output()
        .expect("run ip");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no interface holds {addr}: {text:?}"))
        .to_string()
}

fn set_link(ifname: &str, state: &str) {
    let st = Command::new("ip")
        .args(["link", "set", "dev", ifname, state])
        .status()
        .expect("run ip");
    assert!(st.success(), "ip link set dev {ifname} {state}: {st}");
}

/// Brings the interface back up however the test ends.
struct LinkUp<'a>(&'a str);

impl Drop for LinkUp<'_> {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", "dev", self.0, "up"])
            .status();
    }
}

/// Sleep on the provider's event fd until it is readable, then take its events, until `done`
/// holds of the device's counts (a hang guard of [`DEADLINE`], not a timing assertion).
fn wait_for(p: &mut IbvProvider, what: &str, done: impl Fn(&DeviceEvents) -> bool) {
    let start = Instant::now();
    loop {
        while p.poll_cm().is_some() {}
        if done(&p.device_events()) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not reported ({:?})",
            p.device_events()
        );
        let fd = p.event_fd().expect("the ibv provider has an event fd");
        let _ = readable(fd, 200);
    }
}

#[test]
fn port_down_and_up_are_counted() {
    let device = std::env::var("RPCRDMA_IBV_DEVICE")
        .expect("RPCRDMA_IBV_DEVICE names the RDMA device (this suite runs in tests/vm/run)");
    let addr =
        std::env::var("RPCRDMA_IBV_ADDR").expect("RPCRDMA_IBV_ADDR is the device's IP address");
    let mut p = IbvProvider::open(IbvConfig {
        device: Some(device.clone()),
        ..IbvConfig::default()
    })
    .unwrap_or_else(|e| panic!("open {device}: {e}"));
    let ifname = interface_of(&addr);
    while p.poll_cm().is_some() {}
    assert_eq!(p.device_events(), DeviceEvents::default(), "a quiet device");
    let fd = p.event_fd().expect("event fd");
    assert!(
        !readable(fd, 0),
        "nothing to report before the link goes down"
    );
    let _restore = LinkUp(&ifname);
    set_link(&ifname, "down");
    // The event wakes a sleeper: the async descriptor is part of the event fd.
    let start = Instant::now();
    while !readable(p.event_fd().expect("event fd"), 200) {
        assert!(
            start.elapsed() < DEADLINE,
            "the event fd never woke after the link went down"
        );
    }
    wait_for(&mut p, "port down", |d| d.port_down >= 1);
    set_link(&ifname, "up");
    wait_for(&mut p, "port up", |d| d.port_up >= 1);
    let d = p.device_events();
    assert_eq!(
        (d.qp_errors, d.cq_errors, d.srq_errors, d.device_fatal),
        (0, 0, 0, 0),
        "only the port's events: {d:?}"
    );
    eprintln!("{device} on {ifname}: {d:?}");
}
