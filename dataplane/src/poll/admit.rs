//! Admission of incoming connections, per listener: an allow list of networks, a cap on the
//! connections one host holds, and a cap on how fast one host opens them, so that one
//! misbehaving or compromised host (a reconnect loop, a flood of connection requests) can
//! neither take every connection slot of a poll thread nor keep the thread busy setting up
//! queue pairs while others wait.
//!
//! A host is the remote IP address, with IPv4-mapped IPv6 addresses taken as the IPv4
//! address they map (a dual-stack listener sees `::ffff:192.0.2.7` for `192.0.2.7`). The rate
//! is a generic cell rate algorithm (a token bucket kept as one instant per host): a host may
//! open `rate` connections per second, in bursts of up to `max(rate, per_host)`, so a host
//! that lost its connections may reopen all of them at once.
//!
//! Only the connection manager's events reach this: nothing here is on the data path.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// A listener's admission rules (`listeners[]` of the configuration).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmitSpec {
    /// Networks a connection may come from; empty: any. A request without a remote address
    /// (the in-memory fabric) passes only an empty list.
    pub allow: Vec<IpNet>,
    /// Most connections one host holds on this listener at once; 0: no cap.
    pub per_host: u32,
    /// Most new connections one host opens per second on this listener; 0: no cap.
    pub rate: u32,
    /// Whether admitted connections go to the poll thread with the fewest connections
    /// (`listeners[].spread`) rather than staying on the listener's.
    pub spread: bool,
}

impl AdmitSpec {
    /// Whether `host` (a [`host_of`]) is in the allow list, or the list is empty.
    pub fn allows(&self, host: Option<IpAddr>) -> bool {
        self.allow.is_empty() || host.is_some_and(|h| self.allow.iter().any(|n| n.contains(&h)))
    }

    /// The allow list as the provider applies it to streams as they are accepted, where it
    /// can ([`rpcrdma_verbs::Provider::filter_listener`]); `None` for an empty list.
    pub fn accept_filter(&self) -> Option<rpcrdma_verbs::AcceptFilter> {
        if self.allow.is_empty() {
            return None;
        }
        let spec = AdmitSpec {
            allow: self.allow.clone(),
            ..AdmitSpec::default()
        };
        Some(rpcrdma_verbs::AcceptFilter::new(move |ip| {
            spec.allows(Some(ip.to_canonical()))
        }))
    }
}

/// Why an incoming connection was refused (a label of `rpcrdmad_connects_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its address is in no network of the listener's allow list.
    NotAllowed,
    /// Its host already holds the listener's `max-connections-per-host`.
    HostLimit,
    /// Its host opened connections faster than the listener's `connect-rate-per-host`.
    Rate,
    /// The poll thread has no free connection slot (`pools.connections`), or the queue pair
    /// could not be made.
    Full,
    /// The daemon is stopping.
    Draining,
}

impl Refusal {
    /// Every reason, in the order of [`Refused::counts`].
    pub const ALL: [Refusal; 5] = [
        Refusal::NotAllowed,
        Refusal::HostLimit,
        Refusal::Rate,
        Refusal::Full,
        Refusal::Draining,
    ];

    /// Its name in metrics and in `rpcrdmactl stats`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not-allowed",
            Refusal::HostLimit => "host-limit",
            Refusal::Rate => "rate",
            Refusal::Full => "full",
            Refusal::Draining => "draining",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NotAllowed => "not in the listener's allow list (listeners[].allow)",
            Refusal::HostLimit => {
                "the host holds its most connections (listeners[].max-connections-per-host)"
            }
            Refusal::Rate => "the host connects too fast (listeners[].connect-rate-per-host)",
            Refusal::Full => "no free connection slot (pools.connections)",
            Refusal::Draining => "the daemon is stopping",
        })
    }
}

/// Connection requests refused so far, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    /// Counts in the order of [`Refusal::ALL`].
    pub counts: [u64; Refusal::ALL.len()],
}

impl Refused {
    /// Counts one refusal.
    pub fn add(&mut self, why: Refusal) {
        let n = &mut self.counts[why.index()];
        *n = n.saturating_add(1);
    }

    /// Refusals for `why`.
    pub fn get(&self, why: Refusal) -> u64 {
        self.counts[why.index()]
    }

    /// Refusals for any reason.
    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &n| a.saturating_add(n))
    }
}

/// Hosts whose entry is kept although they hold no connection (their bucket is not full
/// yet): past this many, such entries are forgotten first.
const QUIET_HOSTS: usize = 4096;

/// A host's state on one listener.
#[derive(Debug, Clone, Copy)]
struct Host {
    /// Connections it holds (admitted and not yet released).
    conns: u32,
    /// Theoretical arrival time of its next connection: it is admitted if this is at most
    /// `burst × interval` ahead of now.
    tat: Instant,
}

/// One listener's admission state.
#[derive(Debug, Default)]
pub struct Gate {
    spec: AdmitSpec,
    hosts: HashMap<Option<IpAddr>, Host>,
}

/// The host a remote address counts for.
pub fn host_of(remote: Option<std::net::SocketAddr>) -> Option<IpAddr> {
    remote.map(|a| a.ip().to_canonical())
}

impl Gate {
    /// A gate applying `spec`.
    pub fn new(spec: AdmitSpec) -> Gate {
        Gate {
            spec,
            hosts: HashMap::new(),
        }
    }

    /// The rules it applies.
    pub fn spec(&self) -> &AdmitSpec {
        &self.spec
    }

    /// Connections admitted and not released yet, over every host.
    pub fn held(&self) -> u64 {
        self.hosts.values().map(|h| u64::from(h.conns)).sum()
    }

    /// Applies `spec` from now on (connections held stay, and count against the new cap:
    /// every host's connections are counted, under no cap too).
    pub fn set_spec(&mut self, spec: AdmitSpec) {
        self.spec = spec;
    }

    /// Admits a connection from `host` at `now` (counted until [`Gate::release`]), or says
    /// why not.
    pub fn admit(&mut self, host: Option<IpAddr>, now: Instant) -> Result<(), Refusal> {
        if !self.spec.allows(host) {
            return Err(Refusal::NotAllowed);
        }
        if self.hosts.len() >= QUIET_HOSTS && !self.hosts.contains_key(&host) {
            self.hosts.retain(|_, h| h.conns > 0 || h.tat > now);
            if self.hosts.len() >= QUIET_HOSTS {
                // Many hosts connected lately: forget the rate of those holding nothing (the
                // entries left are bounded by the connections the listener holds, at most
                // every poll thread's slots).
                self.hosts.retain(|_, h| h.conns > 0);
            }
        }
        let spec = &self.spec;
        let h = self
            .hosts
            .entry(host)
            .or_insert(Host { conns: 0, tat: now });
        if spec.per_host != 0 && h.conns >= spec.per_host {
            return Err(Refusal::HostLimit);
        }
        if spec.rate != 0 {
            let interval = Duration::from_secs(1) / spec.rate;
            let burst = spec.rate.max(spec.per_host);
            let tat = h.tat.max(now);
            // Admitted while the bucket holds a token: at most `burst - 1` intervals ahead.
            if tat.saturating_duration_since(now) > interval * (burst - 1) {
                return Err(Refusal::Rate);
            }
            h.tat = tat + interval;
        }
        h.conns += 1;
        Ok(())
    }

    /// A connection [`Gate::admit`] let in from `host` has ended.
    pub fn release(&mut self, host: Option<IpAddr>, now: Instant) {
        if let Some(h) = self.hosts.get_mut(&host) {
            h.conns = h.conns.saturating_sub(1);
            if h.conns == 0 && h.tat <= now {
                self.hosts.remove(&host);
            }
        }
    }

    /// Hosts with an entry (for tests: memory stays bounded).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.hosts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn spec(allow: &[&str], per_host: u32, rate: u32) -> AdmitSpec {
        AdmitSpec {
            allow: allow.iter().map(|n| n.parse().unwrap()).collect(),
            per_host,
            rate,
            spread: false,
        }
    }

    #[test]
    fn with_no_rule_everyone_is_admitted_and_counted_until_released() {
        let mut g = Gate::new(AdmitSpec::default());
        let now = Instant::now();
        for _ in 0..1000 {
            assert_eq!(g.admit(ip("192.0.2.1"), now), Ok(()));
        }
        assert_eq!(g.admit(None, now), Ok(()));
        assert_eq!(g.tracked(), 2);
        // A cap set later (a reload) counts the connections already held.
        g.set_spec(spec(&[], 1000, 0));
        assert_eq!(g.admit(ip("192.0.2.1"), now), Err(Refusal::HostLimit));
        g.release(ip("192.0.2.1"), now);
        assert_eq!(g.admit(ip("192.0.2.1"), now), Ok(()));
        for _ in 0..1000 {
            g.release(ip("192.0.2.1"), now);
        }
        g.release(None, now);
        assert_eq!(g.tracked(), 0, "nothing kept for hosts that hold nothing");
    }

    #[test]
    fn the_allow_list_admits_its_networks_and_mapped_addresses_only() {
        let mut g = Gate::new(spec(&["192.0.2.0/24", "2001:db8::1/128"], 0, 0));
        let now = Instant::now();
        assert_eq!(g.admit(ip("192.0.2.200"), now), Ok(()));
        assert_eq!(g.admit(ip("2001:db8::1"), now), Ok(()));
        assert_eq!(g.admit(ip("192.0.3.1"), now), Err(Refusal::NotAllowed));
        assert_eq!(g.admit(ip("2001:db8::2"), now), Err(Refusal::NotAllowed));
        // A dual-stack listener sees IPv4 peers as mapped IPv6 addresses.
        let mapped = "[::ffff:192.0.2.9]:5".parse().ok();
        assert_eq!(g.admit(host_of(mapped), now), Ok(()));
        assert_eq!(
            g.admit(None, now),
            Err(Refusal::NotAllowed),
            "no address to check"
        );
    }

    #[test]
    fn a_host_at_its_cap_is_refused_and_others_are_not() {
        let mut g = Gate::new(spec(&[], 2, 0));
        let now = Instant::now();
        let (a, b) = (ip("192.0.2.1"), ip("192.0.2.2"));
        assert_eq!(g.admit(a, now), Ok(()));
        assert_eq!(g.admit(a, now), Ok(()));
        assert_eq!(g.admit(a, now), Err(Refusal::HostLimit));
        assert_eq!(g.admit(b, now), Ok(()), "another host is not affected");
        g.release(a, now);
        assert_eq!(
            g.admit(a, now),
            Ok(()),
            "a released connection frees its place"
        );
        assert_eq!(g.admit(a, now), Err(Refusal::HostLimit));
        // A stricter spec counts the connections already held.
        g.set_spec(spec(&[], 1, 0));
        g.release(a, now);
        assert_eq!(g.admit(a, now), Err(Refusal::HostLimit));
    }

    #[test]
    fn the_rate_allows_a_burst_then_one_per_interval() {
        // 4 per second, bursts of 4: four at once, the fifth 250 ms later.
        let mut g = Gate::new(spec(&[], 0, 4));
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..4 {
            assert_eq!(g.admit(a, t0), Ok(()));
        }
        assert_eq!(g.admit(a, t0), Err(Refusal::Rate));
        assert_eq!(g.admit(ip("192.0.2.2"), t0), Ok(()), "per host");
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(g.admit(a, ms(200)), Err(Refusal::Rate));
        assert_eq!(g.admit(a, ms(250)), Ok(()));
        assert_eq!(g.admit(a, ms(260)), Err(Refusal::Rate));
        // Refusals take no token: a host that keeps trying is not locked out for longer.
        for k in 0..100 {
            let _ = g.admit(a, ms(261 + k));
        }
        assert_eq!(g.admit(a, ms(500)), Ok(()));
        // After a quiet second the whole burst is back.
        for _ in 0..4 {
            assert_eq!(g.admit(a, ms(1600)), Ok(()));
        }
        assert_eq!(g.admit(a, ms(1600)), Err(Refusal::Rate));
    }

    #[test]
    fn the_burst_covers_a_hosts_whole_cap() {
        // A host that lost its 8 connections may reopen them at once though the rate is 2/s.
        let mut g = Gate::new(spec(&[], 8, 2));
        let now = Instant::now();
        let a = ip("192.0.2.1");
        for _ in 0..8 {
            assert_eq!(g.admit(a, now), Ok(()));
        }
        assert_eq!(g.admit(a, now), Err(Refusal::HostLimit));
    }

    #[test]
    fn hosts_are_forgotten_once_they_hold_nothing_and_their_bucket_is_full() {
        let mut g = Gate::new(spec(&[], 4, 10));
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        assert_eq!(g.admit(a, t0), Ok(()));
        g.release(a, t0 + Duration::from_secs(1));
        assert_eq!(g.tracked(), 0);
        // A flood from many addresses keeps at most QUIET_HOSTS quiet entries.
        for k in 0..(3 * QUIET_HOSTS as u32) {
            let h = Some(IpAddr::from((0x0a00_0000u32 + k).to_be_bytes()));
            assert_eq!(g.admit(h, t0), Ok(()));
            g.release(h, t0);
            assert!(g.tracked() <= QUIET_HOSTS + 1, "{}", g.tracked());
        }
        // Hosts holding connections are never forgotten: their count must go on.
        let held = ip("192.0.2.4");
        assert_eq!(g.admit(held, t0), Ok(()));
        for k in 0..(2 * QUIET_HOSTS as u32) {
            let h = Some(IpAddr::from((0x0b00_0000u32 + k).to_be_bytes()));
            assert_eq!(g.admit(h, t0), Ok(()));
            g.release(h, t0);
        }
        for _ in 0..3 {
            assert_eq!(g.admit(held, t0 + Duration::from_secs(5)), Ok(()));
        }
        assert_eq!(
            g.admit(held, t0 + Duration::from_secs(5)),
            Err(Refusal::HostLimit)
        );
    }
}
