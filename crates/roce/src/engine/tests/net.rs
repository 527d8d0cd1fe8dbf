//! A simulated network between two engines: per-packet loss, duplication, delay, jitter and
//! reordering from a seeded RNG, and a simulated clock that jumps to the next event.

use super::harness::Node;
use softrdma_wire::roce::{AethKind, RoceOpcode, RocePacket};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// SplitMix64: small, seedable, good enough for fault injection.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        p > 0.0 && x < p
    }
}

/// Fault model.
#[derive(Debug, Clone, Copy)]
pub(super) struct NetCfg {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub dup: f64,
    /// Probability a packet is held back (delivered after later ones).
    pub reorder: f64,
    /// One-way delay.
    pub delay: Duration,
    /// Extra random delay 0..jitter (order within a direction is kept, like a real path).
    pub jitter: Duration,
}

impl Default for NetCfg {
    fn default() -> NetCfg {
        NetCfg {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            delay: Duration::from_micros(10),
            jitter: Duration::ZERO,
        }
    }
}

/// A packet on its way.
type Flight = Reverse<(Instant, u64, bool, Vec<u8>)>;

/// Decides a packet's fate before the fault model: true delivers. Arguments: direction
/// (true = A to B) and the packet.
pub(super) type Filter = Box<dyn FnMut(bool, &RocePacket<'_>) -> bool>;

/// One logged transmission.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sent {
    pub at: Duration,
    pub to_b: bool,
    pub opcode: RoceOpcode,
    pub psn: u32,
    pub aeth: Option<AethKind>,
}

/// The network and the clock.
pub(super) struct Sim {
    pub now: Instant,
    pub start: Instant,
    pub cfg: NetCfg,
    rng: Rng,
    queue: BinaryHeap<Flight>,
    seq: u64,
    pub filter: Option<Filter>,
    pub log: Vec<Sent>,
    pub lost: u64,
    pub duplicated: u64,
    /// Latest delivery time scheduled per direction (index: to_b), for FIFO delivery.
    last: [Option<Instant>; 2],
    buf: Vec<u8>,
}

impl Sim {
    pub fn new(cfg: NetCfg, seed: u64) -> Sim {
        let now = Instant::now();
        Sim {
            now,
            start: now,
            cfg,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            filter: None,
            log: Vec::new(),
            lost: 0,
            duplicated: 0,
            last: [None; 2],
            buf: Vec::new(),
        }
    }

    /// Time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Puts one emitted packet on the wire (or not).
    pub fn send(&mut self, to_b: bool, bytes: &[u8]) {
        let pkt = RocePacket::parse(bytes).expect("engine emitted an unparsable packet");
        assert!(pkt.headers.matches_opcode());
        self.log.push(Sent {
            at: self.elapsed(),
            to_b,
            opcode: pkt.opcode(),
            psn: pkt.headers.bth.psn,
            aeth: pkt.headers.aeth.map(|a| a.kind()),
        });
        if let Some(f) = self.filter.as_mut() {
            if !f(to_b, &pkt) {
                self.lost += 1;
                return;
            }
        }
        if self.rng.chance(self.cfg.loss) {
            self.lost += 1;
            return;
        }
        let copies = if self.rng.chance(self.cfg.dup) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = self.cfg.delay;
            let jitter = self.cfg.jitter.as_nanos() as u64;
            if jitter > 0 {
                delay += Duration::from_nanos(self.rng.below(jitter));
            }
            let mut at = self.now + delay;
            let last = &mut self.last[usize::from(to_b)];
            if self.rng.chance(self.cfg.reorder) {
                // Held back: later packets overtake it.
                at += self.cfg.delay * (2 + self.rng.below(8) as u32);
            } else {
                at = last.map_or(at, |l| at.max(l));
                *last = Some(at);
            }
            self.seq += 1;
            self.queue.push(Reverse((at, self.seq, to_b, bytes.to_vec())));
        }
    }

    fn drain(&mut self, node: &mut Node, to_b: bool) {
        let mut buf = std::mem::take(&mut self.buf);
        for _ in 0..1_000_000 {
            if !node.engine.poll_transmit(self.now, &mut buf) {
                break;
            }
            self.send(to_b, &buf);
        }
        self.buf = buf;
    }

    /// Lets both engines transmit, then advances the clock to the next event (delivery or
    /// timer) and processes it. False when nothing is left to happen.
    pub fn step(&mut self, a: &mut Node, b: &mut Node) -> bool {
        self.drain(a, true);
        self.drain(b, false);
        let mut next = self.queue.peek().map(|Reverse(f)| f.0);
        for t in [a.engine.poll_timeout(), b.engine.poll_timeout()].into_iter().flatten() {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        let Some(next) = next else {
            return false;
        };
        if next > self.now {
            self.now = next;
        }
        while self.queue.peek().is_some_and(|Reverse(f)| f.0 <= self.now) {
            let Some(Reverse((_, _, to_b, bytes))) = self.queue.pop() else {
                break;
            };
            let pkt = RocePacket::parse(&bytes).expect("parsable");
            let node = if to_b { &mut *b } else { &mut *a };
            node.engine.handle_packet(self.now, &pkt);
        }
        for node in [&mut *a, &mut *b] {
            if node.engine.poll_timeout().is_some_and(|t| t <= self.now) {
                node.engine.handle_timeout(self.now);
            }
        }
        a.collect();
        b.collect();
        true
    }

    /// Steps until `done` holds (true), nothing is left to happen, or `limit` of simulated
    /// time passes (false unless `done` holds).
    pub fn run(
        &mut self,
        a: &mut Node,
        b: &mut Node,
        limit: Duration,
        mut done: impl FnMut(&Node, &Node) -> bool,
    ) -> bool {
        let end = self.now + limit;
        loop {
            a.collect();
            b.collect();
            if done(a, b) {
                return true;
            }
            if !self.step(a, b) || self.now > end {
                a.collect();
                b.collect();
                return done(a, b);
            }
        }
    }

    /// Steps until nothing is left to happen (or `limit` passes).
    pub fn settle(&mut self, a: &mut Node, b: &mut Node, limit: Duration) {
        self.run(a, b, limit, |_, _| false);
    }
}
